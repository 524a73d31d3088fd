"""`tlc.api`: the glue behind the public Python API (`tlc.run`, `tlc.ibp`, ...)."""
