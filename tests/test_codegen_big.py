"""Big payloads: weights over `BAKE_LIMIT` are never baked into the code (x86-64 reaches baked
constants through 32-bit PC-relative relocations, which a gigabyte of weights overflows: LLVM
aborted the whole process in RuntimeDyldELF::resolveX86_64Relocation for vgg11). The JIT holds
them packed and passes a pointer; a library keeps them in a large data section of its own.

Tolerance: the compiled code and the reference compute the same float64 dot products in a
different order: rtol 1e-12.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tlc
from tlc.api.evaluate import checked_graph
from tlc.codegen import jit, objcache
from tlc.codegen import module as codegen_module
from tlc.codegen.jit import compile_graph
from tlc.codegen.module import (
    BAKE_LIMIT,
    bakes_payload,
    bound_params,
    build_graph_module,
    pack_params,
)
from tlc.codegen.shared_lib import build_library
from tlc.codegen.target import HOST, target_info
from tlc.core.payload import Payload
from tlc.frontends.text import parse_source
from tlc.semantics.interpret import interpret
from tlc.tools.compile import main as compile_main


def mlp(widths: list[int], seed: int = 0) -> tuple[str, Payload]:
    """A chain of linear + relu layers of the given widths, with random weights."""
    rng = np.random.default_rng(seed)
    lines = ["tl.graph @big {", f"  %0 = input : [{widths[0]}]"]
    fields = {}
    node = 0
    for a, b in zip(widths, widths[1:], strict=False):
        lines.append(f"  %{node + 1} = linear(%{node}) : [{b}]")
        fields[f"{node + 1}.weight"] = rng.standard_normal((b, a)) / np.sqrt(a)
        fields[f"{node + 1}.bias"] = rng.standard_normal(b)
        lines.append(f"  %{node + 2} = relu(%{node + 1}) : [{b}]")
        node += 2
    lines += [f"  output %{node}", "}"]
    return "\n".join(lines), Payload.from_flat(fields)


def reference(source: str, payload: Payload, x: np.ndarray) -> np.ndarray:
    graph = checked_graph(parse_source(source, "big.tlir"), None)
    return np.asarray(interpret(graph, payload, x).output)


#: Just over the bake limit in float64 (2048 x 1040 weights = 17 MB).
OVER = [1040, 2048, 16]
OVER_VALUES = 2048 * 1040 + 2048 + 16 * 2048 + 16


def test_the_limit_is_by_bytes_of_the_compiled_dtype() -> None:
    source, _ = mlp(OVER)
    graph = checked_graph(parse_source(source, "big.tlir"), None)
    assert BAKE_LIMIT < OVER_VALUES * 8
    assert not bakes_payload(graph, np.float64)
    assert bakes_payload(graph, np.float32)  # half the bytes
    small, _ = mlp([4, 5, 3])
    assert bakes_payload(checked_graph(parse_source(small, "s.tlir"), None))


def test_jit_passes_a_big_payload_by_pointer() -> None:
    source, payload = mlp(OVER)
    graph = checked_graph(parse_source(source, "big.tlir"), None)
    compiled = compile_graph(graph, payload)
    assert compiled.bound is not None and compiled.bound.nbytes > BAKE_LIMIT
    x = np.random.default_rng(1).standard_normal(OVER[0])
    np.testing.assert_allclose(compiled(x), reference(source, payload, x), rtol=1e-12)
    with pytest.raises(ValueError, match="parameters are compiled in"):
        compiled(x, params=compiled.bound)
    # The module itself holds no weights: its IR is a few kilobytes, not 17 MB of constants.
    built = build_graph_module(graph, payload, runtime_payload=True)
    assert len(built.ir) < 100_000


#: A convolution whose kernel depends on its weights' layout: with W baked (packed), a 7x7
#: plane of 128 channels runs as C^T over packed W^T panels; read row by row (a runtime
#: payload, the C ABI's layout) it must run as C = W patches.
CONV = """tl.graph @c {
  %0 = input : [1, 128, 7, 7]
  %1 = conv(%0) {kernel = [3, 3], padding = [1, 1], channel_axis = 1, in_channels = 128, out_channels = 128}
  %2 = relu(%1)
  output %2
}
"""  # noqa: E501


def test_a_payload_held_by_pointer_is_laid_out_as_baked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over the limit, the JIT's array holds every field as the kernels read baked ones (packed
    for the target: `bound_params`), so the code is the baked build's and computes its bits,
    also when its object code comes from the cache (the array then built without the module)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv(objcache.ENV_SWITCH, raising=False)
    monkeypatch.setattr(jit, "_graph_cache", {})
    graph = checked_graph(parse_source(CONV, "c.tlir"), None)
    rng = np.random.default_rng(3)
    payload = Payload.from_flat({"1.weight": rng.standard_normal((128, 128, 3, 3)) / 34,
                                 "1.bias": rng.standard_normal(128)})  # fmt: skip
    x = rng.standard_normal((1, 128, 7, 7)).astype(np.float32)
    baked = compile_graph(graph, payload, np.float32)
    assert baked.bound is None
    jit._graph_cache.clear()
    monkeypatch.setattr(codegen_module, "BAKE_LIMIT", 1024)
    held = compile_graph(graph, payload, np.float32)
    assert held.bound is not None and held.bound.ctypes.data % 64 == 0
    assert not np.array_equal(held.bound, pack_params(graph, payload, np.float32))
    assert held(x).tobytes() == baked(x).tobytes()
    jit._graph_cache.clear()
    monkeypatch.setattr(jit, "build_graph_module", None)  # the cache must answer
    again = compile_graph(graph, payload, np.float32)
    np.testing.assert_array_equal(again.bound, bound_params(graph, payload, np.float32))
    np.testing.assert_array_equal(again.bound, held.bound)
    assert again(x).tobytes() == baked(x).tobytes()


def test_small_payloads_stay_baked() -> None:
    source, payload = mlp([4, 5, 3])
    graph = checked_graph(parse_source(source, "s.tlir"), None)
    assert compile_graph(graph, payload).bound is None


def test_a_library_holds_a_big_payload_packed_for_each_level(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each CPU level's variant reads its own copy of the payload, packed as its baked build
    would be (the JIT's `bound_params`), so it runs the packed kernels and computes their
    bits: here C^T, where a row-major copy would run C = W patches. Levels with the same
    layout share a copy (x86-64-v2 and the baseline)."""
    monkeypatch.setattr(codegen_module, "BAKE_LIMIT", 1024)
    graph = checked_graph(parse_source(CONV, "c.tlir"), None)
    rng = np.random.default_rng(4)
    payload = Payload.from_flat({"1.weight": rng.standard_normal((128, 128, 3, 3)) / 34,
                                 "1.bias": rng.standard_normal(128)})  # fmt: skip
    built = build_library([(graph, payload)], str(tmp_path / "libc.so"), np.float32)
    symbols = subprocess.run(["objdump", "-t", built.library], capture_output=True, text=True)
    copies = sorted(set(re.findall(r"tlc_c__weights__\w+", symbols.stdout)))
    assert copies == [f"tlc_c__weights__x86_64_v{n}" for n in (2, 3, 4)]
    x = rng.standard_normal((1, 128, 7, 7)).astype(np.float32)
    level = target_info(HOST).level  # the variant this CPU runs
    jit = tlc.compile(CONV, payload, "f32", target_cpu=level)
    assert tlc.load(built.library)(x).tobytes() == jit(x).tobytes()


def test_library_embeds_a_big_payload(tmp_path: Path) -> None:
    source, payload = mlp(OVER)
    graph = checked_graph(parse_source(source, "big.tlir"), None)
    built = build_library([(graph, payload)], str(tmp_path / "libbig.so"))
    header = Path(built.header).read_text()
    assert "int tlc_big(const double *in, double *out);" in header
    assert "params" not in header
    sections = subprocess.run(["objdump", "-h", built.library], capture_output=True, text=True)
    lrodata = [line.split() for line in sections.stdout.splitlines() if ".lrodata" in line]
    assert lrodata and int(lrodata[0][2], 16) >= 8 * OVER_VALUES
    x = np.random.default_rng(2).standard_normal(OVER[0])
    np.testing.assert_allclose(tlc.load(built.library)(x), reference(source, payload, x),
                               rtol=1e-12)  # fmt: skip


def test_tlc_compile_with_an_embedded_payload(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same path through the tool, the limit lowered so the seed MLP's payload is over it,
    for every CPU level of the library."""
    monkeypatch.setattr(codegen_module, "BAKE_LIMIT", 64)
    source, payload = mlp([4, 5, 3])
    path = tmp_path / "small.tlir"
    npz = tmp_path / "small.npz"
    path.write_text(source)
    np.savez(npz, **payload.flat())
    out = tmp_path / "libsmall.so"
    assert compile_main([str(path), "--payload", str(npz), "--dtype", "f64", "-o", str(out)]) == 0
    assert "params" not in out.with_suffix(".h").read_text()
    x = np.array([0.3, -0.2, 0.1, 0.4])
    np.testing.assert_allclose(tlc.load(str(out))(x), reference(source, payload, x), rtol=1e-12)


def test_the_docs_compile_time_commands_run() -> None:
    """docs/threads-memory.md's resnet_2b command with the payload by pointer, as written (the
    others differ only in the bake limit or the model, and vgg11's takes half a minute)."""
    root = Path(__file__).parent.parent
    text = (root / "docs" / "threads-memory.md").read_text(encoding="utf-8")
    commands = [line.split() for line in text.splitlines()
                if line.startswith("python bench/compile_time.py")]  # fmt: skip
    assert len(commands) == 3
    for command in commands:
        if "--by-pointer" not in command:
            continue
        done = subprocess.run([sys.executable, *command[1:]], cwd=root, capture_output=True,
                              text=True, check=False)  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert "resnet_2b (0.23 M parameters, float64, payload " in done.stdout
        error = float(done.stdout.split("max error relative to max |output|: ")[1])
        assert error < 1e-12
