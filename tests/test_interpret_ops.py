"""Every op's reference rule against PyTorch (torch==2.13.0), in float64 and float32.

Driven by the op-record table (`tests/op_records.py`); tolerances are stated per record there.
Inputs are random (hypothesis draws the seed of numpy's generator) and include interior axes.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from op_records import (
    HAND_RECORDS,
    NOT_IN_TABLE,
    RECORDS,
    OpRecord,
    derivable,
    derived_record,
    normal,
)

from tlc.core.payload import Payload
from tlc.dialect.registry import NODE_OPS
from tlc.semantics.emitter import NumpyEmitter
from tlc.semantics.interpret import REFERENCE, interpret

torch = pytest.importorskip("torch")

SEEDS = st.integers(min_value=0, max_value=2**32 - 1)


def test_every_op_has_a_record_or_a_reason() -> None:
    covered = {rec.op for rec in RECORDS}
    assert covered.isdisjoint(NOT_IN_TABLE)
    assert set(NODE_OPS) == covered | set(NOT_IN_TABLE)


def _checked(rec: OpRecord) -> tuple:
    """What a record makes the tests check: shapes, metadata, inputs, tolerances."""
    samplers = rec.samplers or (normal,) * len(rec.parents)
    return rec.parents, dict(rec.fields), samplers, rec.tol64, rec.tol32, rec.smooth


def test_hand_records_say_more_than_the_derived_one() -> None:
    """A hand record of an op whose record derives from its facts states other inputs,
    metadata or tolerances (else it repeats the derived record and is not written)."""
    redundant = [
        rec.name
        for rec in HAND_RECORDS
        if derivable(rec.op) and _checked(rec) == _checked(derived_record(rec.op))
    ]
    assert redundant == []


def _ours(rec: OpRecord, seed: int, dtype: type) -> tuple[np.ndarray, np.ndarray]:
    inputs, payload = rec.sample(np.random.default_rng(seed))
    got = interpret(rec.graph(), payload, inputs, dtype).output
    return got, rec.torch(inputs, payload, dtype)


@pytest.mark.parametrize("rec", RECORDS, ids=lambda r: r.name)
@settings(max_examples=8, deadline=None)
@given(seed=SEEDS)
def test_matches_torch_f64(rec: OpRecord, seed: int) -> None:
    got, expected = _ours(rec, seed, np.float64)
    assert got.dtype == np.float64 and got.shape == rec.out
    np.testing.assert_allclose(got, expected, **rec.tol64.kw())


@pytest.mark.parametrize("rec", RECORDS, ids=lambda r: r.name)
@settings(max_examples=8, deadline=None)
@given(seed=SEEDS)
def test_matches_torch_f32(rec: OpRecord, seed: int) -> None:
    got, expected = _ours(rec, seed, np.float32)
    assert got.dtype == np.float32 and got.shape == rec.out
    np.testing.assert_allclose(got, expected, **rec.tol32.kw())


def _rounded_to_f32(inputs: list[np.ndarray], payload: Payload) -> tuple[list, Payload]:
    """`inputs` and `payload` with every value rounded to float32 (kept as float64)."""

    def rounded(x: np.ndarray) -> np.ndarray:
        return np.asarray(x, dtype=np.float32).astype(np.float64)

    records = {nid: {k: rounded(v) for k, v in rec.items()} for nid, rec in payload.items()}
    return [rounded(x) for x in inputs], Payload(records, dict(payload.kinds))


@pytest.mark.parametrize("rec", RECORDS, ids=lambda r: r.name)
@settings(max_examples=5, deadline=None)
@given(seed=SEEDS)
def test_f32_agrees_with_f64(rec: OpRecord, seed: int) -> None:
    """Both interpretations see the same values (the inputs and payload rounded to float32
    once), so the difference measured is the op's own float32 rounding, not the inputs':
    rounding x ~ 800 alone moves it by ~3e-5, more than log_softmax's float32 tolerance."""
    inputs, payload = _rounded_to_f32(*rec.sample(np.random.default_rng(seed)))
    graph = rec.graph()
    f64 = interpret(graph, payload, inputs, np.float64)
    f32 = interpret(graph, payload, inputs, np.float32)
    for a, b in zip(f32.values, f64.values, strict=True):
        assert a.dtype == np.float32
        np.testing.assert_allclose(a, b, **rec.tol32.kw())


@pytest.mark.parametrize("rec", RECORDS, ids=lambda r: r.name)
def test_record_text_parses_to_the_same_graph(rec: OpRecord) -> None:
    """`rec.text()` (for lit tests of other backends) denotes what `rec.graph()` does."""
    import tlc
    from tlc.api.evaluate import checked_graph

    inputs, payload = rec.sample(np.random.default_rng(0))
    parsed = checked_graph(tlc.parse(rec.text()))
    got = interpret(parsed, payload, inputs).output
    np.testing.assert_array_equal(got, interpret(rec.graph(), payload, inputs).output)


DECOMPOSED = [rec for rec in RECORDS if rec.op.defines("decompose")]


@pytest.mark.parametrize("rec", DECOMPOSED, ids=lambda r: r.name)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_decomposition_is_the_reference_bit_for_bit(rec: OpRecord, dtype: type) -> None:
    """An op's decomposition, evaluated part by part in `dtype` (the reference rule of an op
    with no numpy fact), gives exactly what its own rule gives."""
    inputs, _ = rec.sample(np.random.default_rng(3))
    em = NumpyEmitter(REFERENCE, dtype)
    args = [np.asarray(x, dtype=dtype) for x in inputs]
    node = em.node(rec.op, args, rec.fields)
    own = REFERENCE[rec.op](node, args, None, dtype)
    decomposed = node.decompose(em, *args)
    assert decomposed.dtype == dtype
    np.testing.assert_array_equal(decomposed, own)
