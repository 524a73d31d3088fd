"""The textual program form: `tl.program`, its calls and `return`, and the `tl.params` binding.

A program is the seed's `Proved.ForwardProgram`: a first-order let-chain over one input and
named parameters. In the IR it is a `tl.program @name` op whose single block takes the input and
then the parameters as block arguments (their shapes as `!tl.tensor` types, their names in
`arg_names`), holds one `tl.call` per operation applied (a `let` names its call with `binding`;
a nested expression is an unnamed call placed before its user) and ends with `tl.return`.
A call's `callee` is an op tag and its `fields` are the keyword arguments of the operations
interface (`tlc.semantics.program.Ops`), so a program means what the same calls mean in Python.

`tl.params @name(...) { %1 = linear {weight = %W1, bias = %b1} }` is what `lower-program` leaves
beside the graph it produces: which payload field of which node each named parameter fills, so a
parameter file keyed by name runs the lowered graph (`payload_from_params`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from xdsl.dialects.builtin import (
    ArrayAttr,
    DenseArrayBase,
    DictionaryAttr,
    FloatAttr,
    IntegerAttr,
    IntegerType,
    StringAttr,
    SymbolNameConstraint,
    f64,
    i1,
    i64,
)
from xdsl.ir import Attribute, Block, Dialect, Operation, Region, SSAValue
from xdsl.irdl import (
    IRDLOperation,
    attr_def,
    irdl_op_definition,
    operand_def,
    opt_attr_def,
    region_def,
    result_def,
    traits_def,
    var_operand_def,
)
from xdsl.traits import IsolatedFromAbove, NoTerminator, SymbolOpInterface
from xdsl.utils.exceptions import VerifyException

from tlc.dialect.shapes import Shape
from tlc.dialect.types import TensorType, shape_of_type, type_for

#: A field value as written in text and passed to the operations interface.
FieldValue = int | float | bool | str | list[int] | list[bool]


def field_to_attr(value: FieldValue) -> Attribute:
    """The attribute storing a call's keyword argument (raises ValueError if unsupported)."""
    if isinstance(value, bool):
        return IntegerAttr(int(value), i1)
    if isinstance(value, int):
        return IntegerAttr(value, i64)
    if isinstance(value, float):
        return FloatAttr(value, f64)
    if isinstance(value, str):
        return StringAttr(value)
    if isinstance(value, list | tuple):
        items = list(value)
        if all(isinstance(v, bool) for v in items) and items:
            return DenseArrayBase.from_list(i1, [int(v) for v in items])
        if all(isinstance(v, int) and not isinstance(v, bool) for v in items):
            return DenseArrayBase.from_list(i64, items)
    raise ValueError("must be a number, a string, or a flat list of integers or of booleans")


def attr_to_field(attr: Attribute) -> FieldValue:
    """The Python value of a stored keyword argument (inverse of `field_to_attr`)."""
    if isinstance(attr, IntegerAttr):
        width = attr.type.width.data if isinstance(attr.type, IntegerType) else 64
        return bool(attr.value.data) if width == 1 else attr.value.data
    if isinstance(attr, FloatAttr):
        return attr.value.data
    if isinstance(attr, StringAttr):
        return attr.data
    if isinstance(attr, DenseArrayBase) and isinstance(attr.elt_type, IntegerType):
        values = [int(v) for v in attr.get_values()]
        return [bool(v) for v in values] if attr.elt_type.width.data == 1 else values
    raise ValueError(f"unsupported field attribute {attr}")


def fmt_field(value: FieldValue) -> str:
    """The .tlir text of a keyword argument."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(fmt_field(v) for v in value) + "]"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(value)


@irdl_op_definition
class CallOp(IRDLOperation):
    """`%h = linear(%x, %W1, %b1)`, or a nested `relu(...)`: one operation of a program.

    Operands are values (the input, earlier calls) or parameters (block arguments after the
    first); which argument positions take parameters is the interface's business. The result
    type is the shape written after `:` (`!tl.unshaped` where none was written).
    """

    name = "tl.call"
    args = var_operand_def()
    result = result_def()
    callee = attr_def(StringAttr)
    fields = attr_def(DictionaryAttr)
    binding = opt_attr_def(StringAttr)

    def __init__(
        self,
        callee: str,
        args: Sequence[SSAValue],
        fields: Mapping[str, FieldValue],
        binding: str | None,
        shape: Shape | None,
    ):
        attrs: dict[str, Attribute] = {
            "callee": StringAttr(callee),
            "fields": DictionaryAttr({k: field_to_attr(v) for k, v in fields.items()}),
        }
        if binding is not None:
            attrs["binding"] = StringAttr(binding)
        super().__init__(operands=[list(args)], result_types=[type_for(shape)], attributes=attrs)

    @property
    def callee_name(self) -> str:
        return self.callee.data

    @property
    def let_name(self) -> str | None:
        return None if self.binding is None else self.binding.data

    @property
    def declared_shape(self) -> Shape | None:
        return shape_of_type(self.result.type)

    def keyword_args(self) -> dict[str, FieldValue]:
        return {name: attr_to_field(attr) for name, attr in self.fields.data.items()}


@irdl_op_definition
class ReturnOp(IRDLOperation):
    """`return %y` — the program's result."""

    name = "tl.return"
    value = operand_def()

    def __init__(self, value: SSAValue):
        super().__init__(operands=[value])


@irdl_op_definition
class ProgramOp(IRDLOperation):
    """`tl.program @mlp(%x: [4]) params(%W1: [5, 4], ...) { lets...  return %y }`."""

    name = "tl.program"
    sym_name = attr_def(SymbolNameConstraint())
    arg_names = attr_def(ArrayAttr[StringAttr])
    body = region_def("single_block")
    traits = traits_def(SymbolOpInterface(), NoTerminator(), IsolatedFromAbove())

    def __init__(self, name: str, args: Sequence[tuple[str, Shape]], ops: Sequence[Operation]):
        block = Block(list(ops), arg_types=[TensorType(shape) for _, shape in args])
        super().__init__(
            attributes={
                "sym_name": StringAttr(name),
                "arg_names": ArrayAttr([StringAttr(n) for n, _ in args]),
            },
            regions=[Region(block)],
        )

    def verify_(self) -> None:
        args = self.body.block.args
        if len(args) != len(self.arg_names.data) or not args:
            raise VerifyException(
                f"tl.program @{self.graph_name}: {len(self.arg_names.data)} argument names for "
                f"{len(args)} block arguments (the input, then the parameters)"
            )
        if not all(isinstance(a.type, TensorType) for a in args):
            raise VerifyException(f"tl.program @{self.graph_name}: arguments must be !tl.tensor")
        # What the calls mean (shapes, parameter uses) is the operations interface's, a layer
        # above the dialect: a document's reader checks each program by lowering it
        # (`tlc.frontends.text.parse_source`), with located diagnostics at the bad call.

    @property
    def graph_name(self) -> str:
        """The symbol, which is also the name of the graph it lowers to."""
        return self.sym_name.data

    @property
    def names(self) -> list[str]:
        return [s.data for s in self.arg_names.data]

    @property
    def input(self) -> SSAValue:
        return self.body.block.args[0]

    @property
    def params(self) -> dict[str, SSAValue]:
        """Parameter name -> block argument, in declaration order."""
        return dict(zip(self.names[1:], self.body.block.args[1:], strict=True))

    def shape_of_arg(self, value: SSAValue) -> Shape:
        shape = shape_of_type(value.type)
        assert shape is not None, "program arguments always have a shape"
        return shape

    @property
    def calls(self) -> list[CallOp]:
        return [op for op in self.body.block.ops if isinstance(op, CallOp)]

    @property
    def ret(self) -> ReturnOp | None:
        return next((op for op in self.body.block.ops if isinstance(op, ReturnOp)), None)


@irdl_op_definition
class BindOp(IRDLOperation):
    """`%1 = linear {weight = %W1, bias = %b1}`: node 1's payload fields, by parameter name."""

    name = "tl.bind"
    node = attr_def(IntegerAttr)
    kind = attr_def(StringAttr)
    fields = attr_def(DictionaryAttr)

    def __init__(self, node: int, kind: str, fields: Mapping[str, str]):
        super().__init__(
            attributes={
                "node": IntegerAttr(node, 64),
                "kind": StringAttr(kind),
                "fields": DictionaryAttr({k: StringAttr(v) for k, v in fields.items()}),
            }
        )

    @property
    def node_id(self) -> int:
        return self.node.value.data

    def field_params(self) -> dict[str, str]:
        """Payload field -> parameter name."""
        return {k: v.data for k, v in self.fields.data.items() if isinstance(v, StringAttr)}


@irdl_op_definition
class ParamsOp(IRDLOperation):
    """`tl.params @mlp(%W1: [5, 4], ...) { binds... }`: the graph's payload by parameter name."""

    name = "tl.params"
    graph = attr_def(StringAttr)
    param_names = attr_def(ArrayAttr[StringAttr])
    param_types = attr_def(ArrayAttr[TensorType])
    body = region_def("single_block")
    traits = traits_def(NoTerminator(), IsolatedFromAbove())

    def __init__(self, graph: str, params: Sequence[tuple[str, Shape]], binds: Sequence[BindOp]):
        super().__init__(
            attributes={
                "graph": StringAttr(graph),
                "param_names": ArrayAttr([StringAttr(n) for n, _ in params]),
                "param_types": ArrayAttr([TensorType(s) for _, s in params]),
            },
            regions=[Region(Block(list(binds)))],
        )

    def verify_(self) -> None:
        if len(self.param_names.data) != len(self.param_types.data):
            raise VerifyException(
                f"tl.params @{self.graph_name}: {len(self.param_names.data)} names for "
                f"{len(self.param_types.data)} shapes"
            )

    @property
    def graph_name(self) -> str:
        return self.graph.data

    @property
    def declared(self) -> dict[str, Shape]:
        """Parameter name -> declared shape."""
        return {
            n.data: t.shape
            for n, t in zip(self.param_names.data, self.param_types.data, strict=True)
        }

    @property
    def binds(self) -> list[BindOp]:
        return [op for op in self.body.block.ops if isinstance(op, BindOp)]


PROGRAM_OPS = [ProgramOp, CallOp, ReturnOp, ParamsOp, BindOp]

TL_PROGRAM = Dialect("tl_program", PROGRAM_OPS, [])

__all__ = [
    "TL_PROGRAM",
    "BindOp",
    "CallOp",
    "ParamsOp",
    "ProgramOp",
    "ReturnOp",
    "attr_to_field",
    "field_to_attr",
    "fmt_field",
]
