"""Calling compiled entry points from Python: argument checks, status codes, `tlc.load`.

A compiled graph is an address of `i32 f(const T* in, T* out[, const T* params])`. `EntryPoint`
wraps one with its interface (input/output shape, dtype) and checks every call: the input is
read by the API's one casting rule (lists, arrays of any real dtype, torch tensors, rounded to
the compiled dtype: `tlc.core.arrays`) and must have the input shape (a flat array of the right
size is accepted too); `out=` must already be of the compiled dtype and shape, since the code
writes it in place; a non-zero status becomes the exception the reference interpreter would
raise. `load(path)` opens a library written by `tlc-compile` and reads every graph's interface
from the library itself (the JSON text of its `tlc_library` symbol): no header is needed.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from math import prod
from typing import Any

import numpy as np

from tlc.codegen.builder import Status
from tlc.core.arrays import as_float_array
from tlc.core.diagnostics import DiagnosticError, did_you_mean
from tlc.core.limits import LimitError, check_elements, max_elements
from tlc.dialect.shapes import Shape, fmt_shape, numel
from tlc.semantics.reference import LOG_MESSAGE, EvalError

STATUS_MESSAGES = {
    Status.NULL_POINTER: "null pointer passed to a compiled entry point",
    Status.LOG_DOMAIN: LOG_MESSAGE,
    Status.OUT_OF_MEMORY: "compiled entry point could not allocate its workspace",
    Status.UNSUPPORTED_CPU: "the library was built for CPU features this machine lacks",
}


def raise_for_status(status: int, symbol: str) -> None:
    if status == Status.OK:
        return
    if status == Status.LOG_DOMAIN:
        raise EvalError.simple(LOG_MESSAGE)
    message = STATUS_MESSAGES.get(Status(status)) if status in iter(Status) else None
    raise DiagnosticError.simple(f"{symbol}: {message or f'unknown status {status}'}")


@dataclass
class EntryPoint:
    """A compiled graph callable on numpy arrays."""

    symbol: str
    address: int
    input_shape: Shape
    output_shape: Shape
    dtype: np.dtype
    params_size: int | None = None
    #: Keeps the code alive (JIT resource tracker or ctypes library).
    owner: object = None
    #: Called on a log-domain failure to raise the precise, located reference error.
    explain: Callable[[np.ndarray], None] | None = None
    #: The params array every call passes, for a build that takes its payload at run time
    #: but whose caller gave it at compile time (a JIT build over the bake limit).
    bound: np.ndarray | None = None
    #: The thread count passed on every call, for an entry that takes one (the JIT's); a
    #: library's public entry points use the library's setting (`tlc_set_num_threads`).
    threads: int | None = None
    _func: Callable = field(init=False, repr=False)
    #: The output's weight against the element budget (`tlc.core.limits.check_elements`).
    _output_weight: int = field(init=False, repr=False)
    #: The thread count as the last argument (empty for a library's entry point).
    _count_arg: tuple[int, ...] = field(init=False, repr=False)
    #: The arguments after (in, out) that are the same on every call (bound params' address,
    #: thread count), or None when the params come with each call.
    _fixed_tail: tuple[int, ...] | None = field(init=False, repr=False)

    def __post_init__(self) -> None:
        n_args = 2 if self.params_size is None and self.bound is None else 3
        counts = [ctypes.c_int32] if self.threads is not None else []
        proto = ctypes.CFUNCTYPE(ctypes.c_int32, *([ctypes.c_void_p] * n_args), *counts)
        self._func = proto(self.address)
        self._output_weight = prod(max(d, 1) for d in self.output_shape)
        self._count_arg = () if self.threads is None else (self.threads,)
        if self.bound is not None:
            self._fixed_tail = (_address(self.bound), *self._count_arg)
        else:
            self._fixed_tail = None if self.params_size is not None else self._count_arg

    def __repr__(self) -> str:
        payload = "" if self.params_size is None else f", params [{self.params_size}]"
        return (
            f"<compiled @{self.symbol.removeprefix('tlc_')}: {fmt_shape(self.input_shape)} -> "
            f"{fmt_shape(self.output_shape)}, {self.dtype}{payload}>"
        )

    def check(self, array: object, shape: Shape, what: str) -> np.ndarray:
        """`array` (an input or params) read by the API's one rule (cast to the compiled
        dtype, see `tlc.core.arrays`), with its shape checked."""
        array = as_float_array(array, self.dtype)
        return self._checked_shape(array, shape, what)

    def _checked_shape(self, array: np.ndarray, shape: Shape, what: str) -> np.ndarray:
        if array.shape != shape and not (array.ndim == 1 and array.size == numel(shape)):
            raise ValueError(
                f"{self.symbol}: {what} has shape {fmt_shape(array.shape)}, "
                f"expected {fmt_shape(shape)}"
            )
        return array if array.flags.c_contiguous else np.ascontiguousarray(array)

    def check_out(self, out: object) -> None:
        """The compiled code writes `out` through a raw pointer, so anything it cannot safely
        write is refused here: not an array (bytes, lists), read-only (a buffer over `bytes`,
        a read-only memmap), strided, or of the wrong dtype or size."""
        if not isinstance(out, np.ndarray):
            raise TypeError(f"{self.symbol}: out must be a numpy array, not {type(out).__name__}")
        if not out.flags.writeable:
            raise ValueError(f"{self.symbol}: out is read-only")
        if not out.flags.c_contiguous:
            raise ValueError(f"{self.symbol}: out must be a C-contiguous array")
        if out.dtype != self.dtype:
            raise TypeError(f"{self.symbol}: out has dtype {out.dtype}, expected {self.dtype}")
        self._checked_shape(out, self.output_shape, "out")

    def __call__(
        self, x: object, params: object = None, out: np.ndarray | None = None
    ) -> np.ndarray:
        """Run on `x`; `params` (runtime-payload builds) is the flat parameter array; `out`, if
        given, is filled in place (C-contiguous, output shape and dtype)."""
        # This path is the whole cost of a call to a small graph (a 784-1024-1024-10 MLP's
        # batch-1 call is 50 us), so what is fixed per entry point is computed once.
        x = self.check(x, self.input_shape, "input")
        if out is None:  # the element budget, before allocating (a --batch build may be huge)
            try:
                if self._output_weight > max_elements():
                    check_elements(self.output_shape, f"{self.symbol}: output")
            except LimitError as exc:
                raise DiagnosticError.simple(str(exc)) from None
            out = np.empty(self.output_shape, dtype=self.dtype)
        else:
            self.check_out(out)
        tail = self._fixed_tail
        if tail is None:
            if params is None:
                raise ValueError(f"{self.symbol}: this build takes its parameters at call time")
            flat = self.check(params, (self.params_size,), "params")
            tail = (_address(flat), *self._count_arg)
        elif params is not None:
            raise ValueError(f"{self.symbol}: parameters are compiled in; params must be None")
        status = self._func(_address(x), _address(out), *tail)
        if status:
            if status == Status.LOG_DOMAIN and self.explain is not None:
                self.explain(x)
            raise_for_status(status, self.symbol)
        return out


def _address(array: np.ndarray) -> int:
    """The data address of a C-contiguous array; `ctypes.c_char.from_buffer` is several times
    faster than `array.ctypes.data` (which matters for a 1 us call) but needs a writable
    buffer."""
    if array.flags.writeable and array.size:
        return ctypes.addressof(ctypes.c_char.from_buffer(array))
    return array.ctypes.data


#: The data symbol every library defines: a NUL-terminated JSON text describing its entry
#: points (`tlc.load` reads it, so a library needs no header beside it).
METADATA_SYMBOL = "tlc_library"
#: The layout of that text; `tlc.load` refuses a library of another format.
METADATA_FORMAT = 2


class Library:
    """A shared library from `tlc-compile`: one `EntryPoint` per graph, by graph name, read
    from the library's own metadata (`METADATA_SYMBOL`)."""

    def __init__(self, path: str, threads: int | None = None):
        self.path = os.path.abspath(path)
        other = _foreign_machine(self.path)
        if other is not None:
            raise DiagnosticError.simple(f"cannot load '{path}': {other}")
        try:
            copy, directory = _private_copy(self.path)
            try:
                self.lib = ctypes.CDLL(copy)
            except OSError as exc:  # the loader's text names the copy: name the library
                raise OSError(str(exc).replace(copy, self.path)) from None
            finally:
                shutil.rmtree(directory, ignore_errors=True)  # the mapping outlives the file
        except OSError as exc:
            raise DiagnosticError.simple(f"cannot load '{path}': {exc}") from None
        self.graphs: dict[str, EntryPoint] = {}
        for entry in self._metadata(path)["graphs"]:
            graph, described = _described(entry, path)
            self.graphs[graph] = self._entry(*described)
        if not self.graphs:
            raise _malformed(path, "it describes no graph")
        if threads is not None:
            self.set_num_threads(threads)

    def set_num_threads(self, threads: int) -> None:
        """Run this library's entry points on `threads` threads (its `tlc_set_num_threads`;
        each `tlc.load` maps its own copy of the library, with its own pool and setting)."""
        if threads < 1:
            raise ValueError(f"threads must be at least 1, got {threads}")
        setter = getattr(self.lib, "tlc_set_num_threads", None)
        if setter is None:
            raise DiagnosticError.simple(
                f"'{self.path}' has no thread pool (built by an older tlc-compile): rebuild it"
            )
        setter(threads)

    @property
    def num_threads(self) -> int | None:
        """The thread count the library's entry points use (None: a library without a pool)."""
        getter = getattr(self.lib, "tlc_get_num_threads", None)
        return None if getter is None else int(getter())

    def _metadata(self, path: str) -> dict:
        try:
            text = ctypes.string_at(
                ctypes.addressof(ctypes.c_char.in_dll(self.lib, METADATA_SYMBOL))
            )
            metadata = json.loads(text)
        except ValueError:  # no such symbol (ctypes says ValueError), or not JSON
            metadata = None
        if (
            not isinstance(metadata, dict)
            or metadata.get("format") != METADATA_FORMAT
            or not isinstance(metadata.get("graphs"), list)
        ):
            raise DiagnosticError.simple(
                f"cannot load '{path}': it holds no tlc metadata of format {METADATA_FORMAT} "
                f"(the {METADATA_SYMBOL} symbol); rebuild it with this tlc's tlc-compile"
            )
        return metadata

    def _entry(
        self, symbol: str, dtype: np.dtype, input_shape: Shape, output_shape: Shape,
        params_size: int | None,
    ) -> EntryPoint:  # fmt: skip
        """The entry point `symbol` as the metadata describes it, once the code's own queries
        have confirmed the description: the code reads and writes buffers of the sizes the
        wrapper checks, so a description that is not the code's (an edited or corrupted
        `tlc_library` text) would let a call read or write past them."""
        self._check_cpu(symbol)
        for what, shape in (("input", input_shape), ("output", output_shape)):
            found = self._query_shape(f"{symbol}_{what}", len(shape))
            if found != fmt_shape(shape):
                raise self._mismatch(
                    f"{symbol}: {what} shape {fmt_shape(shape)} in the metadata, {found} in "
                    "the code"
                )
        scalar = self._function(f"{symbol}_scalar_size")()
        if scalar != dtype.itemsize:
            raise self._mismatch(
                f"{symbol}: dtype {dtype} in the metadata, {scalar}-byte scalars in the code"
            )
        sized = self._function(f"{symbol}_params_size", ctypes.c_int64, required=False)
        found_size = None if sized is None else int(sized())
        if found_size != params_size:
            raise self._mismatch(
                f"{symbol}: params size {params_size} in the metadata, {found_size} in the code"
            )
        return EntryPoint(
            symbol,
            ctypes.cast(self._function(symbol), ctypes.c_void_p).value,
            input_shape,
            output_shape,
            dtype,
            params_size,
            owner=self.lib,
        )

    def _function(self, name: str, restype: type = ctypes.c_int32, required: bool = True) -> Any:
        """The library's function `name` (by the dynamic loader's lookup, never a Python
        attribute of the CDLL object), None if it is missing and not `required`."""
        try:
            function = self.lib[name]
        except AttributeError:
            if not required:
                return None
            raise self._mismatch(f"it has no function {name}") from None
        function.restype = restype
        function.argtypes = []
        return function

    def _query_shape(self, prefix: str, rank: int) -> str:
        """The shape `<prefix>_rank/_shape` report, as text; its extents are read only when
        the rank is `rank` (the metadata's: a forged rank must not size the buffer)."""
        found = self._function(f"{prefix}_rank")()
        if found != rank:
            return f"rank {found}"
        dims = (ctypes.c_int64 * max(rank, 1))()
        query = self._function(f"{prefix}_shape")
        query.argtypes = [ctypes.c_void_p]
        if query(ctypes.addressof(dims)) != Status.OK:
            return "no shape"
        return fmt_shape(tuple(int(d) for d in dims[:rank]))

    def _mismatch(self, detail: str) -> DiagnosticError:
        return DiagnosticError.simple(
            f"cannot load '{self.path}': its {METADATA_SYMBOL} metadata does not describe its "
            f"code ({detail}); rebuild it with this tlc's tlc-compile"
        )

    def _check_cpu(self, symbol: str) -> None:
        """Refuse a library built for CPU features this machine lacks (its entry would only
        return TLC_ERR_UNSUPPORTED_CPU)."""
        missing = ctypes.c_char_p()
        check = self._function(f"{symbol}_cpu_check")
        check.argtypes = [ctypes.c_void_p]
        if check(ctypes.byref(missing)) != Status.OK:
            lacks = (missing.value or b"?").decode()
            raise DiagnosticError.simple(
                f"cannot load '{self.path}': {symbol} was built for CPU features this machine "
                f"lacks ({lacks}); rebuild without --target-cpu/--target-features for a "
                "library that runs on any x86-64 CPU"
            )

    def __repr__(self) -> str:
        entries = "".join(f"\n  {entry!r}" for entry in self.graphs.values())
        return f"<tlc.Library {self.path}:{entries}>"

    def __getitem__(self, graph: str) -> EntryPoint:
        if graph not in self.graphs:
            listed = ", ".join(sorted(self.graphs))
            hint = did_you_mean(graph, self.graphs)
            raise KeyError(f"{self.path} has no graph '{graph}' (graphs: {listed}){hint}")
        return self.graphs[graph]

    def __call__(
        self, x: object, params: object = None, out: np.ndarray | None = None
    ) -> np.ndarray:
        """Call the library's only graph (use `lib["name"]` when it has several), as
        `EntryPoint.__call__`."""
        if len(self.graphs) != 1:
            raise TypeError(
                f"{self.path} has graphs {sorted(self.graphs)}; pick one with lib[name]"
            )
        return next(iter(self.graphs.values()))(x, params, out)


#: Extents a described shape may have (compiled code addresses at most 2^62 bytes).
_MAX_EXTENT = 2**62


def _described(entry: object, path: str) -> tuple[str, tuple[Any, ...]]:
    """A graph's description in the metadata, as (graph, (symbol, dtype, input shape, output
    shape, params size)), each of the type the format gives it; anything else is refused."""

    def refuse(what: str) -> DiagnosticError:
        return _malformed(path, what)

    def shape(key: str) -> Shape:
        value = entry.get(key)
        if not isinstance(value, list) or not all(
            type(d) is int and 0 <= d <= _MAX_EXTENT for d in value
        ):
            raise refuse(f"{key} is not a list of extents")
        return tuple(value)

    if not isinstance(entry, dict):
        raise refuse("a graph is not described by an object")
    graph, symbol, dtype = entry.get("graph"), entry.get("symbol"), entry.get("dtype")
    if not isinstance(graph, str) or not isinstance(symbol, str) or not symbol.isidentifier():
        raise refuse("a graph's name or symbol is not a name")
    if dtype not in ("float32", "float64"):
        raise refuse(f"{symbol}: dtype {dtype!r} is not float32 or float64")
    size = entry.get("params_size")
    if size is not None and not (type(size) is int and 0 <= size <= _MAX_EXTENT):
        raise refuse(f"{symbol}: params_size {size!r} is not a size")
    return graph, (symbol, np.dtype(dtype), shape("input_shape"), shape("output_shape"), size)


def _malformed(path: str, what: str) -> DiagnosticError:
    return DiagnosticError.simple(
        f"cannot load '{path}': its {METADATA_SYMBOL} metadata is malformed ({what}); "
        "rebuild it with this tlc's tlc-compile"
    )


#: ELF e_machine values of the architectures tlc builds for or might meet, by name.
ELF_MACHINES = {3: "i386", 40: "arm", 62: "x86_64", 183: "aarch64", 243: "riscv64"}


def _elf_machine(path: str) -> int | None:
    """The e_machine field of the ELF file at `path`, or None for anything else."""
    try:
        with open(path, "rb") as f:
            head = f.read(20)
    except OSError:
        return None
    if len(head) < 20 or head[:4] != b"\x7fELF":
        return None
    return int.from_bytes(head[18:20], "little" if head[5] == 1 else "big")


@cache
def _host_machine() -> int | None:
    """This Python's ELF machine, read once."""
    return _elf_machine(sys.executable)


def _foreign_machine(path: str) -> str | None:
    """Why the ELF file at `path` cannot load here when it is built for another architecture
    than this Python (a library cross-compiled with --target-triple), else None: the dynamic
    loader's own answer is "cannot open shared object file: No such file or directory"."""
    found, here = _elf_machine(path), _host_machine()
    if found is None or here is None or found == here:
        return None
    name, host = (ELF_MACHINES.get(m, f"ELF machine {m}") for m in (found, here))
    return f"it is a library for {name}, and this machine is {host}"


def _private_copy(path: str) -> tuple[str, str]:
    """A copy of the library in a new private directory (mkdtemp: mode 0700, a name nobody
    could predict), as (copy, directory).

    The copy gives every load a path the dynamic loader has not seen, so a library rebuilt at
    the same path is not answered with the stale one already loaded; the private directory
    means the file loaded is the one just written, never a library someone planted in the
    shared temp directory under a predictable name.
    """
    directory = tempfile.mkdtemp(prefix="tlc-load-")
    copy = os.path.join(directory, os.path.basename(path))
    try:
        shutil.copyfile(path, copy)
    except OSError:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return copy, directory


def load(path: str, threads: int | None = None) -> Library:
    """Open a library built by tlc-compile as a Python callable (see `Library`), running on
    `threads` threads (default: the library's own default, every CPU the process may use)."""
    return Library(path, threads)
