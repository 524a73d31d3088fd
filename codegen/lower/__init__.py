"""tl -> LLVM IR: one lowering rule per op kind, in one rule table, with a module per family
(`rules`: the table; `elementwise`, `layout`, `reductions`, `linear`, `windows`,
`convolution`, `pooling`, `decomposition`: the rules).

`LOWERINGS[OpClass]` is a `Lowering`: `emit(k, step)` writes the node's value into `step.out`
(or, for a view, returns the buffer it aliases), and `params` names the payload fields the node
reads with their shapes and defaults, so a library built with `--runtime-payload` knows its
parameter layout without the values. Rules are written here for the ops that need code of their
own; an op without one that states a decomposition (`NodeOp.decompose`, such as leaky_relu's
`max_elem(x, s*x)`) is lowered through it: its node's kernel runs the lowerings of the ops the
decomposition emits, in order, on scratch storage (`decomposition_lowering`). Ops the table
refuses (`LOWERINGS.unsupported`) are a located error naming the op and the node when compiled,
never a fallback.

Semantics follow the reference rules (`tlc.semantics.reference`) operation for operation.
Reductions (sum, mean, dot products, softmax denominators) are reassociated so they vectorise:
the llvm capsules' numerical policy is "implementationDefined". Elementwise maps run over the
flat buffer; layout ops compute a source offset per output index; convolution and pooling loop
over the kernel's taps (never unrolled by the lowering, so the code's size does not depend on
the kernel's extent), each tap's loop over output positions bounded so padding needs no test.
"""

# Importing the rule modules fills LOWERINGS; every op kind left without a rule that states a
# decomposition then gets the decomposition's rule.
from tlc.codegen.lower import (  # noqa: F401  (their rules register on import)
    convolution,
    elementwise,
    layout,
    linear,
    pooling,
    reductions,
)
from tlc.codegen.lower.decomposition import decomposition_lowering
from tlc.codegen.lower.elementwise import EPILOGUES, IN_PLACE, MAPS
from tlc.codegen.lower.rules import LOWERINGS, Lowering, ParamSpec, Step
from tlc.dialect.registry import NODE_OPS

LOWERINGS.derive(NODE_OPS, decomposition_lowering)

__all__ = ["EPILOGUES", "IN_PLACE", "LOWERINGS", "MAPS", "Lowering", "ParamSpec", "Step"]
