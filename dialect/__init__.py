"""`tlc.dialect`: the `tl` dialect (ops, types, metadata), the .tlir grammar, parser, printers."""
