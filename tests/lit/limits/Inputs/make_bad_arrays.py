"""Write the malformed .npy/.npz files of readers.tlir into the directory given (issue 14)."""

import io
import sys
import zipfile
from pathlib import Path

import numpy as np
from numpy.lib import format as npy_format

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
np.save(out / "plain.npy", np.zeros(4))
(out / "empty.npz").write_bytes(b"")
(out / "text.npz").write_text("W1 = [1, 2]\n")
np.save(out / "complex.npy", np.array([1 + 2j, 3, 4, 5]))
np.save(out / "dates.npy", np.array(["2024-01-01"] * 4, dtype="datetime64[D]"))
np.savez(out / "complex.npz", **{"1.weight": np.ones((2, 4), dtype=complex)})


def header(shape: tuple[int, ...]) -> bytes:
    """An .npy header declaring `shape` of float64, with no data after it."""
    buffer = io.BytesIO()
    npy_format.write_array_header_1_0(
        buffer, {"descr": "<f8", "fortran_order": False, "shape": shape}
    )
    return buffer.getvalue()


# A 100-byte file declaring 8 TiB.
(out / "huge.npy").write_bytes(header((2**20, 2**20)))
with zipfile.ZipFile(out / "huge.npz", "w") as z:
    z.writestr("1.weight.npy", header((2**20, 2**20)))
# A small archive whose member inflates far beyond the data its header declares.
with zipfile.ZipFile(out / "bomb.npz", "w", zipfile.ZIP_DEFLATED) as z:
    z.writestr("1.weight.npy", header((2, 4)) + bytes(64 * 2**20))
# A member whose header declares more data than the member holds.
with zipfile.ZipFile(out / "short.npz", "w") as z:
    z.writestr("1.weight.npy", header((2, 4)) + bytes(8))
# A member with an empty name (zipfile's is_dir() fails on it, so patch it out while writing).
is_dir = zipfile.ZipInfo.is_dir
zipfile.ZipInfo.is_dir = lambda self: False  # type: ignore[method-assign]
with zipfile.ZipFile(out / "noname.npz", "w") as z:
    z.writestr(zipfile.ZipInfo(""), header((2, 4)) + bytes(64))
zipfile.ZipInfo.is_dir = is_dir  # type: ignore[method-assign]
# A deflated member with its compressed bytes overwritten.
with zipfile.ZipFile(out / "deflate.npz", "w", zipfile.ZIP_DEFLATED) as z:
    z.writestr("1.weight.npy", header((2, 4)) + np.arange(8.0).tobytes())
data = bytearray((out / "deflate.npz").read_bytes())
start = 30 + len("1.weight.npy")  # the local file header, then the compressed stream
data[start : start + 16] = b"\xff" * 16
(out / "deflate.npz").write_bytes(bytes(data))
