// A node whose metadata the MLIR form leaves out is reported when the document is loaded, so
// printing it back as .tlir (no passes at all) is a located error with exit 1, not a crash.
// (No %roundtrip here: the .tlir form cannot express a node without its metadata.)
// RUN: not tlc-opt %s 2>&1 | filecheck %s
// RUN: not tlc-opt %s --emit listing 2>&1 | filecheck %s

"tl.graph"() ({
  %0 = "tl.input"() {id = 0 : i64} : () -> !tl.tensor<[2, 3]>
  %1 = "tl.softmax"(%0) {id = 1 : i64} : (!tl.tensor<[2, 3]>) -> !tl.tensor<[2, 3]>
  "tl.output"(%1) : (!tl.tensor<[2, 3]>) -> ()
}) {sym_name = "g"} : () -> ()

// CHECK: mlir_missing_metadata.mlir:9:3: error: IR graph: node 1: softmax: missing metadata field 'axis'
// CHECK-NEXT: %1 = "tl.softmax"(%0) {id = 1 : i64} : (!tl.tensor<[2, 3]>) -> !tl.tensor<[2, 3]>
// CHECK-NEXT: ^
