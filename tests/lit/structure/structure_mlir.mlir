// Faults only the MLIR generic form can express; .tlir's grammar rules them out, so
// verify-structure reports them on .mlir input, located at the op's position in the file.
// RUN: not tlc-opt %s --split-input-file -p verify-structure 2> %t.err
// RUN: filecheck %s < %t.err
// RUN: tlc-opt %s --split-input-file -p verify-structure --verify-diagnostics

// CHECK: structure_mlir.mlir:9:3: error: IR graph: graph @no_output must select exactly one output, found 0{{$}}
// expected-error @+1 {{IR graph: graph @no_output must select exactly one output, found 0}}
  "tl.graph"() ({
    %0 = "tl.input"() {id = 0 : i64} : () -> !tl.tensor<[2]>
  }) {sym_name = "no_output"} : () -> ()

// -----

// CHECK: structure_mlir.mlir:17:3: error: IR graph: graph @two_outputs must select exactly one output, found 2{{$}}
// expected-error @+1 {{must select exactly one output, found 2}}
  "tl.graph"() ({
    %0 = "tl.input"() {id = 0 : i64} : () -> !tl.tensor<[2]>
    "tl.output"(%0) : (!tl.tensor<[2]>) -> ()
    "tl.output"(%0) : (!tl.tensor<[2]>) -> ()
  }) {sym_name = "two_outputs"} : () -> ()

// -----

"tl.graph"() ({
  %0 = "tl.input"() {id = 0 : i64} : () -> !tl.tensor<[2]>
  // CHECK: structure_mlir.mlir:29:3: error: IR graph: unexpected op 'tl.record' in graph @foreign_op{{$}}
  // expected-error @+1 {{IR graph: unexpected op 'tl.record' in graph @foreign_op}}
  "tl.record"() {node = 0 : i64, kind = "linear", fields = {}} : () -> ()
  "tl.output"(%0) : (!tl.tensor<[2]>) -> ()
}) {sym_name = "foreign_op"} : () -> ()

// -----

"tl.graph"() ({
  %0 = "tl.input"() {id = 0 : i64} : () -> !tl.tensor<[2, 3]>
  // CHECK: structure_mlir.mlir:39:3: error: IR graph: node 1: softmax: missing metadata field 'axis'{{$}}
  // expected-error @+1 {{IR graph: node 1: softmax: missing metadata field 'axis'}}
  %1 = "tl.softmax"(%0) {id = 1 : i64} : (!tl.tensor<[2, 3]>) -> !tl.unshaped
  "tl.output"(%1) : (!tl.unshaped) -> ()
}) {sym_name = "missing_field"} : () -> ()

// -----

"tl.graph"() ({
  %0 = "tl.input"() {id = 0 : i64} : () -> !tl.tensor<[2, 3]>
  // CHECK: structure_mlir.mlir:49:3: error: IR graph: node 1: attribute 'perm' must be a list of integers{{$}}
  // expected-error @+1 {{IR graph: node 1: attribute 'perm' must be a list of integers}}
  %1 = "tl.permute"(%0) {id = 1 : i64, perm = array<i32: 1, 0>} : (!tl.tensor<[2, 3]>) -> !tl.unshaped
  "tl.output"(%1) : (!tl.unshaped) -> ()
}) {sym_name = "mistyped_field"} : () -> ()

// -----

"tl.graph"() ({
  // CHECK: structure_mlir.mlir:58:3: error: attribute 'id' expected in operation 'tl.input'{{$}}
  // expected-error @+1 {{attribute 'id' expected in operation 'tl.input'}}
  %0 = "tl.input"() : () -> !tl.tensor<[2]>
  "tl.output"(%0) : (!tl.tensor<[2]>) -> ()
}) {sym_name = "missing_id"} : () -> ()
