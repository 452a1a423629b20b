"""gpustat.CSR: conversion from scipy/dense, validation, row buckets, pytree behaviour."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse as sp

from gpustat.csr import CSR, dense_as_csr


def _dense():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(7, 9)) * (rng.random((7, 9)) < 0.4)
    x[2] = 0.0  # an empty row
    x[4, :] = rng.normal(size=9)  # a full row (width 16 bucket)
    return x


def test_from_scipy_sums_duplicates_for_every_format():
    coo = sp.coo_array(([1.0, 2.0, 5.0, -1.0], ([0, 0, 2, 2], [1, 1, 3, 0])), shape=(3, 4))
    expected = np.array([[0, 3.0, 0, 0], [0, 0, 0, 0], [-1.0, 0, 0, 5.0]])
    for fmt in ("coo", "csr", "csc", "lil", "dok"):
        X = CSR.from_scipy(coo.asformat(fmt))
        np.testing.assert_array_equal(np.asarray(X.to_dense()), expected)
        assert X.nnz == 3 and X.shape == (3, 4)
    assert CSR.from_scipy(sp.csr_matrix(expected), dtype=np.float32).dtype == np.float32


def test_from_dense_drops_exact_zeros_and_buckets_rows_by_length():
    x = _dense()
    X = CSR.from_dense(x)
    assert X.nnz == np.count_nonzero(x)
    np.testing.assert_array_equal(np.asarray(X.to_dense()), x)
    np.testing.assert_array_equal(X.to_scipy().toarray(), x)
    lengths = np.count_nonzero(x, axis=1)
    covered = []
    for width, rows in zip(X.buckets.widths, X.bucket_rows, strict=True):
        rows = np.asarray(rows)
        assert np.all((lengths[rows] <= width) & (lengths[rows] > width // 2))
        covered += list(rows)
    assert sorted(covered) == list(np.flatnonzero(lengths))  # every non-empty row once
    assert not X.buckets.in_order


def test_single_bucket_in_order_flag():
    X = CSR.from_dense(np.ones((5, 3)))
    assert X.buckets.widths == (4,) and X.buckets.in_order


def test_pytree_roundtrip_under_jit_and_with_data():
    X = CSR.from_dense(_dense())
    dense = jax.jit(lambda X: X.to_dense())(X)
    np.testing.assert_array_equal(np.asarray(dense), _dense())
    doubled = jax.jit(lambda X: X.with_data(2 * X.data).to_dense())(X)
    np.testing.assert_array_equal(np.asarray(doubled), 2 * _dense())
    leaves, treedef = jax.tree.flatten(X)
    assert jax.tree.unflatten(treedef, leaves).buckets == X.buckets


def test_dense_as_csr_is_traceable_and_keeps_zeros():
    x = _dense()
    out = jax.jit(lambda x: dense_as_csr(x).to_dense())(jnp.asarray(x))
    np.testing.assert_array_equal(np.asarray(out), x)
    X = dense_as_csr(jnp.asarray(x))
    assert X.nnz == x.size and X.buckets.widths == (16,) and X.buckets.in_order


@pytest.mark.parametrize("args, message", [
    (([1.0], [0], [0, 2], (1, 3)), "indptr must start at 0 and end at nnz"),
    (([1.0, 2.0], [0, 1], [0, 2, 1, 2], (3, 3)), "indptr must be non-decreasing"),
    (([1.0], [3], [0, 1], (1, 3)), "indices must lie in"),
    (([1.0], [-1], [0, 1], (1, 3)), "indices must lie in"),
    (([np.nan], [0], [0, 1], (1, 3)), "data must be finite"),
    (([np.inf], [0], [0, 1], (1, 3)), "data must be finite"),
    (([1.0, 2.0], [0], [0, 2], (1, 3)), "same length"),
    (([1.0], [0], [0, 1], (2, 3)), "indptr must have n"),
    (([1.0], [0], [0, 1], (1,)), "shape must be"),
    (([1.0, 2.0, 1.0], [1, 1, 3], [0, 3], (1, 4)), "column 1 twice in row 0"),
    (([1.0, 2.0, 1.0, 1.0], [2, 0, 3, 0], [0, 1, 4], (2, 4)), "column 0 twice in row 1"),
    # an unsigned indptr that decreases (its np.diff would wrap to a huge step)
    (([1.0, 2.0], [0, 1], np.array([0, 2, 1, 2], np.uint64), (3, 3)),
     "indptr must be non-decreasing"),
    # columns or rows past int32 (column 2**31 + 1 would be stored as -2**31 + 1)
    (([1.0], [2**31 + 1], [0, 1], (1, 2**31 + 5)), "n and p must be at most 2147483647"),
    (([], np.zeros(0, np.int64), [0] * 2, (2**31, 1)), "n and p must be at most 2147483647"),
])
def test_invalid_arrays_raise_value_error(args, message):
    with pytest.raises(ValueError, match=message):
        CSR(*(np.asarray(a) if isinstance(a, list) else a for a in args))


def test_repeated_columns_across_rows_and_unsorted_rows_are_accepted():
    # the same column in different rows, and a row in descending order, are valid
    X = CSR(np.array([1.0, 2.0, 3.0, 4.0]), np.array([2, 0, 2, 1]), np.array([0, 2, 4]), (2, 3))
    np.testing.assert_array_equal(np.asarray(X.to_dense()), [[2.0, 0.0, 1.0], [0.0, 4.0, 3.0]])


def test_type_errors():
    with pytest.raises(TypeError, match="data must be real"):
        CSR(np.array([1 + 2j]), np.zeros(1, np.int32), np.array([0, 1]), (1, 2))
    with pytest.raises(TypeError, match="indices must hold integers"):
        CSR(np.ones(1), np.zeros(1), np.array([0, 1]), (1, 2))
    with pytest.raises(TypeError, match="scipy sparse"):
        CSR.from_scipy(np.ones((2, 2)))
    with pytest.raises(TypeError, match="tracer"):
        jax.jit(lambda d: CSR(d, np.zeros(1, np.int32), np.array([0, 1]), (1, 2)))(np.ones(1))
    with pytest.raises(ValueError, match="2-D"):
        CSR.from_dense(np.ones(3))
    with pytest.raises(ValueError, match="with_data"):
        CSR.from_dense(np.ones((2, 2))).with_data(jnp.ones(3))


def test_from_scipy_sums_duplicates_before_casting_and_checks_dtype():
    # hand-computed sums: int8 100 + 100 = 200 (scipy's own int8 sum wraps to -56), and
    # float32 1 + 2**-30 is exact in the float64 asked for (a float32 sum rounds it to 1)
    int8 = sp.coo_array((np.array([100, 100], np.int8), ([0, 0], [1, 1])), shape=(1, 2))
    for dtype in (None, np.float64):
        np.testing.assert_array_equal(np.asarray(CSR.from_scipy(int8, dtype=dtype).to_dense()),
                                      [[0.0, 200.0]])
    f32 = sp.coo_array((np.array([1.0, 2.0**-30], np.float32), ([0, 0], [1, 1])), shape=(1, 2))
    assert float(CSR.from_scipy(f32, dtype=np.float64).data[0]) == 1.0 + 2.0**-30
    assert CSR.from_scipy(f32).dtype == np.float32
    with pytest.raises(TypeError, match="dtype must be a floating dtype"):
        CSR.from_scipy(sp.csr_array(np.array([[0.5, 1.5]])), dtype=np.int32)  # was [0, 1]


def test_to_scipy_of_bfloat16_gives_the_same_values_as_float32():
    x = np.array([[1.5, 0.0], [0.0, -2.25]])
    S = CSR.from_dense(jnp.asarray(x, jnp.bfloat16)).to_scipy()
    assert S.dtype == np.float32
    np.testing.assert_array_equal(S.toarray(), x)


def test_dense_as_csr_rejects_offsets_past_int32_and_non_2d():
    # 2**16 x 2**15 entries: the int32 indptr would end at -2**31 (checked abstractly)
    with pytest.raises(ValueError, match="at most 2147483647 entries"):
        jax.eval_shape(dense_as_csr, jax.ShapeDtypeStruct((2**16, 2**15), jnp.float32))
    with pytest.raises(ValueError, match="x must be 2-D"):
        dense_as_csr(jnp.ones(3))
