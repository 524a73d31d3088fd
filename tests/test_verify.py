"""tlc-verify and its engine (tlc.api.verify, tlc.frontends.vnnlib): decisions on networks built
here, every sat counterexample checked independently (numpy on the ONNX weights, onnxruntime),
every unsat cross-checked by dense sampling; VNN-LIB forms; the instances csv."""

from __future__ import annotations

import csv
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from crown_nets import mlp, onnx_mlp, random_layers, robustness_property

from tlc.api.bounds import prepared_bounds
from tlc.api.verify import Network, verify
from tlc.core.diagnostics import DiagnosticError
from tlc.frontends.vnnlib import parse_vnnlib
from tlc.semantics.interpret import prepare
from tlc.tools.verify import main

ROOT = Path(__file__).parent.parent
# The verdicts here must not depend on the machine's load: each search takes a few seconds of
# CPU (the ACAS 0.03 box 2.4 s), so the time limit is one no run reaches even on a machine
# loaded 20-fold (tlc-verify's default of 60 s did: a timeout at load 10-16). The limit itself
# is tested by test_timeout.
LIMIT = 600.0


def _numpy_net(layers: list, x: np.ndarray) -> np.ndarray:
    """The ONNX model's function in float64 on its float32 weights (written here, not tlc)."""
    h = np.asarray(x, dtype=np.float64)
    for i, (w, b) in enumerate(layers):
        w32, b32 = np.float32(w).astype(np.float64), np.float32(b).astype(np.float64)
        h = h @ w32.T + b32
        if i + 1 < len(layers):
            h = np.maximum(h, 0)
    return h


@pytest.fixture(scope="module")
def acas(tmp_path_factory: pytest.TempPathFactory) -> tuple[list, Path]:
    """A 5-input, 6 x 50 ReLU network with 5 outputs (ACAS Xu's shape), random weights."""
    layers = random_layers([5] + [50] * 6 + [5], seed=1)
    path = tmp_path_factory.mktemp("acas") / "acas.onnx"
    onnx_mlp(layers, str(path))
    return layers, path


def _run(tmp_path: Path, net: Path, text: str, *args: str) -> str:
    prop = tmp_path / "prop.vnnlib"
    prop.write_text(text)
    out = tmp_path / "result.txt"
    # a later --timeout in args wins
    assert main([str(net), str(prop), "-o", str(out), "--timeout", str(LIMIT), *args]) == 0
    return out.read_text()


def _witness(text: str) -> tuple[np.ndarray, np.ndarray]:
    pairs = [line.strip(" ()\n").split() for line in text.splitlines()[1:]]
    x = np.array([float(v) for name, v in pairs if name.startswith("X")])
    y = np.array([float(v) for name, v in pairs if name.startswith("Y")])
    return x, y


@pytest.mark.parametrize("radius", [0.01, 0.03])
def test_acas_unsat_is_cross_checked_by_sampling(acas, tmp_path: Path, radius: float) -> None:
    layers, net = acas
    centre = np.full(5, 0.2)
    label = int(np.argmax(_numpy_net(layers, centre)))
    lo, hi = centre - radius, centre + radius
    text = robustness_property(lo, hi, label, 5)
    assert _run(tmp_path, net, text) == "unsat\n"
    rng = np.random.default_rng(0)
    points = lo + (hi - lo) * rng.random((200_000, 5))
    corners = lo + (hi - lo) * rng.integers(0, 2, (5_000, 5))
    y = _numpy_net(layers, np.concatenate([points, corners]))
    others = np.delete(y, label, axis=1)
    assert np.all(others.max(axis=1) < y[:, label])


def test_acas_sat_counterexample_is_checked_independently(acas, tmp_path: Path) -> None:
    import onnxruntime

    layers, net = acas
    centre = np.full(5, 0.2)
    label = int(np.argmax(_numpy_net(layers, centre)))
    lo, hi = centre - 0.2, centre + 0.2
    text = _run(tmp_path, net, robustness_property(lo, hi, label, 5))
    assert text.startswith("sat\n((X_0 ")
    x, y = _witness(text)
    assert np.all((lo <= x) & (x <= hi))
    np.testing.assert_allclose(y, _numpy_net(layers, x), rtol=1e-12, atol=1e-12)
    assert np.max(np.delete(y, label)) >= y[label]
    session = onnxruntime.InferenceSession(str(net))
    (y32,) = session.run(None, {"x": x[None].astype(np.float32)})
    np.testing.assert_allclose(y32[0], y, atol=1e-5)


def test_mnist_shaped_mlp_with_linf_boxes() -> None:
    """784-256-256-10 with L-inf boxes: unsat for a small radius (CROWN alone), sat for a large
    one (found by the attack); the witness is re-evaluated here."""
    layers = random_layers([784, 256, 256, 10], seed=2)
    traced = mlp(layers)
    net = Network(prepared_bounds(traced), prepare(traced.graph, traced.payload), traced.payload)
    image = np.random.default_rng(0).uniform(0, 1, 784)  # top-two margin 0.59
    label = int(np.argmax(_numpy_net(layers, image)))
    small = parse_vnnlib(robustness_property(image - 0.001, image + 0.001, label, 10))
    assert verify(net, small, timeout=LIMIT).result == "unsat"
    large = parse_vnnlib(robustness_property(image - 0.5, image + 0.5, label, 10))
    verdict = verify(net, large, timeout=LIMIT)
    assert verdict.result == "sat"
    y = _numpy_net(layers, verdict.x)
    assert np.max(np.delete(y, label)) >= y[label]


def test_unknown_when_the_input_is_too_large_to_split() -> None:
    layers = random_layers([20, 30, 30, 3], seed=5)
    traced = mlp(layers)
    net = Network(prepared_bounds(traced), prepare(traced.graph, traced.payload), traced.payload)
    centre = np.zeros(20)
    y = _numpy_net(layers, centre)
    label = int(np.argmax(y))
    # a tiny gap no input reaches, but CROWN over the whole box cannot show it
    text = robustness_property(centre - 0.5, centre + 0.5, label, 3)
    verdict = verify(net, parse_vnnlib(text), timeout=LIMIT)
    assert verdict.result in ("sat", "unknown")
    if verdict.result == "sat":
        y = _numpy_net(layers, verdict.x)
        assert np.max(np.delete(y, label)) >= y[label]


def test_timeout(acas, tmp_path: Path) -> None:
    layers, net = acas
    centre = np.full(5, 0.2)
    label = int(np.argmax(_numpy_net(layers, centre)))
    text = robustness_property(centre - 0.05, centre + 0.05, label, 5)
    assert _run(tmp_path, net, text, "--timeout", "1e-9") == "timeout\n"


def test_vnnlib_forms() -> None:
    text = """; every form of the grammar
    (declare-const X_0 Real) (declare-const X_1 Real)
    (declare-const Y_0 Real) (declare-const Y_1 Real)
    (assert (and (>= X_0 -1) (<= X_0 1.5e0) (= X_1 0.25)))
    (assert (or (and (< (+ Y_0 (* 2 Y_1)) 3) (> Y_1 -1)) (<= (- Y_0 Y_1) (- 2))))
    """
    prop = parse_vnnlib(text, "p.vnnlib")
    assert (prop.inputs, prop.outputs, len(prop.cases)) == (2, 2, 2)
    first, second = prop.cases
    np.testing.assert_array_equal(first.lo, [-1, 0.25])
    np.testing.assert_array_equal(first.hi, [1.5, 0.25])
    np.testing.assert_array_equal(first.C, [[1, 2], [0, -1]])
    np.testing.assert_array_equal(first.d, [-3, -1])
    assert list(first.strict) == [True, True]
    np.testing.assert_array_equal(second.C, [[1, -1]])
    np.testing.assert_array_equal(second.d, [2])
    assert first.holds([0.0, 0.0]) and not first.holds([3.0, 0.0])


def test_vnnlib_errors_are_located() -> None:
    with pytest.raises(DiagnosticError) as info:
        parse_vnnlib("(declare-const X_0 Real)\n(assert (<= (* X_0 X_0) 1))\n", "p.vnnlib")
    diag = info.value.diagnostics[0]
    assert (str(diag.location), diag.message) == (
        "p.vnnlib:2:13",
        "a product of two variables is not linear",
    )
    with pytest.raises(DiagnosticError, match="'X_0' is declared twice"):
        parse_vnnlib("(declare-const X_0 Real)\n(declare-const X_0 Real)\n")


def test_number_out_of_float64_range_is_a_diagnostic() -> None:
    """Found by tlc.tools.fuzz: a bound of 10^4500 became inf, and Fraction(inf) raised
    OverflowError when the box was made exact."""
    text = "(declare-const X_0 Real)\n(declare-const Y_0 Real)\n(assert (>= X_0 1" + "0" * 400
    with pytest.raises(DiagnosticError) as info:
        parse_vnnlib(text + "))\n(assert (<= X_0 1))\n(assert (<= Y_0 0))\n", "p.vnnlib")
    diag = info.value.diagnostics[0]
    assert (str(diag.location), diag.message) == (
        "p.vnnlib:3:17",
        "number 10000000000000000000... is out of float64 range",
    )


def test_huge_variable_index_is_a_diagnostic() -> None:
    """Found by tlc.tools.fuzz: `X_` followed by 4,500 digits reached int() (ValueError)."""
    with pytest.raises(DiagnosticError) as info:
        parse_vnnlib(
            "(declare-const X_0 Real)\n(declare-const X_" + "9" * 4500 + " Real)\n", "p.vnnlib"
        )
    diag = info.value.diagnostics[0]
    assert (str(diag.location), diag.message) == (
        "p.vnnlib:2:16",
        "variable index of 4500 digits is too long (at most 18)",
    )


def _instances(acas: tuple[list, Path], tmp_path: Path, radii: list[float], bad: bool) -> None:
    """instances.csv in `tmp_path`: the ACAS-shaped net with a robustness property per radius
    around one centre (the first unsat, a large one sat), then (`bad`) a malformed property."""
    layers, net = acas
    centre = np.full(5, 0.2)
    label = int(np.argmax(_numpy_net(layers, centre)))
    rows = []
    for i, radius in enumerate(radii):
        (tmp_path / f"p{i}.vnnlib").write_text(
            robustness_property(centre - radius, centre + radius, label, 5)
        )
        rows.append(f"{net},p{i}.vnnlib,{LIMIT:g}")
    if bad:
        (tmp_path / "bad.vnnlib").write_text("(assert")
        rows.append(f"{net},bad.vnnlib,{LIMIT:g}")
    (tmp_path / "instances.csv").write_text("\n".join(rows) + "\n")


def test_instances_csv_in_parallel(acas, tmp_path: Path) -> None:
    _instances(acas, tmp_path, [0.01, 0.2, 0.02], bad=True)
    for workers in ("1", "2"):
        out = tmp_path / f"results{workers}.csv"
        done = subprocess.run(
            [sys.executable, "-m", "tlc.tools.verify", "--instances",
             str(tmp_path / "instances.csv"), "--workers", workers, "--results", str(out)],
            capture_output=True, text=True, cwd=tmp_path,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        results = [row[2] for row in csv.reader(out.read_text().splitlines())]
        assert results[:3] == ["unsat", "sat", "unsat"]
        assert results[3].startswith("error: ") and "unexpected end of file" in results[3]
        assert "[4/4]" in done.stderr or "4/4" in done.stderr


def test_instances_csv_errors(tmp_path: Path) -> None:
    (tmp_path / "i.csv").write_text("a.onnx,b.vnnlib\n")
    done = subprocess.run(
        [sys.executable, "-m", "tlc.tools.verify", "--instances", str(tmp_path / "i.csv")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.startswith(f"{tmp_path / 'i.csv'}:1:1: error: expected 3 columns")


def _blocks(text: str) -> list[str]:
    parts = text.split("```")
    return [parts[i] for i in range(1, len(parts), 2)]


def test_ray_option_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    csv_path = tmp_path / "i.csv"
    csv_path.write_text("")
    assert main(["--instances", str(csv_path), "--ray", "auto", "--workers", "2"]) == 1
    assert "error: --ray runs on the cluster's workers: no --workers" in capsys.readouterr().err
    assert main(["a.tlir", "p.vnnlib", "--ray", "auto"]) == 1
    assert "error: --ray runs --instances FILE.csv" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    assert main(["--instances", str(csv_path), "--ray", "auto"]) == 1
    err = capsys.readouterr().err
    assert "error: --ray needs Ray, which is not installed (pip install 'tlc[ray]')" in err

    class Unreachable:  # a Ray whose cluster cannot be reached
        @staticmethod
        def init(**_: object) -> None:
            raise ConnectionError("no GCS at 10.0.0.1:6379")

    monkeypatch.setitem(sys.modules, "ray", Unreachable)
    assert main(["--instances", str(csv_path), "--ray", "10.0.0.1:6379"]) == 1
    err = capsys.readouterr().err
    assert "error: --ray 10.0.0.1:6379: cannot connect: no GCS at 10.0.0.1:6379" in err


class RecordingRay:
    """Ray's task interface as `tlc-verify --ray` uses it (`init`, `remote`, `wait`, `get`,
    `shutdown`), run in this process: a task runs when it is submitted, but `wait` hands the
    results back last-submitted first, as a cluster may finish them, so the rows must be put
    back in csv order by their index. Each task's function and arguments are pickled, as Ray
    must to ship them to a worker."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.results: dict[object, object] = {}

    def init(self, address: str, **options: object) -> None:
        self.calls.append(f"init {address}")

    def remote(self, function):  # noqa: ANN001, ANN201
        ray = self

        class Task:
            @staticmethod
            def remote(*args: object) -> object:
                shipped = pickle.loads(pickle.dumps((function, args)))
                ref = object()
                ray.results[ref] = shipped[0](*shipped[1])
                ray.calls.append("submit")
                return ref

        return Task

    def wait(self, refs: list[object], num_returns: int) -> tuple[list[object], list[object]]:
        assert num_returns == 1 and len(set(map(id, refs))) == len(refs)
        return refs[-1:], refs[:-1]

    def get(self, ref: object) -> object:
        self.calls.append("get")
        return self.results.pop(ref)

    def shutdown(self) -> None:
        self.calls.append("shutdown")


def test_instances_as_ray_tasks(
    acas, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:  # noqa: ANN001
    """--ray's contract with a cluster, without one: every row one task, results back in csv
    order whatever order they finish in, the connection closed. The same run on a real local
    cluster is the next test, collected when Ray is installed."""
    _instances(acas, tmp_path, [0.01, 0.2], bad=True)
    ray = RecordingRay()
    monkeypatch.setitem(sys.modules, "ray", ray)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "results.csv"
    args = ["--instances", "instances.csv", "--ray", "10.0.0.1:6379", "--results", str(out)]
    assert main(args) == 0
    results = [row[2] for row in csv.reader(out.read_text().splitlines())]
    assert results[:2] == ["unsat", "sat"]
    assert results[2].startswith("error: ") and "unexpected end of file" in results[2]
    assert ray.calls == ["init 10.0.0.1:6379", *["submit"] * 3, *["get"] * 3, "shutdown"]
    assert "instances: 3/3 in " in capsys.readouterr().err


@pytest.mark.needs("ray", "Ray", "tlc[ray]")
def test_instances_on_a_local_ray_cluster(acas, tmp_path: Path) -> None:  # noqa: ANN001
    import ray

    _instances(acas, tmp_path, [0.01, 0.2], bad=False)
    context = ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    try:
        out = tmp_path / "results.csv"
        done = subprocess.run(
            [sys.executable, "-m", "tlc.tools.verify", "--instances",
             str(tmp_path / "instances.csv"), "--ray", context.address_info["address"],
             "--results", str(out)],
            capture_output=True, text=True, cwd=tmp_path, timeout=300,
        )  # fmt: skip
    finally:
        ray.shutdown()
    assert done.returncode == 0, done.stderr
    assert [row[2] for row in csv.reader(out.read_text().splitlines())] == ["unsat", "sat"]
    assert "instances: 2/2 in " in done.stderr
