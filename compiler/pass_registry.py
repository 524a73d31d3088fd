"""Pass names -> pass classes, imported lazily, and pipeline parsing with xDSL's parser.

Pipelines use xdsl-opt's syntax (`a,b{opt=1 list=1,2}`); MLIR's
`builtin.module(a,b{opt=1})` wrapper is accepted too.
"""

from __future__ import annotations

from collections.abc import Callable

from xdsl.passes import ModulePass
from xdsl.utils.arg_spec import parse_pipeline
from xdsl.utils.exceptions import ArgSpecParseError

from tlc.diagnostics import Diagnostic, DiagnosticError


def _verify_structure() -> type[ModulePass]:
    from tlc.passes.verify_structure import VerifyStructurePass

    return VerifyStructurePass


def _infer_shapes() -> type[ModulePass]:
    from tlc.passes.infer_shapes import InferShapesPass

    return InferShapesPass


PASSES: dict[str, Callable[[], type[ModulePass]]] = {
    "verify-structure": _verify_structure,
    "infer-shapes": _infer_shapes,
}


def pass_class(name: str) -> type[ModulePass]:
    factory = PASSES.get(name)
    if factory is None:
        raise DiagnosticError(
            Diagnostic("error", f"'{name}' does not refer to a registered pass or pass pipeline")
        )
    return factory()


def build_pipeline(text: str) -> list[ModulePass]:
    """Parse a pipeline string into configured pass instances."""
    text = text.strip()
    if text.startswith("builtin.module(") and text.endswith(")"):
        text = text[len("builtin.module(") : -1]
    try:
        specs = list(parse_pipeline(text))
    except ArgSpecParseError as exc:
        raise DiagnosticError(Diagnostic("error", f"invalid pass pipeline '{text}': {exc}")) from None
    passes = []
    for spec in specs:
        cls = pass_class(spec.name)
        try:
            passes.append(cls.from_pass_spec(spec))
        except Exception as exc:  # xDSL reports bad options with assorted exception types
            raise DiagnosticError(
                Diagnostic("error", f"invalid options for pass '{spec.name}': {exc}")
            ) from None
    return passes
