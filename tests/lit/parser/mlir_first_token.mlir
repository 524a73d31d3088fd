// xDSL's parser lexes the first token when it is made: an invalid escape there was a traceback,
// as was a form feed in a string (xDSL's strings cannot hold one; found by the fuzzer).
// (No %roundtrip: the documents do not parse.)
// RUN: not tlc-opt %s 2>&1 | filecheck %s --check-prefix=ESCAPE
// ESCAPE: mlir_first_token.mlir:[[# @LINE + 5]]:1: error: End of file reached before closing string literal.
// RUN: python -c "open(r'%t.mlir', 'w').write('\"builtin.m\fdule\"() ({\n}) : () -> ()\n')"
// RUN: not tlc-opt %t.mlir 2>&1 | filecheck %s --check-prefix=FEED
// FEED: mlir_first_token.mlir.tmp.mlir:1:1: error: unterminated string literal

"a\q"() : () -> ()
