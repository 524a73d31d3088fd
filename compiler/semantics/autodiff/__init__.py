"""`tlc.semantics.autodiff`: forward (JVP) and reverse (VJP) derivative rules and modes."""
