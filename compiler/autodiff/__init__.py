"""`tlc.autodiff`: forward (JVP) and reverse (VJP) derivatives of tl graphs.

- `rules`: the JVP and VJP tables keyed by op class, and `NON_DIFFERENTIABLE` (op -> reason).
- `emitter`: the vocabulary VJP rules are written in, evaluated eagerly (numpy, through the
  reference rules) or emitted as tl nodes (gradient graphs), so both agree by construction.
- `modes`: `jvp` and `vjp` over a graph, payload and input.
- `backward_reference`: the reference semantics of the backward ops (`tlc.dialect.backward_ops`).

The public entry points are `tlc.jvp`, `tlc.vjp` and the `grad` pass (docs/autodiff.md).
"""
