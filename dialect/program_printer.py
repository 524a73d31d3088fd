""".tlir text of programs and parameter bindings; the inverse of `program_parser`.

An unnamed call is printed inline inside its user, so `%y = tanh(sum(%o))` reads back as it was
written; named calls print as `let`s in block order.
"""

from __future__ import annotations

from xdsl.ir import SSAValue

from tlc.dialect.program_ops import CallOp, ParamsOp, ProgramOp, fmt_field
from tlc.dialect.shapes import Shape, fmt_shape


def _decls(decls: list[tuple[str, Shape]]) -> str:
    return ", ".join(f"%{name}: {fmt_shape(shape)}" for name, shape in decls)


def program_tlir(program: ProgramOp) -> str:
    args = program.body.block.args
    names = dict(zip(args, program.names, strict=True))
    decls = [(n, program.shape_of_arg(a)) for a, n in zip(args, program.names, strict=True)]
    head = f"tl.program @{program.graph_name}({_decls(decls[:1])})"
    if len(decls) > 1:
        head += f" params({_decls(decls[1:])})"
    lines = [head + " {"]

    def ref(value: SSAValue) -> str:
        owner = value.owner
        if isinstance(owner, CallOp) and owner.let_name is None:
            return expr(owner)
        if isinstance(owner, CallOp):
            return f"%{owner.let_name}"
        return f"%{names[value]}"

    def expr(call: CallOp) -> str:
        text = f"{call.callee_name}(" + ", ".join(ref(a) for a in call.args) + ")"
        fields = call.keyword_args()
        if fields:
            text += " {" + ", ".join(f"{k} = {fmt_field(v)}" for k, v in fields.items()) + "}"
        if call.declared_shape is not None:
            text += f" : {fmt_shape(call.declared_shape)}"
        return text

    lines.extend(f"  %{c.let_name} = {expr(c)}" for c in program.calls if c.let_name is not None)
    ret = program.ret
    if ret is not None:
        lines.append(f"  return {ref(ret.value)}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def params_tlir(params: ParamsOp) -> str:
    lines = [f"tl.params @{params.graph_name}({_decls(list(params.declared.items()))}) {{"]
    for bind in params.binds:
        fields = ", ".join(f"{k} = %{v}" for k, v in bind.field_params().items())
        lines.append(f"  %{bind.node_id} = {bind.kind.data} {{{fields}}}")
    lines.append("}")
    return "\n".join(lines) + "\n"
