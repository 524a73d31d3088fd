// Integers the MLIR form cannot hold are located diagnostics before or instead of xDSL's
// exceptions (issue 14): an i64 value out of range, absurd integer widths (rejected before
// xDSL builds their range, which took seconds and gigabytes), negative extents.
// RUN: not tlc-opt %s --split-input-file 2>&1 | filecheck %s

"builtin.module"() ({
  "tl.graph"() ({
    %0 = "tl.input"() {id = 99999999999999999999 : i64} : () -> !tl.tensor<[4]>
    "tl.output"(%0) : (!tl.tensor<[4]>) -> ()
  }) {sym_name = "g"} : () -> ()
}) : () -> ()
// CHECK: mlir_integers.mlir:8:55: error: Integer value 99999999999999999999 is out of range for type i64

// -----
"builtin.module"() ({
  "tl.graph"() ({
    %0 = "tl.input"() {id = 0 : i99999999999} : () -> !tl.tensor<[4]>
    "tl.output"(%0) : (!tl.tensor<[4]>) -> ()
  }) {sym_name = "g"} : () -> ()
}) : () -> ()
// CHECK: mlir_integers.mlir:17:33: error: integer type 'i99999999999' is wider than 64 bits

// -----
"builtin.module"() ({
  "tl.graph"() ({
    %0 = "tl.input"() {id = 0 : si2147483647} : () -> !tl.tensor<[4]>
    "tl.output"(%0) : (!tl.tensor<[4]>) -> ()
  }) {sym_name = "g i99999"} : () -> ()
}) : () -> ()
// CHECK: mlir_integers.mlir:26:33: error: integer type 'si2147483647' is wider than 64 bits

// -----
"builtin.module"() ({
  "tl.graph"() ({
    %0 = "tl.input"() {id = 0 : i64} : () -> !tl.tensor<[-3, 4]>
    "tl.output"(%0) : (!tl.tensor<[-3, 4]>) -> ()
  }) {sym_name = "g"} : () -> ()
}) : () -> ()
// CHECK: mlir_integers.mlir:35:58: error: tensor extent must be in [0, 2^63), got -3
