"""tlc: an MLIR-style compiler for neural-network graphs."""
