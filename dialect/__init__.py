"""`tlc.dialect`: the `tl` dialect (ops, types, metadata), the .tlir grammar, parser, printers."""

# Load order: the op kinds first, so `tlc.dialect.backward_ops` can build on their families.
from tlc.dialect import ops as ops  # noqa: E402
