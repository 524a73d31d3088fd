"""Object code for LLVM IR, through a content-addressed cache in the user's private cache dir.

`object_code(ir_text, target)` (and `object_codes`, several at once) is what `tlc-compile` and
the JIT's node kernels call instead of optimising and emitting themselves: the object code LLVM
makes of the same IR text for the same target machine (CPU name, feature flags, triple,
pipeline, LLVM and llvmlite versions) is the same bytes, so the second compile of a model, in
this process or any later one, reads them back instead of running O3 and instruction selection
again (the costly steps: `bench/compile_time.py`). The JIT's graphs look their entry up before
any IR is built (`load`/`store` with a `key` of what the build is made from and
`source_digest`, `tlc.codegen.jit`).

The cache is `<cache_dir>/objects` (`$XDG_CACHE_HOME/tlc/objects`, default `~/.cache/tlc`,
as for the JIT's runtime helper) and is held to the same rules (docs/security.md):
- the directory is created mode 0700 and used only while it is owned by this user and
  writable by nobody else; an entry is read only when it is a regular file (not a link) owned
  by this user that nobody else can write;
- an entry holds a magic line and the SHA-256 of the object bytes, checked on every read: a
  truncated or altered file is a miss (and is rewritten), never loaded;
- entries are written to a fresh temporary name and renamed into place, so a reader never sees
  half an entry, and concurrent compiles of one model are harmless;
- the directory is kept under `MAX_BYTES` by removing the entries least recently used.
`TLC_OBJECT_CACHE=0` turns the cache off (every compile runs LLVM; nothing is read or written).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from functools import cache

import llvmlite
import llvmlite.binding as llvm
import numpy as np

from tlc.codegen.runtime import available_cpus, cache_dir, made_private, own_file
from tlc.codegen.target import (
    PIPELINE,
    Target,
    compile_ir,
    emit_object,
    machine_cpu,
)

#: Set to 0 (or off, no, false) to compile without the cache.
ENV_SWITCH = "TLC_OBJECT_CACHE"
#: The cache directory is trimmed to three quarters of this when a write takes it above.
MAX_BYTES = 1 << 30
#: The first bytes of every entry; then the SHA-256 of the rest: the length of a JSON object
#: of facts (little-endian u64), the JSON, the object code.
MAGIC = b"tlc object 1\n"
_DIGEST = hashlib.sha256().digest_size


def enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "off", "no", "false")


def key(parts: Sequence[str], target: Target) -> str:
    """An entry's name: a hash of `parts` (the IR text, or what a build is made from) and of
    everything else the object code depends on (target machine, pipeline, LLVM)."""
    cpu, features = machine_cpu(target)
    digest = hashlib.sha256()
    for part in (
        MAGIC.decode(),
        llvmlite.__version__,
        ".".join(map(str, llvm.llvm_version_info)),
        target.full_triple,
        cpu,
        features,
        PIPELINE,
        *parts,
    ):
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()


@cache
def source_digest() -> str:
    """A hash of the source files of tlc's layers up to codegen (what turns a printed graph
    and its payload into IR) and of numpy's and llvmlite's versions: part of the key of an
    entry looked up before the IR is built (`tlc.codegen.jit`), so that any change to the
    code that builds IR makes new entries."""
    import tlc.codegen
    import tlc.core
    import tlc.dialect
    import tlc.passes
    import tlc.semantics

    digest = hashlib.sha256(f"{np.__version__} {llvmlite.__version__}".encode())
    for package in (tlc.core, tlc.dialect, tlc.semantics, tlc.passes, tlc.codegen):
        for root in package.__path__:
            for folder, dirs, files in os.walk(root):
                dirs[:] = sorted(d for d in dirs if d != "__pycache__")
                for name in sorted(files):
                    if name.endswith((".py", ".c", ".json", ".lark")):
                        path = os.path.join(folder, name)
                        with open(path, "rb") as f:
                            digest.update(os.path.relpath(path, root).encode() + f.read())
    return digest.hexdigest()


def objects_dir() -> str | None:
    """`<cache_dir>/objects`, made mode 0700; None when it is not private or the cache is
    off (`TLC_OBJECT_CACHE=0`)."""
    base = cache_dir() if enabled() else None
    return None if base is None else made_private(os.path.join(base, "objects"))


def object_code(ir_text: str, target: Target) -> bytes:
    """Object code of `ir_text` for `target` (O3 and instruction selection, as
    `tlc.codegen.target` does them), from the cache when an entry verifies."""
    name = key([ir_text], target)
    hit = load(name)
    if hit is not None:
        return hit[0]
    obj = emit_object(compile_ir(ir_text, target), target)
    store(name, obj)
    return obj


def object_codes(
    jobs: Sequence[tuple[str, Target]],
    cached: bool = True,
    spare: Sequence[Worker] = (),
) -> list[bytes]:
    """`object_code` of each (IR text, target), the misses compiled at the same time: the first
    in this process, each other one of `PARALLEL_LINES` or more in a worker process of its own
    (`python -m tlc.codegen.objcache`) when this process may use more than one CPU. A worker
    that fails is no loss: its job is compiled here. (llvmlite serialises every LLVM call in a
    process behind one lock, so threads would not run LLVM in parallel.) `cached=False`: every
    job is compiled and none is stored (a caller that keeps the objects under a key of its own:
    the JIT's graphs). `spare`: workers `spawn_workers` started while the caller built the IR
    (their start-up, about 0.45 s of imports, then costs no wall time); they take the
    jobs for their target first, and those left over are stopped."""
    names = [key([text], target) for text, target in jobs] if cached else []
    hits = [load(name) for name in names] if cached else [None] * len(jobs)
    results: list[bytes | None] = [None if hit is None else hit[0] for hit in hits]
    misses = [i for i, r in enumerate(results) if r is None]
    ready = list(spare)
    workers = {}
    if available_cpus() > 1:
        for i in misses[1:]:
            text, target = jobs[i]
            if text.count("\n") >= PARALLEL_LINES:
                mine = next((w for w in ready if w[0] == target), None)
                if mine is not None:
                    ready.remove(mine)
                workers[i] = _feed(mine[1] if mine is not None else _spawn(target), text)
    stop_workers(ready)
    for i in misses:
        worker = workers.get(i)
        obj = _finish_worker(worker) if worker is not None else None
        if obj is None:
            text, target = jobs[i]
            obj = emit_object(compile_ir(text, target), target)
        if cached:
            store(names[i], obj)
        results[i] = obj
    return [r for r in results if r is not None]


#: Misses of fewer lines of IR (about one instruction a line; a baked payload is one line) are
#: compiled in this process: a worker's start-up, about 0.45 s on a Zen 3 (Python, numpy and
#: llvmlite; no xdsl, which `tlc.core.diagnostics` imports only where an op is at hand: 0.8 s
#: before), costs about what LLVM spends on 3,000 lines of kernels (resnet18's 22,000 lines
#: took 3.4 s).
PARALLEL_LINES = 3_000


#: A worker process started for a target, waiting for its IR (`spawn_workers`).
Worker = tuple[Target, subprocess.Popen]


def spawn_workers(count: int, target: Target) -> list[Worker]:
    """`count` workers for `target` (as many as start), to pass to `object_codes` once the IR
    is built; none when this process may use only one CPU."""
    if available_cpus() < 2:
        return []
    started = (_spawn(target) for _ in range(count))
    return [(target, proc) for proc in started if proc is not None]


def _spawn(target: Target) -> subprocess.Popen | None:
    """A worker compiling for `target` the IR it will read on its stdin; None when it cannot
    start."""
    command = [sys.executable, "-m", "tlc.codegen.objcache", target.cpu, target.features,
               target.triple]  # fmt: skip
    try:
        return subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL)  # fmt: skip
    except OSError:
        return None


def _feed(proc: subprocess.Popen | None, text: str) -> subprocess.Popen | None:
    """`proc` with `text` written to its stdin by a thread (so a large module cannot block on
    the pipe)."""
    if proc is None:
        return None

    def feed() -> None:
        assert proc.stdin is not None
        with contextlib.suppress(OSError), proc.stdin:
            proc.stdin.write(text.encode())

    threading.Thread(target=feed, daemon=True).start()
    return proc


def stop_workers(workers: Sequence[Worker]) -> None:
    """Workers given no job (`spawn_workers`), stopped and reaped."""
    for _, proc in workers:
        proc.kill()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()
        proc.wait()


def _finish_worker(proc: subprocess.Popen | None) -> bytes | None:
    """The worker's object code, or None if it failed."""
    if proc is None:
        return None
    assert proc.stdout is not None
    with proc.stdout:
        obj = proc.stdout.read()
    return obj if proc.wait() == 0 and obj else None


def _worker_main(argv: Sequence[str]) -> None:
    """A worker: the IR on stdin, the object code for the target `argv` names on stdout."""
    cpu, features, triple = argv
    target = Target(cpu, features, triple)
    text = sys.stdin.buffer.read().decode()
    sys.stdout.buffer.write(emit_object(compile_ir(text, target), target))


def load(name: str) -> tuple[bytes, dict] | None:
    """The object code and facts of entry `name`, if it is this user's own file and its
    digest checks (else None: a miss)."""
    directory = objects_dir()
    if directory is None:
        return None
    path = os.path.join(directory, name + ".o")
    if not own_file(path):
        return None
    try:
        with open(path, "rb", buffering=0) as f:
            data = f.read()
    except OSError:
        return None
    start = len(MAGIC) + _DIGEST
    if (
        data[: len(MAGIC)] != MAGIC
        or hashlib.sha256(data[start:]).digest() != data[len(MAGIC) : start]
    ):
        return None
    size = int.from_bytes(data[start : start + 8], "little")
    try:
        facts = json.loads(data[start + 8 : start + 8 + size])
    except ValueError:
        return None
    with contextlib.suppress(OSError):
        os.utime(path)  # recently used: trimmed last
    return data[start + 8 + size :], facts


def store(name: str, obj: bytes, facts: dict | None = None) -> None:
    """Keep `obj` (with the JSON-able `facts` a caller needs to use it) as entry `name`,
    through a temporary name; a cache that cannot be written is no cache."""
    directory = objects_dir()
    if directory is None:
        return
    meta = json.dumps(facts or {}, separators=(",", ":")).encode()
    body = len(meta).to_bytes(8, "little") + meta + obj
    try:
        fd, partial = tempfile.mkstemp(prefix=".partial-", dir=directory)
    except OSError:
        return
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(MAGIC + hashlib.sha256(body).digest() + body)
        os.replace(partial, os.path.join(directory, name + ".o"))
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(partial)
        return
    trim(directory)


def trim(directory: str, limit: int = MAX_BYTES) -> None:
    """Remove the least recently used entries while the directory holds over `limit` bytes,
    down to three quarters of it."""
    entries = []
    try:
        with os.scandir(directory) as it:
            for entry in it:
                if entry.name.endswith(".o") and entry.is_file(follow_symlinks=False):
                    info = entry.stat(follow_symlinks=False)
                    entries.append((info.st_mtime, info.st_size, entry.path))
    except OSError:
        return
    total = sum(size for _, size, _ in entries)
    if total <= limit:
        return
    for _, size, path in sorted(entries):
        try:
            os.unlink(path)
        except OSError:
            continue
        total -= size
        if total <= limit * 3 // 4:
            return


if __name__ == "__main__":
    _worker_main(sys.argv[1:])
