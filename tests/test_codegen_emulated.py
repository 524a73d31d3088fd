"""Libraries on CPUs this machine is not: a C program (tests/c/run_library.c) runs them under
qemu's user-mode emulator with another CPU model's CPUID (`qemu-x86_64 -cpu EPYC-Milan`: an
AMD Zen 3, AVX2 without AVX-512; `Nehalem`: SSE4.2 only; `core2duo`: SSSE3, below x86-64-v2;
`qemu64`, qemu's default model: SSE3).

What it shows that a test on the build machine cannot: the default library picks its variant by
the CPU it runs on (on Zen 3 the x86-64-v3 code, on Nehalem the v2 code, below v2 the baseline
x86-64 code) and computes, bit for
bit, what the library built for that level alone computes natively; a library built for one CPU
(`--target-cpu znver4`) on a CPU without its features returns TLC_ERR_UNSUPPORTED_CPU, its check
names the level it lacks, and it writes nothing; `tlc.load`, itself run under the emulated Zen 3,
refuses that library with its message and runs the default one. qemu's TCG emulates AVX2 and
FMA (not AVX-512), so each variant runs its real instructions. Skipped where qemu-x86_64 is
not installed (`.ci/run` installs Debian's qemu-user).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from test_codegen_targets import needs_cc, needs_x86, runnable

import tlc
from tlc.codegen.shared_lib import build_library
from tlc.codegen.target import Target

torch = pytest.importorskip("torch")

QEMU = shutil.which("qemu-x86_64")
needs_qemu = pytest.mark.skipif(QEMU is None, reason="needs qemu-x86_64 (Debian's qemu-user)")
pytestmark = [needs_x86, needs_cc]
DRIVER = Path(__file__).parent / "c" / "run_library.c"
SYMBOL = "tlc_net"
#: Each emulated CPU model and the variant the default library must pick on it.
CPUS = {"EPYC-Milan": "x86-64-v3", "Nehalem": "x86-64-v2", "core2duo": "x86-64", "qemu64": "x86-64"}


def network() -> tuple[torch.nn.Module, torch.Tensor]:
    """Kernels of every family at shapes with edges: a 3x3 convolution with padding and a batch
    norm, a residual add, a max pool, a strided depthwise convolution, a 1x1 convolution, an
    average pool and a linear layer, at batch 2."""

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = torch.nn.Conv2d(3, 24, 3, padding=1)
            self.norm = torch.nn.BatchNorm2d(24)
            self.body = torch.nn.Conv2d(24, 24, 3, padding=1)
            self.depthwise = torch.nn.Conv2d(24, 24, 3, stride=2, padding=1, groups=24)
            self.pointwise = torch.nn.Conv2d(24, 40, 1)
            self.head = torch.nn.Linear(40, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.relu(self.norm(self.stem(x)))
            y = torch.relu(self.body(y) + y)
            y = torch.nn.functional.max_pool2d(y, 2)
            y = torch.relu(self.pointwise(self.depthwise(y)))
            return self.head(torch.nn.functional.adaptive_avg_pool2d(y, 1).flatten(1))

    torch.manual_seed(0)
    net = Net().eval()
    with torch.no_grad():  # batch statistics that are not the identity
        net.norm.running_mean.uniform_(-0.5, 0.5)
        net.norm.running_var.uniform_(0.5, 2.0)
    return net, torch.randn(2, 3, 23, 29)


def build(tmp: Path, cc: str, libraries: dict[str, Target | None]) -> Path:
    """In `tmp`: the driver built by `cc`, the network's input and PyTorch's output, and
    `lib<name>.so` for each of `libraries` (None: the default library)."""
    subprocess.run([cc, "-O1", "-Wall", "-Werror", "-o", tmp / "run_library", DRIVER, "-ldl"],
                   check=True)  # fmt: skip
    net, x = network()
    traced = tlc.from_torch(net, x)
    for name, target in libraries.items():
        path = str(tmp / f"lib{name}.so")
        build_library([(traced.graph, traced.payload)], path, np.float32, target=target)
    x.numpy().astype(np.float32).tofile(tmp / "x.bin")
    with torch.no_grad():
        np.save(tmp / "expected.npy", net(x).numpy())
    return tmp


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`libdefault.so` (every level) and one library per single target."""
    singles = {name: Target(name) for name in ["x86-64-v3", "x86-64-v2", "x86-64", "znver4"]}
    return build(tmp_path_factory.mktemp("emulated"), "cc", {"default": None, **singles})


def run(tmp: Path, library: str, cpu: str | None, threads: int = 2,
        emulator: tuple[str, ...] = ()) -> tuple[str, np.ndarray]:  # fmt: skip
    """The driver's line and the output of `library` run on `cpu` (None: this machine) by
    `emulator` (default: qemu-x86_64)."""
    out = tmp / f"out-{library}-{cpu}-{threads}.bin"
    command = [str(tmp / "run_library"), str(tmp / f"lib{library}.so"), SYMBOL, str(threads),
               str(tmp / "x.bin"), str(out)]  # fmt: skip
    if cpu is not None:
        command = [*(emulator or (str(QEMU),)), "-cpu", cpu, *command]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done
    return done.stdout.strip(), np.fromfile(out, np.float32)


@needs_qemu
@pytest.mark.parametrize("cpu", CPUS)
def test_the_default_library_runs_the_variant_of_the_cpu_it_runs_on(built: Path, cpu: str) -> None:
    line, got = run(built, "default", cpu)
    variant = CPUS[cpu]
    assert line == f"check 0 missing - variant {variant} status 0"
    runnable(variant)
    _, alone = run(built, variant, None)  # that level's library alone, on this machine
    assert got.tobytes() == alone.tobytes()
    close_to_torch(built, got)


@needs_qemu
def test_the_bits_are_the_same_on_one_and_two_emulated_threads(built: Path) -> None:
    _, one = run(built, "default", "EPYC-Milan", threads=1)
    _, two = run(built, "default", "EPYC-Milan", threads=2)
    assert one.tobytes() == two.tobytes()


@needs_qemu
@pytest.mark.parametrize("cpu", CPUS)
def test_a_znver4_library_refuses_a_cpu_without_avx512(built: Path, cpu: str) -> None:
    line, got = run(built, "znver4", cpu)
    assert line == "check 4 missing x86-64-v4 variant - status 4"
    assert not got.any()


#: What the test below runs under the emulated Zen 3: tlc.load's answer for the znver4 library,
#: then the default library's output through tlc.load (which first checks the metadata against
#: the library's queries).
LOAD_SCRIPT = """
import sys
import numpy as np
import tlc
from tlc.core.diagnostics import DiagnosticError
tmp = sys.argv[1]
try:
    tlc.load(tmp + "/libznver4.so")
except DiagnosticError as exc:
    print(exc)
x = np.fromfile(tmp + "/x.bin", np.float32).reshape(2, 3, 23, 29)
tlc.load(tmp + "/libdefault.so")(x).tofile(tmp + "/out-load.bin")
"""


@needs_qemu
def test_tlc_load_refuses_a_znver4_library_on_zen3_and_runs_the_default_one(built: Path) -> None:
    done = subprocess.run(
        [str(QEMU), "-cpu", "EPYC-Milan", sys.executable, "-c", LOAD_SCRIPT, str(built)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == (
        f"cannot load '{built}/libznver4.so': tlc_net was built for CPU features this machine "
        "lacks (x86-64-v4); rebuild without --target-cpu/--target-features for a library that "
        "runs on any x86-64 CPU\n"
    )
    runnable("x86-64-v3")
    _, alone = run(built, "x86-64-v3", None)
    assert np.fromfile(built / "out-load.bin", np.float32).tobytes() == alone.tobytes()


# AArch64: libraries linked by the cross compiler, run by qemu-aarch64 on its libc.
QEMU_ARM = shutil.which("qemu-aarch64")
CROSS_CC = shutil.which("aarch64-linux-gnu-gcc")
needs_arm = pytest.mark.skipif(
    QEMU_ARM is None or CROSS_CC is None,
    reason="needs qemu-aarch64 (Debian's qemu-user) and aarch64-linux-gnu-gcc "
    "(gcc-aarch64-linux-gnu, libc6-dev-arm64-cross)",
)
ARM = Target("generic", "", "aarch64-linux-gnu")


@pytest.fixture(scope="module")
def built_arm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The network's AArch64 libraries: `libgeneric.so` (any AArch64 CPU: NEON is part of the
    architecture) and `libsve.so` (+sve, which the library checks)."""
    libraries = {"generic": ARM, "sve": Target("generic", "+sve", ARM.triple)}
    return build(tmp_path_factory.mktemp("emulated_arm"), str(CROSS_CC), libraries)


@cache
def arm_sysroot() -> str:
    """Where the cross compiler's AArch64 libc lies (qemu-aarch64's -L), asked once."""
    libc = subprocess.run([str(CROSS_CC), "-print-file-name=libc.so.6"], capture_output=True,
                          text=True, check=True).stdout.strip()  # fmt: skip
    return str(Path(libc).resolve().parent.parent)


def run_arm(tmp: Path, library: str, cpu: str, threads: int = 2) -> tuple[str, np.ndarray]:
    """`run` on the emulated AArch64 `cpu`, whose libc is the cross compiler's."""
    return run(tmp, library, cpu, threads, emulator=(str(QEMU_ARM), "-L", arm_sysroot()))


def close_to_torch(tmp: Path, got: np.ndarray) -> None:
    expected = np.load(tmp / "expected.npy").ravel()
    # float32 against PyTorch's float32: a few ulp of the largest output per layer
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5 * np.abs(expected).max())


@needs_arm
def test_an_aarch64_library_runs_on_an_emulated_cortex_a72(built_arm: Path) -> None:
    line, got = run_arm(built_arm, "generic", "cortex-a72")
    assert line == "check 0 missing - variant generic (aarch64-linux-gnu) status 0"
    close_to_torch(built_arm, got)
    _, one = run_arm(built_arm, "generic", "cortex-a72", threads=1)
    assert one.tobytes() == got.tobytes()


@needs_arm
def test_an_aarch64_sve_library_checks_the_cpu_for_sve(built_arm: Path) -> None:
    line, got = run_arm(built_arm, "sve", "cortex-a72")
    assert line == "check 4 missing sve variant - status 4"
    assert not got.any()
    line, got = run_arm(built_arm, "sve", "max")  # qemu's every feature, SVE among them
    assert line == "check 0 missing - variant generic +sve (aarch64-linux-gnu) status 0"
    close_to_torch(built_arm, got)
