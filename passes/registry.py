"""Pass names -> pass classes, imported lazily, and pipeline parsing with xDSL's parser.

Pipelines use xdsl-opt's syntax (`a,b{opt=1 list=1,2}`); MLIR's
`builtin.module(a,b{opt=1})` wrapper is accepted too.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import fields
from typing import TYPE_CHECKING

from tlc.core.diagnostics import DiagnosticError, did_you_mean

if TYPE_CHECKING:  # imported by the passes themselves: `tlc-opt FILE` runs none (start-up time)
    from xdsl.passes import ModulePass


def _verify_structure() -> type[ModulePass]:
    from tlc.passes.verify_structure import VerifyStructurePass

    return VerifyStructurePass


def _infer_shapes() -> type[ModulePass]:
    from tlc.passes.infer_shapes import InferShapesPass

    return InferShapesPass


def _select_kernels() -> type[ModulePass]:
    from tlc.passes.select_kernels import SelectKernelsPass

    return SelectKernelsPass


def _lower_program() -> type[ModulePass]:
    from tlc.passes.lower_program import LowerProgramPass

    return LowerProgramPass


def _decompose() -> type[ModulePass]:
    from tlc.passes.decompose import DecomposePass

    return DecomposePass


def _fold_batch_norm() -> type[ModulePass]:
    from tlc.passes.fold_batch_norm import FoldBatchNormPass

    return FoldBatchNormPass


def _grad() -> type[ModulePass]:
    from tlc.passes.grad import GradPass

    return GradPass


PASSES: dict[str, Callable[[], type[ModulePass]]] = {
    "decompose": _decompose,
    "fold-batch-norm": _fold_batch_norm,
    "grad": _grad,
    "verify-structure": _verify_structure,
    "infer-shapes": _infer_shapes,
    "select-kernels": _select_kernels,
    "lower-program": _lower_program,
}


def pass_class(name: str) -> type[ModulePass]:
    factory = PASSES.get(name)
    if factory is None:
        hint = did_you_mean(name, PASSES)
        raise DiagnosticError.simple(
            f"'{name}' does not refer to a registered pass or pass pipeline{hint}"
        )
    return factory()


_COLON_VALUE = re.compile(r"=([A-Za-z0-9_.-]+:[A-Za-z0-9_.:-]*)")


def build_pipeline(text: str) -> list[ModulePass]:
    """Parse a pipeline string into configured pass instances."""
    from xdsl.utils.arg_spec import parse_pipeline
    from xdsl.utils.exceptions import ArgSpecParseError

    text = text.strip()
    if text.startswith("builtin.module(") and text.endswith(")"):
        text = text[len("builtin.module(") : -1]
    # MLIR reads `provider=prefer:llvm`; xDSL's lexer needs a colon inside quotes.
    text = _COLON_VALUE.sub(r'="\1"', text)
    try:
        specs = list(parse_pipeline(text))
    except ArgSpecParseError as exc:
        raise DiagnosticError.simple(f"invalid pass pipeline '{text}': {exc}") from None
    passes = []
    for spec in specs:
        cls = pass_class(spec.name)
        known = [f.name.replace("_", "-") for f in fields(cls)]
        for option in spec.parameters:
            if option.replace("_", "-") not in known:
                listed = ", ".join(known) or "none"
                raise DiagnosticError.simple(
                    f"pass '{spec.name}' has no option '{option}' (options: {listed})"
                )
        try:
            passes.append(cls.from_pass_spec(spec))
        except Exception as exc:  # xDSL reports bad option values with assorted exception types
            raise DiagnosticError.simple(f"invalid options for pass '{spec.name}': {exc}") from None
    return passes
