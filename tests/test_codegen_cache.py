"""The object cache (tlc.codegen.objcache): a second compile of the same graph reads its object
code back, bit for bit the same code, and the cache is private, verified and bounded."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tlc.api.evaluate import checked_graph
from tlc.codegen import jit, objcache
from tlc.codegen.module import APART_PRODUCTS, INLINE_NODES, build_graph_module, kernels_apart
from tlc.codegen.shared_lib import build_library
from tlc.codegen.target import HOST, Target
from tlc.core.payload import Payload
from tlc.dialect.payload_section import payload_from_module
from tlc.frontends.text import parse_source

needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")

MLP = (Path(__file__).parent.parent / "examples" / "mlp.tlir").read_text()
X = np.array([0.3, -0.2, 0.1, 0.4])


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh private cache directory, the cache on, and no in-process JIT cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv(objcache.ENV_SWITCH, raising=False)
    monkeypatch.setattr(jit, "_graph_cache", {})
    return tmp_path / "home" / "tlc" / "objects"


def compile_mlp(dtype: type = np.float64) -> np.ndarray:
    module = parse_source(MLP, "mlp.tlir")
    graph = checked_graph(module, None)
    jit._graph_cache.clear()
    return jit.compile_graph(graph, payload_from_module(module, "mlp"), dtype)(X)


def llvm_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """From here on, running LLVM's optimiser fails the test: code must come from the cache."""

    def refused(*_args: object) -> None:
        raise AssertionError("LLVM ran: the object cache was not used")

    monkeypatch.setattr(objcache, "compile_ir", refused)


def entries(cache: Path) -> list[Path]:
    return sorted(cache.glob("*.o"))


def test_a_second_compile_reads_the_same_code_back(cache: Path, monkeypatch) -> None:
    first = compile_mlp()
    (entry,) = entries(cache)
    assert stat.S_IMODE(os.stat(cache).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(entry).st_mode) == 0o600
    llvm_refused(monkeypatch)
    assert compile_mlp().tobytes() == first.tobytes()
    with pytest.raises(AssertionError, match="LLVM ran"):
        compile_mlp(np.float32)  # another build is another entry


def test_an_altered_or_truncated_entry_is_never_read(cache: Path) -> None:
    want = compile_mlp()
    (entry,) = entries(cache)
    data = bytearray(entry.read_bytes())
    data[-1] ^= 0xFF
    entry.write_bytes(bytes(data))
    assert objcache.load(entry.stem) is None
    assert compile_mlp().tobytes() == want.tobytes()  # compiled again, and rewritten
    assert objcache.load(entry.stem) is not None
    entry.write_bytes(entry.read_bytes()[:100])
    assert objcache.load(entry.stem) is None


def test_entries_others_could_have_written_are_ignored(cache: Path, tmp_path: Path) -> None:
    compile_mlp()
    (entry,) = entries(cache)
    os.chmod(entry, 0o666)
    assert objcache.load(entry.stem) is None  # writable by others
    os.chmod(entry, 0o600)
    assert objcache.load(entry.stem) is not None
    elsewhere = tmp_path / "planted.o"
    shutil.move(entry, elsewhere)
    entry.symlink_to(elsewhere)
    assert objcache.load(entry.stem) is None  # a link, even to a good entry


def test_a_cache_directory_others_can_write_is_not_used(cache: Path, monkeypatch) -> None:
    cache.mkdir(parents=True)
    os.chmod(cache, 0o777)
    assert objcache.objects_dir() is None
    compile_mlp()
    assert entries(cache) == []


def test_the_switch_turns_the_cache_off(cache: Path, monkeypatch) -> None:
    monkeypatch.setenv(objcache.ENV_SWITCH, "0")
    compile_mlp()
    assert not cache.exists() or entries(cache) == []


@pytest.mark.parametrize(("switch", "builds"), [("1", 1), ("0", 2)])
def test_the_switch_also_turns_off_the_process_table(
    cache: Path, monkeypatch: pytest.MonkeyPatch, switch: str, builds: int
) -> None:
    """Compiled graphs are kept per process only while the cache is on: with it off, a second
    compile of the same graph builds again (so a code-generator constant changed in between,
    as A/B measurements do, takes effect)."""
    monkeypatch.setenv(objcache.ENV_SWITCH, switch)
    calls = []
    real = jit._built
    monkeypatch.setattr(jit, "_built", lambda *a: calls.append(1) or real(*a))
    module = parse_source(MLP, "mlp.tlir")
    graph, payload = checked_graph(module, None), payload_from_module(module, "mlp")
    first = jit.compile_graph(graph, payload)(X)
    second = jit.compile_graph(graph, payload)(X)
    assert len(calls) == builds
    assert first.tobytes() == second.tobytes()


def test_trim_removes_the_least_recently_used(tmp_path: Path) -> None:
    for i in range(8):
        path = tmp_path / f"{i}.o"
        path.write_bytes(bytes(100))
        os.utime(path, (1000 + i, 1000 + i))
    objcache.trim(str(tmp_path), limit=500)
    assert sorted(p.name for p in tmp_path.glob("*.o")) == ["5.o", "6.o", "7.o"]


def test_keys_name_the_target_machine_and_the_text() -> None:
    names = {
        objcache.key(["x"], HOST),
        objcache.key(["y"], HOST),
        objcache.key(["x"], Target("x86-64-v3")),
        objcache.key(["x"], Target("x86-64-v2")),
    }
    assert len(names) == 4


@needs_cc
def test_a_library_rebuilt_from_the_same_graph_reuses_its_objects(
    cache: Path, tmp_path: Path, monkeypatch
) -> None:
    module = parse_source(MLP, "mlp.tlir")
    graphs = [(checked_graph(module, None), payload_from_module(module, "mlp"))]
    first = tmp_path / "first.so"
    build_library(graphs, str(first), target=Target("x86-64-v2"))
    llvm_refused(monkeypatch)
    second = tmp_path / "second.so"
    build_library(graphs, str(second), target=Target("x86-64-v2"))
    assert second.read_bytes() == first.read_bytes()


def mlp_ir(target: Target) -> str:
    from tlc.codegen.module import build_graph_module

    module = parse_source(MLP, "mlp.tlir")
    graph = checked_graph(module, None)
    return build_graph_module(graph, payload_from_module(module, "mlp"), target=target).ir


@pytest.mark.parametrize("python", ["worker", "failing worker"])
def test_misses_compiled_in_worker_processes_are_the_same_code(
    cache: Path, monkeypatch, python: str
) -> None:
    """Several misses compile at once, all but the first in worker processes (forced here for
    a small module); a worker that fails leaves its job to this process. Either way every
    object is what this process makes of the IR, and is stored."""
    from tlc.codegen.target import compile_ir, emit_object

    monkeypatch.setattr(objcache, "PARALLEL_LINES", 0)
    monkeypatch.setattr(objcache, "available_cpus", lambda: 2)
    if python == "failing worker":
        monkeypatch.setattr(objcache.sys, "executable", "/bin/false")
    levels = [Target(level) for level in ("x86-64-v3", "x86-64-v2")]
    jobs = [(mlp_ir(t), t) for t in levels]
    want = [emit_object(compile_ir(text, t), t) for text, t in jobs]
    here = []
    monkeypatch.setattr(objcache, "compile_ir", lambda *args: here.append(1) or compile_ir(*args))
    assert objcache.object_codes(jobs) == want
    assert len(here) == (1 if python == "worker" else 2)
    assert len(entries(cache)) == 2
    llvm_refused(monkeypatch)
    assert objcache.object_codes(jobs) == want


def chain(layers: int) -> tuple[str, Payload]:
    """Linear + relu layers of as many widths, so over INLINE_NODES nodes with a kernel a
    layer."""
    rng = np.random.default_rng(0)
    lines, fields, width = ["tl.graph @chain {", "  %0 = input : [8]"], {}, 8
    for i in range(layers):
        out = 9 + i
        lines += [f"  %{2 * i + 1} = linear(%{2 * i}) : [{out}]",
                  f"  %{2 * i + 2} = relu(%{2 * i + 1})"]  # fmt: skip
        fields[f"{2 * i + 1}.weight"] = rng.standard_normal((out, width)) / np.sqrt(width)
        fields[f"{2 * i + 1}.bias"] = rng.standard_normal(out)
        width = out
    lines += [f"  output %{2 * layers}", "}"]
    return "\n".join(lines), Payload.from_flat(fields)


def test_a_big_graphs_kernels_compile_in_modules_of_their_own(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A graph over INLINE_NODES nodes has its kernels spread over a module per CPU
    (`kernel_modules`), each about the same size, compiled at the same time (here in a worker
    started while the IR was built) and linked together: the bits of one module, and a cache
    entry that gives all the objects back."""
    text, payload = chain(40)
    graph = checked_graph(parse_source(text, "chain.tlir"), None)
    assert len(graph.nodes) > INLINE_NODES
    module = build_graph_module(graph, payload, np.float64, kernel_modules=2)
    (part,) = module.parts
    kernels = [re.findall(rf"^define {linkage} i32 @\"tlc_chain\.n\d+\"", ir, re.M)
               for ir, linkage in ((module.ir, "internal"), (part, "hidden"))]  # fmt: skip
    assert all(len(k) >= 15 for k in kernels), [len(k) for k in kernels]
    assert all(name.replace("define", "declare") in module.ir for name in kernels[1])
    x = np.random.default_rng(1).standard_normal(8)
    monkeypatch.setattr(jit, "MAX_KERNEL_MODULES", 1)
    one = jit.compile_graph(graph, payload)(x)
    monkeypatch.setattr(jit, "MAX_KERNEL_MODULES", 2)
    monkeypatch.setattr(jit, "available_cpus", lambda: 2)
    monkeypatch.setattr(objcache, "available_cpus", lambda: 2)
    monkeypatch.setattr(objcache, "PARALLEL_LINES", 0)
    spawned = []
    monkeypatch.setattr(objcache, "_spawn", lambda t, s=objcache._spawn: spawned.append(t) or s(t))
    monkeypatch.setenv("TLC_OBJECT_CACHE", "0")
    jit._graph_cache.clear()
    assert jit.compile_graph(graph, payload)(x).tobytes() == one.tobytes()
    assert len(spawned) == 1
    monkeypatch.setenv("TLC_OBJECT_CACHE", "1")
    jit._graph_cache.clear()
    spread = jit.compile_graph(graph, payload)(x)  # stored, then read back
    llvm_refused(monkeypatch)
    jit._graph_cache.clear()
    assert jit.compile_graph(graph, payload)(x).tobytes() == spread.tobytes() == one.tobytes()


@pytest.mark.parametrize(("layers", "apart"), [(APART_PRODUCTS, False), (APART_PRODUCTS + 1, True)])
def test_a_graph_of_many_products_keeps_its_kernels_apart(layers: int, apart: bool) -> None:
    """Under INLINE_NODES nodes, a graph of more than APART_PRODUCTS matrix products or
    convolutions still has its kernels spread over modules (their code is large: resnet18
    from an ONNX file has 50 nodes, 21 of them convolutions); one of fewer inlines them."""
    text, payload = chain(layers)
    graph = checked_graph(parse_source(text, "chain.tlir"), None)
    assert len(graph.nodes) <= INLINE_NODES
    module = build_graph_module(graph, payload, np.float64, kernel_modules=2)
    assert kernels_apart(graph) is apart
    assert len(module.parts) == (1 if apart else 0)


def test_workers_given_no_job_are_stopped() -> None:
    workers = objcache.spawn_workers(2, HOST) if objcache.available_cpus() > 1 else []
    objcache.stop_workers(workers)
    assert all(proc.returncode is not None for _, proc in workers)


def test_a_worker_imports_no_xdsl() -> None:
    """A compile worker (`python -m tlc.codegen.objcache`) needs llvmlite, not the IR's
    dialects: `tlc.core.diagnostics` imports xdsl only where an op is at hand, so a worker
    starts in about 0.45 s instead of 0.8 (`PARALLEL_LINES` is sized by it)."""
    probe = "import sys, tlc.codegen.objcache; print({m.split('.')[0] for m in sys.modules})"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True)  # fmt: skip
    assert "'xdsl'" not in done.stdout and "'llvmlite'" in done.stdout
