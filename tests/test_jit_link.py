"""The JIT links objects wherever the process has mapped its memory (`codegen/jit.py`).

x86-64 code built for the small code model (tlc's, as most code) reaches its own constants
through 32-bit PC-relative offsets, so an object's code and constants must lie within 2 GiB of
each other once linked. RuntimeDyld, llvmlite's default linker, maps each kind of section
separately, wherever the kernel finds room: a small code section fits a small hole high up in
a long-running process's address space, its constants (bigger) go to the next free space that
holds them, which can be gigabytes below. A process that had loaded several big models aborted
that way (`RuntimeDyldELF::resolveX86_64Relocation: Assertion isInt<32>(RealOffset)`). The
test makes it happen on purpose in a child process: it fills every gap in the address space
between the heap and the stack but a 16 KiB hole, reserves 3 GiB below, and links an object
with a few bytes of code and 32 KiB of constants. RuntimeDyld aborts the child (or, in an LLVM
built without assertions, lets the code read the wrong memory) every time; the JIT's linker
must place the object in one block and read its constants right.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

CHILD = r"""
import ctypes
from tlc.codegen import objcache
from tlc.codegen.jit import link_object
from tlc.codegen.target import HOST

def table(i, n):
    values = ", ".join(f"float {j % 97 + i}.0" for j in range(n))
    return f'''
@tab{i} = private unnamed_addr constant [{n} x float] [{values}]
define float @get{i}(i64 %j) {{
  %p = getelementptr [{n} x float], ptr @tab{i}, i64 0, i64 %j
  %v = load float, ptr %p
  ret float %v
}}
'''

def linked(i, n, obj):
    tracker = link_object(obj, [f"get{i}"], HOST, runtime=False)
    get = ctypes.CFUNCTYPE(ctypes.c_float, ctypes.c_int64)(tracker[f"get{i}"])
    return tracker, tracker[f"get{i}"], [get(1), get(n - 1)]

libc = ctypes.CDLL(None)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                      ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
NONE, ANON, NORESERVE, NOREPLACE = 0, 0x22, 0x4000, 0x100000  # PROT_NONE, MAP_PRIVATE|ANONYMOUS
objects = [objcache.object_code(table(i, n), HOST) for i, n in ((0, 4), (1, 8192))]
first = linked(0, 4, objects[0])
hole = libc.mmap(None, 4 << 12, NONE, ANON, -1, 0)  # the highest free pages: a hole to come
spans, stack = [], None
with open("/proc/self/maps") as maps:
    for line in maps:
        lo, hi = (int(a, 16) for a in line.split()[0].split("-"))
        spans.append((lo, hi))
        if line.rstrip().endswith("[stack]"):
            stack = lo
spans = sorted(s for s in spans if 1 << 44 <= s[0] < stack)
for (_, end), (start, _) in zip(spans, spans[1:]):
    if start > end:
        libc.mmap(end, start - end, NONE, ANON | NORESERVE | NOREPLACE, -1, 0)
libc.mmap(None, 3 << 30, NONE, ANON | NORESERVE, -1, 0)
libc.munmap(hole, 4 << 12)  # 16 KiB free up there, the next free space 3 GiB below
second = linked(1, 8192, objects[1])
print(first[2], second[2], abs(second[1] - first[1]) > 1 << 31)
"""


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.machine() != "x86_64",
    reason="fills the address space through Linux's /proc/self/maps and mmap flags (x86-64)",
)
def test_an_object_linked_far_from_the_last_reads_its_constants() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHILD],
        env={**os.environ, "TLC_OBJECT_CACHE": "0"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    # get0(j) = j % 97, get1(j) = j % 97 + 1 (8191 % 97 = 43); and the second object did land
    # more than 2 GiB from the first.
    assert done.stdout.split() == ["[1.0,", "3.0]", "[2.0,", "44.0]", "True"]
