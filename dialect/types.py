"""The `tl` tensor types: a node's declared output shape, or `unshaped` where the text omits it.

Shapes carry no scalar type: the scalar context (f64, f32, interval) is chosen when the graph runs.
Generic form: `!tl.tensor<[2, 3]>`, `!tl.tensor<[]>` (a scalar), `!tl.tensor<[?, 784]>` (a
leading extent that is the batch size, `[N, 784]` in .tlir) and `!tl.unshaped`.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

from xdsl.dialects.builtin import ArrayAttr, IntAttr
from xdsl.ir import Attribute, ParametrizedAttribute, TypeAttribute
from xdsl.irdl import irdl_attr_definition, param_def
from xdsl.parser import AttrParser
from xdsl.printer import Printer

from tlc.dialect.shapes import BATCH, Shape


@irdl_attr_definition
class TensorType(ParametrizedAttribute, TypeAttribute):
    """A dtype-free tensor of a known shape."""

    name = "tl.tensor"
    dims: ArrayAttr[IntAttr] = param_def()

    def __init__(self, shape: Sequence[int]):
        super().__init__(ArrayAttr([IntAttr(d) for d in shape]))

    @property
    def shape(self) -> Shape:
        """The extents, computed once per type object (one is shared by every node of a shape,
        and the passes read it several times per node). The cache is not a parameter: equality,
        hashing and printing see only `dims`."""
        shape = self.__dict__.get("_shape")
        if shape is None:
            shape = tuple([d.data for d in self.dims.data])
            object.__setattr__(self, "_shape", shape)
        return shape

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        parser.parse_punctuation("<")
        dims = parser.parse_comma_separated_list(
            parser.Delimiter.SQUARE, lambda: _parse_extent(parser)
        )
        parser.parse_punctuation(">")
        return (ArrayAttr([IntAttr(d) for d in dims]),)

    def print_parameters(self, printer: Printer) -> None:
        dims = ", ".join("?" if d == BATCH else str(d) for d in self.shape)
        printer.print_string(f"<[{dims}]>")


def _parse_extent(parser: AttrParser) -> int:
    """An extent: 0 <= d < 2^63, as the .tlir grammar allows (a negative extent used to pass
    verification and reach C headers as a negative size), or `?`: the batch size `N`."""
    if parser.parse_optional_punctuation("?") is not None:
        return BATCH
    start = parser.pos
    value = parser.parse_integer()
    if not 0 <= value < 2**63:
        parser.raise_error(f"tensor extent must be in [0, 2^63), got {value}", start, parser.pos)
    return value


@irdl_attr_definition
class UnshapedType(ParametrizedAttribute, TypeAttribute):
    """A node whose output shape was left out of the text; infer-shapes replaces it."""

    name = "tl.unshaped"


def shape_of_type(t: Attribute) -> Shape | None:
    """The declared shape of a node result, or None where it is not declared."""
    return t.shape if isinstance(t, TensorType) else None


@cache
def type_for(shape: Shape | None) -> TensorType | UnshapedType:
    """The result type of a node (attributes are immutable values, so one per shape is shared;
    building and verifying a new one per node was a tenth of the parse time)."""
    return UnshapedType() if shape is None else TensorType(shape)
