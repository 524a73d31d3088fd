// Programs in MLIR generic form: they lower like .tlir ones; malformed ones are reported.
// RUN: %roundtrip %s
// RUN: tlc-opt %s --split-input-file --verify-diagnostics -p lower-program --emit listing | filecheck %s --check-prefix=LISTING
// RUN: not tlc-opt %s --split-input-file 2>&1 | filecheck %s --check-prefix=ERR

// LISTING:      0: input parents=[] out=[2]
// LISTING-NEXT: 1: relu parents=[0] out=[2]
// LISTING-NEXT: 2: linear(payload=node_id) parents=[1] out=[3]

// ERR: generic_form.mlir:26:3: error: tl.program @bad: 1 argument names for 2 block arguments (the input, then the parameters)
// ERR: generic_form.mlir:38:5: error: add: shape mismatch: [2] vs [3]

"builtin.module"() ({
  "tl.program"() ({
  ^bb0(%0: !tl.tensor<[2]>, %1: !tl.tensor<[3, 2]>):
    %2 = "tl.call"(%0) {callee = "relu", fields = {}} : (!tl.tensor<[2]>) -> !tl.unshaped
    %3 = "tl.call"(%2, %1) {callee = "linear", fields = {}, binding = "y"} : (!tl.unshaped, !tl.tensor<[3, 2]>) -> !tl.unshaped
    "tl.return"(%3) : (!tl.unshaped) -> ()
  }) {sym_name = "ok", arg_names = ["x", "W"]} : () -> ()
}) : () -> ()

// -----

"builtin.module"() ({
  // expected-error@+1 {{tl.program @bad: 1 argument names for 2 block arguments (the input, then the parameters)}}
  "tl.program"() ({
  ^bb0(%0: !tl.tensor<[2]>, %1: !tl.tensor<[3, 2]>):
    "tl.return"(%0) : (!tl.tensor<[2]>) -> ()
  }) {sym_name = "bad", arg_names = ["x"]} : () -> ()
}) : () -> ()

// -----

"builtin.module"() ({
  "tl.program"() ({
  ^bb0(%0: !tl.tensor<[2]>, %1: !tl.tensor<[3]>):
    // expected-error@+1 {{add: shape mismatch: [2] vs [3]}}
    %2 = "tl.call"(%0, %1) {callee = "add", fields = {}, binding = "y"} : (!tl.tensor<[2]>, !tl.tensor<[3]>) -> !tl.unshaped
    "tl.return"(%2) : (!tl.unshaped) -> ()
  }) {sym_name = "shapes", arg_names = ["x", "b"]} : () -> ()
}) : () -> ()
