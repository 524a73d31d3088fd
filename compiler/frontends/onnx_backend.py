"""tlc as an ONNX backend (`onnx.backend.base.Backend`), and ONNX's node conformance tests run
through it: specialise the test's model on the values it feeds to inputs tl takes as parameters
or metadata (`PARAMETER_INPUTS`: weights, statistics, shapes, axes become initializers, as in
real models), import it (one tl graph per output), evaluate the graphs by the reference
denotation and compare every output with the ones ONNX ships, at the test's own tolerances.

The node tests come from the onnx package (`onnx.backend.test.case.node.collect_testcases`,
the generator of the `onnx/backend/test/data/node/*` files, which some wheels leave out); a test
belongs to an op of `OPS` (the op types `tlc.frontends.import_onnx.RULES` imports, but `NOT_RUN`)
when its model is a single node of that op, and its function-expanded variants (`..._expanded`)
count for the same op. `python -m tlc.frontends.onnx_backend` prints the report
docs/onnx-conformance.md shows; tests/test_onnx_conformance.py keeps the passing tests in CI.
"""

from __future__ import annotations

import re
import sys
from collections import defaultdict
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.backend.base import Backend, BackendRep

from tlc.core.diagnostics import DiagnosticError
from tlc.core.progress import Progress
from tlc.frontends.import_onnx import RULES, from_onnx
from tlc.semantics.interpret import interpret
from tlc.semantics.program import Traced

#: Op types tlc imports whose conformance tests are not run, and why.
NOT_RUN: dict[str, str] = {
    op: "its node tests convert between element types tl has no values of (bfloat16, float8, "
    "int4, strings) or round to float16 or integers, which no tl op does; tl computes on reals "
    "and imports a cast between them as no node"
    for op in ("Cast", "CastLike")
}

#: The ONNX ops tlc imports (every op type of the import table, explicit or derived from an
#: op kind's spelling) but those of `NOT_RUN`: their conformance tests are run.
OPS = tuple(sorted(set(RULES) - set(NOT_RUN)))


#: Inputs that tl takes as parameters or metadata (a payload record, a shape, axes), by ONNX
#: op type. ONNX's node tests feed them as graph inputs; real models hold them as initializers.
PARAMETER_INPUTS: dict[str, tuple[int, ...]] = {
    "Conv": (1, 2),
    "BatchNormalization": (1, 2, 3, 4),
    "LayerNormalization": (1, 2),
    "Reshape": (1,),
    "Expand": (1,),
    "ReduceSum": (1,),
    "ReduceMean": (1,),
    "Clip": (1, 2),
    "Gather": (1,),
    "Slice": (1, 2, 3, 4),
    "Split": (1,),
    "Squeeze": (1,),
    "Unsqueeze": (1,),
    "Tile": (1,),
    "Resize": (1, 2, 3),
    "Pow": (1,),
    "ConvTranspose": (1, 2),
    "InstanceNormalization": (1, 2),
    "GroupNormalization": (1, 2),
    "Pad": (1, 2, 3),
    "ReduceMax": (1,),
    "ReduceMin": (1,),
    "ReduceL2": (1,),
    "GatherND": (1,),
}


def parameter_inputs(model: onnx.ModelProto) -> frozenset[str]:
    """The graph inputs every node reading them reads as a parameter (see `PARAMETER_INPUTS`)."""
    slots: dict[str, set[bool]] = defaultdict(set)
    for node in model.graph.node:
        for i, name in enumerate(node.input):
            slots[name].add(i in PARAMETER_INPUTS.get(node.op_type, ()))
    return frozenset(i.name for i in model.graph.input if slots.get(i.name) == {True})


class TlcRep(BackendRep):
    """A model, specialised at `run` on the values given for its parameter inputs (they become
    initializers) and imported (one tl graph per output); run by the reference denotation in
    float64 on the remaining (data) inputs."""

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        self.parameters = parameter_inputs(model)

    def specialise(self, inputs: Any) -> tuple[list[Traced], list[np.ndarray]]:
        """The tl graphs, one per model output, and the data inputs to run them on."""
        names = [i.name for i in self.model.graph.input]
        given = dict(zip(names, inputs, strict=True))
        model = onnx.ModelProto()
        model.CopyFrom(self.model)
        model.graph.initializer.extend(
            numpy_helper.from_array(np.asarray(given[name]), name)
            for name in sorted(self.parameters)
        )
        traced = from_onnx(model)
        data = [np.asarray(given[n], dtype=np.float64) for n in names if n not in self.parameters]
        return traced.per_output or [traced], data

    def evaluate(self, graphs: list[Traced], data: list[np.ndarray]) -> tuple[np.ndarray, ...]:
        """Each graph's value in float64, converted to its output's element type where every
        integer and float16 value is a number of its type (`Traced.check_values`: else a
        diagnostic, never a wrapped-around or rounded value)."""
        results = []
        for traced, output in zip(graphs, self.model.graph.output, strict=True):
            table = interpret(traced.graph, traced.payload, data)
            traced.check_values(table.values)
            dtype = onnx.helper.tensor_dtype_to_np_dtype(output.type.tensor_type.elem_type)
            results.append(np.asarray(table.output).astype(dtype))
        return tuple(results)

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        return self.evaluate(*self.specialise(inputs))


class TlcBackend(Backend):
    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> TlcRep:
        return TlcRep(model)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device == "CPU"


@dataclass(frozen=True)
class Outcome:
    name: str
    op: str
    status: str  # "pass", "fail" (wrong values or a crash) or "unsupported"
    reason: str = ""


@cache
def node_cases() -> dict[str, Any]:
    """ONNX's node test cases for the ops of `OPS`, by name, with the op they belong to."""
    from onnx.backend.test.case import node

    cases = {c.name: c for c in node.collect_testcases(None) if c.kind == "node"}
    ops = {name: c.model.graph.node[0].op_type for name, c in cases.items()
           if len(c.model.graph.node) == 1}  # fmt: skip
    chosen = {}
    for name, case in sorted(cases.items()):
        op = ops.get(re.sub(r"_expanded(_ver\d+)?$", "", name))
        if op in OPS:
            chosen[name] = (op, case)
    return chosen


def run_case(name: str) -> Outcome:
    op, case = node_cases()[name]
    rep = TlcBackend.prepare(case.model)
    failures = []
    for inputs, expected in case.data_sets:
        try:
            graphs, data = rep.specialise(inputs)
        except DiagnosticError as exc:
            return Outcome(name, op, "unsupported", _short(str(exc)))
        try:
            got = rep.evaluate(graphs, data)
        except DiagnosticError as exc:
            return Outcome(name, op, "fail", _short(str(exc)))
        for i, (ours, theirs) in enumerate(zip(got, expected, strict=True)):
            try:
                np.testing.assert_allclose(ours, theirs, rtol=case.rtol, atol=case.atol)
            except AssertionError as exc:
                failures.append(f"output {i}: " + str(exc).strip().splitlines()[0])
    if failures:
        return Outcome(name, op, "fail", "values differ: " + failures[0])
    return Outcome(name, op, "pass")


def _short(message: str) -> str:
    """The refusal on one line (an unsupported-nodes report lists one gap per line)."""
    head, *gaps = message.removeprefix("ONNX import: ").splitlines()
    return " ".join([head, "; ".join(gap.strip() for gap in gaps)]) if gaps else head


def run_all() -> list[Outcome]:
    """Every case, with a progress bar on a terminal (stdout stays the report)."""
    outcomes = []
    with Progress(len(node_cases()), "conformance", summary=False) as bar:
        for name in node_cases():
            outcomes.append(run_case(name))
            bar.advance(f"{name}: {outcomes[-1].status}")
    return outcomes


def report(outcomes: list[Outcome]) -> str:
    """The markdown table and lists of docs/onnx-conformance.md."""
    by_op: dict[str, list[Outcome]] = defaultdict(list)
    for o in outcomes:
        by_op[o.op].append(o)
    lines = ["| op | tests | pass | unsupported | fail |", "|---|---:|---:|---:|---:|"]
    for op in sorted(by_op):
        count = {s: sum(o.status == s for o in by_op[op]) for s in ("pass", "unsupported", "fail")}
        lines.append(
            f"| {op} | {len(by_op[op])} | {count['pass']} | {count['unsupported']} | "
            f"{count['fail']} |"
        )
    total = {s: sum(o.status == s for o in outcomes) for s in ("pass", "unsupported", "fail")}
    lines.append(
        f"| **all** | {len(outcomes)} | {total['pass']} | {total['unsupported']} | "
        f"{total['fail']} |"
    )
    lines += ["", "Tests that do not pass, with the reason:", ""]
    lines += [f"- `{o.name}` ({o.status}): {o.reason}" for o in outcomes if o.status != "pass"]
    return "\n".join(lines) + "\n"


def main() -> int:
    sys.stdout.write(report(run_all()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
