"""The host target machine and the optimisation pipeline every compiled module goes through.

One place decides how tlc turns LLVM IR into machine code, so the JIT and shared libraries run
the same code: the host CPU (`get_host_cpu_name()`, znver5 with AVX-512 here) with its features,
position-independent code (required for shared objects, harmless for the JIT), and LLVM's
new-pass-manager O3 pipeline. Without that pipeline loops stay scalar: the target machine's
`opt=3` only affects instruction selection.
"""

from __future__ import annotations

from functools import cache

import llvmlite.binding as llvm


@cache
def _initialised() -> bool:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    llvm.initialize_native_asmparser()
    return True


@cache
def host_target_machine() -> llvm.TargetMachine:
    """A PIC target machine for this CPU, at codegen level 3."""
    _initialised()
    target = llvm.Target.from_default_triple()
    return target.create_target_machine(
        cpu=llvm.get_host_cpu_name(),
        features=llvm.get_host_cpu_features().flatten(),
        opt=3,
        reloc="pic",
        codemodel="default",
    )


def parse_ir(text: str) -> llvm.ModuleRef:
    """Parse and verify textual LLVM IR for the host target."""
    tm = host_target_machine()
    module = llvm.parse_assembly(text)
    module.triple = tm.triple
    module.data_layout = str(tm.target_data)
    module.verify()
    return module


def optimize(module: llvm.ModuleRef) -> None:
    """Run the O3 module pipeline (inlining, loop and SLP vectorisation, unrolling) in place."""
    tm = host_target_machine()
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pto.loop_vectorization = True
    pto.slp_vectorization = True
    pto.loop_unrolling = True
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(module, pb)


def compile_ir(text: str) -> llvm.ModuleRef:
    """Parsed, verified and optimised module, ready for `emit_object` or assembly."""
    module = parse_ir(text)
    optimize(module)
    return module


def emit_object(module: llvm.ModuleRef) -> bytes:
    return host_target_machine().emit_object(module)


def emit_assembly(module: llvm.ModuleRef) -> str:
    return host_target_machine().emit_assembly(module)
