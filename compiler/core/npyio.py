""".npy and .npz files read as untrusted input: every malformed file is a diagnostic.

`np.load` trusts the file: an .npy header may declare 8 TiB in a 100-byte file, an .npz member
may inflate 1 MB into 3 GiB before anything checks its shape, a 0-byte file raises EOFError,
an .npy given where an archive is expected is silently accepted, and complex or datetime arrays
turn into numbers. Here each array's header is read first (numpy.lib.format), its dtype must be
real numbers (bool, integer or floating point), its element count must be within the element
budget (`tlc.core.limits`), and the data must be exactly the size the header declares; only
then are the bytes read, never more than declared.
"""

from __future__ import annotations

import zipfile
import zlib
from typing import IO

import numpy as np
from numpy.lib import format as npy_format

from tlc.core.diagnostics import DiagnosticError
from tlc.core.limits import LimitError, check_elements

NPY_MAGIC = b"\x93NUMPY"
ZIP_MAGIC = b"PK"


class _Bad(Exception):
    """The reason a file is unreadable; callers add the file and what it was for."""


def read_npy(path: str, what: str) -> np.ndarray:
    """The array in the .npy file `path`; `what` ("input") names it in diagnostics."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(NPY_MAGIC))
            if head.startswith(ZIP_MAGIC):
                raise _Bad("a zip archive (.npz), expected a single .npy array")
            f.seek(0)
            return _read_array(f, None)
    except OSError as exc:
        reason = exc.strerror or str(exc)
    except _Bad as exc:
        reason = str(exc)
    raise DiagnosticError.simple(f"cannot read {what} '{path}': {reason}")


def read_npz(path: str, what: str) -> dict[str, np.ndarray]:
    """The arrays of the .npz archive `path` by name (member name without `.npy`)."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(NPY_MAGIC))
        if head == NPY_MAGIC:
            raise _Bad("an .npy array, expected an .npz archive")
        if not head:
            raise _Bad("the file is empty")
        with zipfile.ZipFile(path) as archive:
            arrays = {}
            for info in archive.infolist():
                if not info.filename:
                    raise _Bad("a member has an empty name")
                if info.filename.endswith("/"):  # a directory entry
                    continue
                name = info.filename.removesuffix(".npy")
                try:
                    with archive.open(info) as member:
                        arrays[name] = _read_array(member, info.file_size)
                except (_Bad, zipfile.BadZipFile, zlib.error, EOFError) as exc:
                    raise _Bad(f"member '{info.filename}': {_reason(exc)}") from None
            return arrays
    except OSError as exc:
        reason = exc.strerror or str(exc)
    except (_Bad, zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError) as exc:
        reason = _reason(exc)
    raise DiagnosticError.simple(f"cannot read {what} '{path}': {reason}")


def _reason(exc: Exception) -> str:
    if isinstance(exc, zlib.error):
        return f"corrupt compressed data ({exc})"
    if isinstance(exc, EOFError):
        return "the data ends early"
    return str(exc) or type(exc).__name__


def _read_array(f: IO[bytes], stored_size: int | None) -> np.ndarray:
    """One .npy stream: header checked, then exactly the declared bytes. `stored_size` is the
    archive's declared size of the member (checked against the header before inflating)."""
    try:
        version = npy_format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = npy_format.read_array_header_1_0(f)
        elif version in ((2, 0), (3, 0)):
            shape, fortran, dtype = npy_format.read_array_header_2_0(f)
        else:
            raise _Bad(f"unsupported .npy format version {version}")
    except (_Bad, zipfile.BadZipFile, zlib.error, EOFError, OSError):
        raise  # the archive's or the file's fault, reported as such by the callers
    except Exception as exc:  # noqa: BLE001 - numpy's header parser (ast, tokenize) raises
        # ValueError, SyntaxError, tokenize.TokenError, TypeError... on a corrupt header
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise _Bad(f"not a valid .npy header ({reason})") from None
    if dtype.kind not in "biuf":
        raise _Bad(f"it holds {dtype} values, expected real numbers")
    try:
        count = check_elements(shape, "")
    except LimitError as exc:
        raise _Bad(str(exc)) from None
    nbytes = count * dtype.itemsize
    header_size = f.tell()
    if stored_size is not None and stored_size != header_size + nbytes:
        raise _Bad(
            f"{stored_size - header_size} bytes of data for shape {list(shape)} of {dtype}, "
            f"expected {nbytes}"
        )
    data = bytearray(nbytes)  # writable, unlike the bytes f.read would give
    got = f.readinto(data)
    if got != nbytes:
        raise _Bad(f"{got} bytes of data for shape {list(shape)} of {dtype}, expected {nbytes}")
    array = np.frombuffer(data, dtype=dtype)
    return array.reshape(shape, order="F" if fortran else "C")
