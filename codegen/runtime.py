"""The C runtime of compiled code (`runtime.c`): the thread pool and the workspace cache.

Generated code calls five functions of it (`RUNTIME_FUNCTIONS`): `tlc_rt_threads()`, the
thread count a library call uses; `tlc_rt_parallel(task, ctx, count, threads)`, which runs the
`count` tasks of a parallel region; `tlc_rt_parallel_parts(task, ctx, parts, threads)`, which
runs a split node's parts in ranges the threads share out as they go; `tlc_rt_acquire(bytes)` /
`tlc_rt_release(p)`, a workspace block from the cache and back. A shared library compiles
`runtime.c` with its dispatcher, the five functions hidden (each library has its own pool).
The JIT links against a helper shared object built from the same source once per user and
source version, kept in a private cache directory (`helper_path`: mode 0700, owned by this
user, never a shared temporary directory) and passes the helper's addresses to LLJIT.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Callable
from functools import cache

from tlc.core.diagnostics import DiagnosticError

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "runtime.c")
#: What generated code calls (declared in the IR, resolved by the linker or the JIT).
RUNTIME_FUNCTIONS = ("tlc_rt_threads", "tlc_rt_parallel", "tlc_rt_parallel_parts", "tlc_rt_acquire",
                     "tlc_rt_release")  # fmt: skip
#: Flags every build of the runtime uses.
CFLAGS = ("-O2", "-fPIC", "-pthread")


def c_compiler() -> str:
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        raise DiagnosticError.simple(
            "codegen: no C compiler (cc) found to build tlc's runtime (the thread pool)"
        )
    return cc


def _source() -> bytes:
    with open(SOURCE, "rb") as f:
        return f.read()


def _private(path: str, kind: Callable[[int], bool]) -> bool:
    """Whether `path` is, itself (not through a link), of `kind` (`stat.S_ISDIR`, `S_ISREG`),
    owned by this user, and writable by nobody else (so nothing in it or of it was planted)."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return (
        kind(info.st_mode)
        and info.st_uid == os.getuid()
        and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    )


def private_dir(path: str) -> bool:
    return _private(path, stat.S_ISDIR)


def own_file(path: str) -> bool:
    return _private(path, stat.S_ISREG)


def cache_dir() -> str | None:
    """`$XDG_CACHE_HOME/tlc` (or `~/.cache/tlc`), created mode 0700; None when it cannot be
    made private (then the helper is built per process in a fresh mkdtemp directory)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return made_private(os.path.join(base, "tlc"))


def made_private(path: str) -> str | None:
    """`path`, a directory created mode 0700 if missing; None when it cannot be made or is
    not private (`private_dir`)."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError:
        return None
    return path if private_dir(path) else None


def _build(cc: str, directory: str, name: str) -> str:
    """Compile the helper into `directory/name` through a temporary name (atomic replace)."""
    target = os.path.join(directory, name)
    work = tempfile.mkdtemp(prefix="tlc-rt-", dir=directory)
    try:
        partial = os.path.join(work, name)
        command = [cc, "-shared", *CFLAGS, "-DTLC_RT_EXPORT", "-o", partial, SOURCE]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise DiagnosticError.simple(
                f"codegen: building the runtime failed ({' '.join(command)}):\n"
                f"{done.stderr.strip()}"
            )
        os.replace(partial, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


@cache
def helper() -> ctypes.CDLL:
    """The JIT's runtime, loaded once per process (built on first use per user and version)."""
    cc = c_compiler()
    digest = hashlib.sha256(_source() + " ".join((cc, *CFLAGS)).encode()).hexdigest()[:16]
    name = f"libtlcrt-{digest}.so"
    directory = cache_dir()
    if directory is not None:
        path = os.path.join(directory, name)
        if not own_file(path):
            path = _build(cc, directory, name)
        return ctypes.CDLL(path)
    directory = tempfile.mkdtemp(prefix="tlc-rt-")
    try:
        return ctypes.CDLL(_build(cc, directory, name))
    finally:
        shutil.rmtree(directory, ignore_errors=True)  # the mapping outlives the file


def helper_symbols() -> dict[str, int]:
    """Address of every runtime function in the JIT's helper."""
    lib = helper()
    return {
        name: ctypes.cast(getattr(lib, name), ctypes.c_void_p).value for name in RUNTIME_FUNCTIONS
    }


def available_cpus() -> int:
    """The CPUs this process may run on (the default thread count)."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except (AttributeError, OSError):
        return os.cpu_count() or 1
