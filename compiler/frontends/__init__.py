"""`tlc.frontends`: reading and writing documents: .tlir/.mlir text, ONNX, PyTorch."""
