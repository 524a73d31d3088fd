"""tlc as an ONNX backend (`onnx.backend.base.Backend`), and ONNX's node conformance tests run
through it: import the test's model, evaluate it by the reference denotation, compare with the
outputs ONNX ships, at the test's own tolerances.

The node tests come from the onnx package (`onnx.backend.test.case.node.collect_testcases`,
the generator of the `onnx/backend/test/data/node/*` files, which some wheels leave out); a test
belongs to an op of `OPS` when its model is a single node of that op, and its function-expanded
variants (`..._expanded`) count for the same op. `python -m tlc.onnx_backend` prints the report
docs/onnx-conformance.md shows; tests/test_onnx_conformance.py keeps the passing tests in CI.
"""

from __future__ import annotations

import re
import sys
from collections import defaultdict
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep

from tlc.diagnostics import DiagnosticError
from tlc.import_onnx import from_onnx
from tlc.passes.interpret import interpret
from tlc.program import Traced

#: The ONNX ops tlc imports, whose conformance tests are run.
OPS = (
    "Abs", "Add", "AveragePool", "BatchNormalization", "Concat", "Constant", "Conv", "Cos",
    "Exp", "Flatten", "Gelu", "Gemm", "Identity", "LayerNormalization", "Log", "LogSoftmax",
    "MatMul", "Max", "MaxPool", "Min", "Mul", "Reciprocal", "ReduceMean", "ReduceSum", "Relu",
    "Reshape", "Sigmoid", "Sin", "Softmax", "Softplus", "Sqrt", "Sub", "Tanh", "Transpose",
)  # fmt: skip


class TlcRep(BackendRep):
    """An imported model, run by the reference denotation in float64."""

    def __init__(self, traced: Traced, output_type: np.dtype):
        self.traced = traced
        self.output_type = output_type

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        arrays = [np.asarray(x, dtype=np.float64) for x in inputs]
        table = interpret(self.traced.graph, self.traced.payload, arrays)
        return (np.asarray(table.output).astype(self.output_type),)


class TlcBackend(Backend):
    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> TlcRep:
        elem = model.graph.output[0].type.tensor_type.elem_type
        return TlcRep(from_onnx(model), onnx.helper.tensor_dtype_to_np_dtype(elem))

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device == "CPU"


@dataclass(frozen=True)
class Outcome:
    name: str
    op: str
    status: str  # "pass", "fail" (wrong values or a crash) or "unsupported"
    reason: str = ""


@cache
def node_cases() -> dict[str, Any]:
    """ONNX's node test cases for the ops of `OPS`, by name, with the op they belong to."""
    from onnx.backend.test.case import node

    cases = {c.name: c for c in node.collect_testcases(None) if c.kind == "node"}
    ops = {name: c.model.graph.node[0].op_type for name, c in cases.items()
           if len(c.model.graph.node) == 1}  # fmt: skip
    chosen = {}
    for name, case in sorted(cases.items()):
        op = ops.get(re.sub(r"_expanded(_ver\d+)?$", "", name))
        if op in OPS:
            chosen[name] = (op, case)
    return chosen


def run_case(name: str) -> Outcome:
    op, case = node_cases()[name]
    try:
        rep = TlcBackend.prepare(case.model)
    except DiagnosticError as exc:
        return Outcome(name, op, "unsupported", _short(str(exc)))
    failures = []
    for inputs, expected in case.data_sets:
        try:
            (got,) = rep.run(inputs)
        except DiagnosticError as exc:
            return Outcome(name, op, "fail", _short(str(exc)))
        try:
            np.testing.assert_allclose(got, expected[0], rtol=case.rtol, atol=case.atol)
        except AssertionError as exc:
            failures.append(str(exc).strip().splitlines()[0])
    if failures:
        return Outcome(name, op, "fail", "values differ: " + failures[0])
    return Outcome(name, op, "pass")


def _short(message: str) -> str:
    return message.removeprefix("ONNX import: ").splitlines()[0]


def run_all() -> list[Outcome]:
    return [run_case(name) for name in node_cases()]


def report(outcomes: list[Outcome]) -> str:
    """The markdown table and lists of docs/onnx-conformance.md."""
    by_op: dict[str, list[Outcome]] = defaultdict(list)
    for o in outcomes:
        by_op[o.op].append(o)
    lines = ["| op | tests | pass | unsupported | fail |", "|---|---:|---:|---:|---:|"]
    for op in sorted(by_op):
        count = {s: sum(o.status == s for o in by_op[op]) for s in ("pass", "unsupported", "fail")}
        lines.append(
            f"| {op} | {len(by_op[op])} | {count['pass']} | {count['unsupported']} | "
            f"{count['fail']} |"
        )
    total = {s: sum(o.status == s for o in outcomes) for s in ("pass", "unsupported", "fail")}
    lines.append(
        f"| **all** | {len(outcomes)} | {total['pass']} | {total['unsupported']} | "
        f"{total['fail']} |"
    )
    lines += ["", "Tests that do not pass, with the reason:", ""]
    lines += [f"- `{o.name}` ({o.status}): {o.reason}" for o in outcomes if o.status != "pass"]
    return "\n".join(lines) + "\n"


def main() -> int:
    sys.stdout.write(report(run_all()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
