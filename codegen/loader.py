"""Calling compiled entry points from Python: argument checks, status codes, `tlc.load`.

A compiled graph is an address of `i32 f(const T* in, T* out[, const T* params])`. `EntryPoint`
wraps one with its interface (input/output shape, dtype) and checks every call: the input must
have the input shape (a flat array of the right size is accepted too), the dtype must be the
compiled one (no silent conversion: a float64 array passed to a float32 library is an error),
and a non-zero status becomes the exception the reference interpreter would raise. `load(path)`
opens a library written by `tlc-compile`, reads each graph's interface from the library itself
(`tlc_<g>_input_shape` ...) and the dtype from the header written beside it.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from tlc.codegen.builder import Status
from tlc.core.diagnostics import DiagnosticError, did_you_mean
from tlc.core.limits import LimitError, check_elements
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

    def __post_init__(self) -> None:
        n_args = 2 if self.params_size is None else 3
        counts = [ctypes.c_int32] if self.threads is not None else []
        proto = ctypes.CFUNCTYPE(ctypes.c_int32, *([ctypes.c_void_p] * n_args), *counts)
        self._func = proto(self.address)

    def check(self, array: object, shape: Shape, what: str) -> np.ndarray:
        if not isinstance(array, np.ndarray):
            array = np.asarray(array, dtype=self.dtype)
        if array.dtype != self.dtype:
            raise TypeError(f"{self.symbol}: {what} has dtype {array.dtype}, expected {self.dtype}")
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
        self.check(out, self.output_shape, "out")

    def __call__(
        self, x: object, params: object = None, out: np.ndarray | None = None
    ) -> np.ndarray:
        """Run on `x`; `params` (runtime-payload builds) is the flat parameter array; `out`, if
        given, is filled in place (C-contiguous, output shape and dtype)."""
        x = self.check(x, self.input_shape, "input")
        if out is None:  # the element budget, before allocating (a --batch build may be huge)
            try:
                check_elements(self.output_shape, f"{self.symbol}: output")
            except LimitError as exc:
                raise DiagnosticError.simple(str(exc)) from None
            out = np.empty(self.output_shape, dtype=self.dtype)
        else:
            self.check_out(out)
        args = [_address(x), _address(out)]
        if self.bound is not None:
            if params is not None:
                raise ValueError(f"{self.symbol}: parameters are compiled in; params must be None")
            args.append(_address(self.bound))
        elif self.params_size is not None:
            if params is None:
                raise ValueError(f"{self.symbol}: this build takes its parameters at call time")
            flat = self.check(params, (self.params_size,), "params")
            args.append(_address(flat))
        elif params is not None:
            raise ValueError(f"{self.symbol}: parameters are compiled in; params must be None")
        if self.threads is not None:
            args.append(self.threads)
        status = self._func(*args)
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


class Library:
    """A shared library from `tlc-compile`: one `EntryPoint` per graph, by graph name."""

    def __init__(self, path: str, threads: int | None = None):
        self.path = os.path.abspath(path)
        header = os.path.splitext(self.path)[0] + ".h"
        try:
            with open(header, encoding="utf-8") as f:
                text = f.read()
            copy, directory = _private_copy(self.path)
            try:
                self.lib = ctypes.CDLL(copy)
            finally:
                shutil.rmtree(directory, ignore_errors=True)  # the mapping outlives the file
        except (OSError, UnicodeDecodeError) as exc:
            raise DiagnosticError.simple(f"cannot load '{path}': {exc}") from None
        self.graphs: dict[str, EntryPoint] = {}
        for graph, ctype, runtime in _entries(text):
            self.graphs[graph] = self._entry(graph, np.dtype(ctype), runtime)
        if not self.graphs:
            raise DiagnosticError.simple(f"'{header}' declares no tlc entry points")
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

    def _entry(self, graph: str, dtype: np.dtype, runtime: bool) -> EntryPoint:
        symbol = f"tlc_{graph}"
        self._check_cpu(symbol)
        return EntryPoint(
            symbol,
            ctypes.cast(getattr(self.lib, symbol), ctypes.c_void_p).value,
            self._shape(f"{symbol}_input"),
            self._shape(f"{symbol}_output"),
            dtype,
            self._params_size(symbol) if runtime else None,
            owner=self.lib,
        )

    def _check_cpu(self, symbol: str) -> None:
        """Refuse a library built for CPU features this machine lacks (its entry would only
        return TLC_ERR_UNSUPPORTED_CPU); libraries older than the check have no such query."""
        check = getattr(self.lib, f"{symbol}_cpu_check", None)
        if check is None:
            return
        missing = ctypes.c_char_p()
        if check(ctypes.byref(missing)) != Status.OK:
            lacks = (missing.value or b"?").decode()
            raise DiagnosticError.simple(
                f"cannot load '{self.path}': {symbol} was built for CPU features this machine "
                f"lacks ({lacks}); rebuild without --target-cpu/--target-features for a "
                "library that runs on any x86-64 CPU"
            )

    def _shape(self, prefix: str) -> Shape:
        rank = getattr(self.lib, f"{prefix}_rank")()
        dims = (ctypes.c_int64 * max(rank, 1))()
        getattr(self.lib, f"{prefix}_shape")(dims)
        return tuple(int(d) for d in dims[:rank])

    def _params_size(self, symbol: str) -> int:
        func = getattr(self.lib, f"{symbol}_params_size")
        func.restype = ctypes.c_int64
        return int(func())

    def __getitem__(self, graph: str) -> EntryPoint:
        if graph not in self.graphs:
            listed = ", ".join(sorted(self.graphs))
            hint = did_you_mean(graph, self.graphs)
            raise KeyError(f"{self.path} has no graph '{graph}' (graphs: {listed}){hint}")
        return self.graphs[graph]

    def __call__(self, x: object, params: object = None) -> np.ndarray:
        """Call the library's only graph (use `lib["name"]` when it has several)."""
        if len(self.graphs) != 1:
            raise TypeError(
                f"{self.path} has graphs {sorted(self.graphs)}; pick one with lib[name]"
            )
        return next(iter(self.graphs.values()))(x, params)


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


def _entries(header: str) -> list[tuple[str, str, bool]]:
    """(graph, C scalar type, takes params) for each entry point the header declares."""
    pattern = re.compile(
        r"^int tlc_(\w+)\(const (float|double) \*in, (?:float|double) \*out"
        r"(, const (?:float|double) \*params)?\);",
        re.M,
    )
    return [
        (m.group(1), "float32" if m.group(2) == "float" else "float64", m.group(3) is not None)
        for m in pattern.finditer(header)
    ]


def load(path: str, threads: int | None = None) -> Library:
    """Open a library built by tlc-compile as a Python callable (see `Library`), running on
    `threads` threads (default: the library's own default, every CPU the process may use)."""
    return Library(path, threads)
