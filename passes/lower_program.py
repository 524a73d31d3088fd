"""lower-program: each `tl.program` becomes a `tl.graph` of the same name plus its `tl.params`.

The program is run with the IR-building instance of the operations interface
(`tlc.semantics.program_run.lower_program`): every call, nested ones included, becomes one node in
evaluation order (post-order, so parents come first and ids are topological), a parameter read
as a value becomes a `const` node, and each node's parameters are recorded by name in the
`tl.params @name` binding beside the graph. Nodes keep the location of the call they come from,
so diagnostics on the graph point at the program text. Contract: no `tl.program` remains; a
program that cannot be lowered is reported at its call and the module is left unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from tlc.core.diagnostics import error
from tlc.dialect.ops import GraphOp
from tlc.dialect.program_ops import ParamsOp, ProgramOp
from tlc.semantics.program_run import lower_program


@dataclass(frozen=True)
class LowerProgramPass(ModulePass):
    """Replace every `tl.program` by its graph and parameter binding."""

    name = "lower-program"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        programs = [p for p in op.ops if isinstance(p, ProgramOp)]
        taken = {g.graph_name for g in op.ops if isinstance(g, GraphOp | ParamsOp)}
        for program in programs:
            if program.graph_name in taken:
                raise error(
                    f"cannot lower program @{program.graph_name}: the module already has a "
                    f"graph or parameter binding of that name",
                    program,
                )
        lowered = [(p, lower_program(p)) for p in programs]
        block = op.body.block
        for program, result in lowered:
            block.insert_ops_before([result.graph, result.params], program)
            block.erase_op(program)
        assert not any(isinstance(p, ProgramOp) for p in op.ops), "programs remain"
