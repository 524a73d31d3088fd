// An MLIR-form string literal left open at the end of its line is a located error (exit 1).
// xDSL 0.75's parser loops forever on this input, so tlc rejects it before xDSL sees it.
// (No %roundtrip: the document does not parse.)
// RUN: not tlc-opt %s 2>&1 | filecheck %s
// CHECK: mlir_unterminated_string.mlir:10:8: error: unterminated string literal
// CHECK-NEXT: "tl.input{id = 0 : i64} : () -> !tl.tensor<[4]>
// CHECK-NEXT: {{^       \^$}}

"builtin.module"() ({
  %0 = "tl.input{id = 0 : i64} : () -> !tl.tensor<[4]>
