"""Mosaic GPU piecewise kernel: its lookup logic on CPU against scipy, its CUDA lowering on
CPU, the backend errors, and the compiled kernel on an sm_90 GPU (marked gpu)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("jax.experimental.pallas.mosaic_gpu")

from gpustat._backend import BackendUnavailableError, mosaic_unavailable_reason
from gpustat.pallas._mosaic_piecewise import (
    evaluate_points,
    pack_tables,
    ppoly_eval_mosaic,
    table_offsets,
)
from gpustat.piecewise import PiecewisePolynomial, ppoly_eval
from gpustat.reference.piecewise import guide_tables, kernel_tables, side_rows
from tests.helpers import assert_close, assert_lowers_for_cuda
from tests.pallas.test_piecewise import expected_scipy

MODES = ("extend", "nan", "clamp")


def make_tables(kind: str, num_pieces: int = 48, seed: int = 0):
    """Breakpoints, coefficients (float32) and the packed table for one lookup kind."""
    rng = np.random.default_rng(seed)
    if kind == "uniform":
        bp = np.linspace(-2.0, 3.0, num_pieces + 1)
    elif kind == "guided":  # jittered grid: at most one breakpoint a guide bucket
        bp = np.linspace(-2.0, 3.0, num_pieces + 1)
        bp[1:-1] += rng.uniform(-0.3, 0.3, num_pieces - 1) * (5.0 / num_pieces)
    else:
        bp = np.sort(rng.uniform(-2.0, 3.0, num_pieces + 1))
    bp = bp.astype(np.float32)
    coeffs = rng.normal(size=(4, num_pieces)).astype(np.float32)
    keys, rows, params = kernel_tables(bp, coeffs, kind == "uniform")
    guide = guide_tables(bp) if kind == "guided" else None
    assert (guide is not None) == (kind == "guided")
    sides = side_rows(guide[2], rows, 3) if guide is not None else None
    table = pack_tables(keys, rows, params, guide, sides)
    buckets = guide[0].shape[0] if guide is not None else 0
    return bp, coeffs, table, buckets


def points(bp, size=None, seed=1):
    rng = np.random.default_rng(seed)
    x = np.concatenate([rng.uniform(-5.0, 6.0, 300), bp, np.nextafter(bp, np.inf),
                        np.nextafter(bp, -np.inf), [np.inf, -np.inf, np.nan]])
    return np.resize(x, size).astype(np.float32) if size else x.astype(np.float32)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", ["guided", "uniform", "search"])
def test_lookup_logic_matches_scipy(kind, mode):
    """The kernel's per-point code (table offsets, guided/uniform/search lookup, Horner,
    NaN and extrapolation rules), its shared-memory lookup replaced by a jnp gather."""
    bp, coeffs, table, buckets = make_tables(kind)
    flat = jnp.asarray(table).reshape(-1)

    def gather(index, *, offset, stride, dtypes):
        rows = [flat[offset + index * stride + w] for w in range(len(dtypes))]
        return [jax.lax.bitcast_convert_type(v, jnp.int32) if d == jnp.int32 else v
                for v, d in zip(rows, dtypes, strict=True)]

    offsets, entries = table_offsets(kind, bp.size - 1, 4, buckets)
    assert entries == table.size
    x = points(bp)
    params = tuple(flat[k] for k in range(4))
    got = evaluate_points(jnp.asarray(x), params, gather, lookup_kind=kind, offsets=offsets,
                          num_pieces=bp.size - 1, degree=3, width=4, buckets=buckets,
                          extrapolate=mode)
    expected = expected_scipy(bp.astype(np.float64), coeffs.astype(np.float64),
                              x.astype(np.float64), mode)
    finite = np.isfinite(expected)
    scale = np.maximum(np.abs(expected[finite]), 1.0)
    assert_close(np.asarray(got)[finite] / scale, expected[finite] / scale, rtol=0, atol=2e-5)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))


@pytest.mark.parametrize("kind", ["guided", "uniform", "search"])
def test_kernel_lowers_for_cuda(kind):
    _, _, table, buckets = make_tables(kind)
    kernel = functools.partial(ppoly_eval_mosaic, lookup_kind=kind, num_pieces=48, degree=3,
                               buckets=buckets, extrapolate="clamp" if kind == "uniform" else "nan")
    assert_lowers_for_cuda(kernel, (jax.ShapeDtypeStruct(table.shape, jnp.float32),
                                    jax.ShapeDtypeStruct((1 << 16,), jnp.float32)),
                           calls=("mosaic_gpu",))


@pytest.mark.skipif(not mosaic_unavailable_reason(), reason="this machine runs Mosaic GPU")
def test_mosaic_backend_unavailable_names_why():
    bp, coeffs, _, _ = make_tables("search")
    pp = PiecewisePolynomial(jnp.asarray(bp), jnp.asarray(coeffs))
    with pytest.raises(BackendUnavailableError, match=r"Mosaic GPU.*needs"):
        ppoly_eval(pp, jnp.zeros(128, jnp.float32), backend="mosaic")


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["guided", "uniform", "search"])
def test_mosaic_matches_scipy_on_gpu(kind):
    if mosaic_unavailable_reason():
        pytest.skip(f"Mosaic GPU needs {mosaic_unavailable_reason()}")
    bp, coeffs, _, _ = make_tables(kind)
    pp = PiecewisePolynomial(jnp.asarray(bp), jnp.asarray(coeffs))
    x = points(bp, size=128 * 1031)  # 1031 rows: a partial last tile
    got = np.asarray(ppoly_eval(pp, jnp.asarray(x), backend="mosaic"))
    expected = expected_scipy(bp.astype(np.float64), coeffs.astype(np.float64),
                              x.astype(np.float64), "extend")
    finite = np.isfinite(expected)
    scale = np.maximum(np.abs(expected[finite]), 1.0)
    assert_close(got[finite] / scale, expected[finite] / scale, rtol=0, atol=2e-5)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))


@pytest.mark.gpu
def test_mosaic_rejects_what_it_cannot_run_on_gpu():
    if mosaic_unavailable_reason():
        pytest.skip(f"Mosaic GPU needs {mosaic_unavailable_reason()}")
    bp, coeffs, _, _ = make_tables("search")
    pp = PiecewisePolynomial(jnp.asarray(bp), jnp.asarray(coeffs))
    with pytest.raises(ValueError, match="multiple of 128"):
        ppoly_eval(pp, jnp.zeros(100, jnp.float32), backend="mosaic")
