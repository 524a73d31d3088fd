"""Payloads: a graph's parameters, kept apart from it and keyed by node id.

A `Payload` maps a node id to a record, a dict of named float64 arrays (`weight`, `bias`,
`value`, `gamma`, `beta`, `mean`, `var`, `eps`, ...). It is read from `.npz` files with keys
`"<id>.<field>"` (`"1.weight"`) or from the inline `tl.payload @graph { ... }` section. Checking a
payload against its graph (shapes, missing records) happens where it is used, with the seed's
messages (`IR eval: missing linear payload for node 1`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np

from tlc.core.diagnostics import DiagnosticError
from tlc.core.npyio import read_npz

Record = dict[str, np.ndarray]


class SourceArray(np.ndarray):
    """A parameter as the source model holds it, carrying its name there (`fc1.weight`, an
    ONNX initializer's). Importers pass such arrays to the graph builder, which binds the
    payload field to the name (a `tl.params` entry); an array computed from one (a transpose,
    a reshape, a cast) is a new value with no name."""

    source_name: str | None = None


def named(values: np.ndarray, name: str) -> np.ndarray:
    """`values` (not copied) marked as the source parameter `name`."""
    view = np.asarray(values).view(SourceArray)
    view.source_name = name
    return view


def source_name(value: object) -> str | None:
    """The source parameter `value` is exactly, if it is one (see `SourceArray`)."""
    return value.source_name if isinstance(value, SourceArray) else None


@dataclass
class Payload(Mapping[int, Record]):
    """Records by node id; `kinds` remembers the op kind a record was written for, if known."""

    records: dict[int, Record] = field(default_factory=dict)
    kinds: dict[int, str] = field(default_factory=dict)

    def __getitem__(self, node_id: int) -> Record:
        return self.records[node_id]

    def __iter__(self) -> Iterator[int]:
        return iter(self.records)

    def __len__(self) -> int:
        return len(self.records)

    def flat(self) -> dict[str, np.ndarray]:
        """`{"1.weight": array, ...}`, the .npz layout."""
        records = self.records.items()
        return {f"{nid}.{name}": arr for nid, rec in records for name, arr in rec.items()}

    @staticmethod
    def from_flat(flat: Mapping[str, np.ndarray], source: str = "payload") -> Payload:
        payload = Payload()
        for key, value in flat.items():
            node, dot, name = key.partition(".")
            if not dot or not node.isdigit() or not name:
                raise DiagnosticError.simple(
                    f"{source}: key '{key}' is not of the form '<node id>.<field>'"
                )
            array = np.asarray(value, dtype=np.float64)
            payload.records.setdefault(int(node), {})[name] = array
        return payload


def load_npz(path: str) -> Payload:
    """The payload in the .npz file `path`; a file that is missing or not an .npz archive is a
    diagnostic naming the file and the reason (`No such file or directory`, not `[Errno 2] ...`)."""
    return Payload.from_flat(read_npz(path, "payload"), path)


def save_npz(payload: Payload, path: str) -> None:
    """Write `payload` to exactly `path` (np.savez on a name would add `.npz`, turning `DIR/`
    into `DIR/.npz`); an unwritable path is a diagnostic naming it."""
    try:
        with open(path, "wb") as f:
            np.savez(f, **payload.flat())
    except OSError as exc:
        raise DiagnosticError.simple(
            f"cannot write payload '{path}': {exc.strerror or exc}"
        ) from None
