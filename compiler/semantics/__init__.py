"""`tlc.semantics`: what tl ops mean: reference values, intervals, derivatives, kernels."""
