"""FM / FFM / FwFM Pallas kernels (interpret on CPU, compiled on a GPU) vs the per-pair oracle."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gpustat.csr import CSR
from gpustat.pallas import factorization as kernels
from gpustat.pallas._common import LOWERING_CASES
from tests.helpers import KernelTests, assert_close, assert_lowers_for_cuda, tol
from tests.oracles import factorization_oracle as oracle
from tests.oracles.factorization_cases import make_problem

PROBLEM = make_problem()
# small tiles: rows of width 8 take two chunks of 4, buckets span several grid steps
# and end in padded row blocks
SMALL_TILES = {"block_rows": 2, "block_w": 4}


@functools.cache
def _jitted(model: str, interpret: bool, tiles: tuple):
    """One compiled kernel call per (model, backend, tiles), shared by the tests."""
    settings = dict(tiles, interpret=interpret)

    def call(X, f, w0, w, V, R):
        if model == "fm":
            return kernels.fm_scores(X, w0, w, V, **settings)
        if model == "ffm":
            return kernels.ffm_scores(X, f, w0, w, V, **settings)
        return kernels.fwfm_scores(X, f, w0, w, V, R, **settings)

    return jax.jit(call)


def _kernel_scores(model, backend, P, dtype, tiles=()):
    X = CSR.from_scipy(P.X, dtype=dtype)
    V = P.V_ffm if model == "ffm" else P.V
    args = [jnp.asarray(a, dtype) for a in (P.w0, P.w, V, P.R)]
    return _jitted(model, backend == "interpret", tuple(sorted(tiles)))(
        X, jnp.asarray(P.field_ids, jnp.int32), *args)


def _oracle(model, P):
    if model == "fm":
        return oracle.fm_scores(P.X, P.w0, P.w, P.V)
    if model == "ffm":
        return oracle.ffm_scores(P.X, P.field_ids, P.w0, P.w, P.V_ffm)
    return oracle.fwfm_scores(P.X, P.field_ids, P.w0, P.w, P.V, P.R)


class TestScoringKernels(KernelTests):
    @pytest.mark.parametrize("model", ["fm", "ffm", "fwfm"])
    def test_float64_matches_oracle_with_chunked_tiles(self, model):
        # the fixture holds empty rows, one-nonzero rows and same-field pairs
        lengths = np.diff(PROBLEM.X.indptr)
        assert {0, 1} <= set(lengths.tolist())
        fields = [PROBLEM.field_ids[PROBLEM.X.indices[a:b]] for a, b in
                  zip(PROBLEM.X.indptr[:-1], PROBLEM.X.indptr[1:])]
        assert sum(len(f) - len(set(f.tolist())) for f in fields) >= 3
        expected = _oracle(model, PROBLEM)
        actual = np.asarray(_kernel_scores(model, self.backend, PROBLEM, np.float64,
                                           tuple(SMALL_TILES.items())))
        assert actual.dtype == np.float64
        assert np.max(np.abs(actual - expected) / np.maximum(np.abs(expected), 1)) < 1e-10
        assert np.all(actual[lengths == 0] == PROBLEM.w0)  # empty rows score the bias

    @pytest.mark.parametrize("model", ["fm", "ffm", "fwfm"])
    def test_float32_default_tiles(self, model):
        expected = _oracle(model, PROBLEM)
        actual = np.asarray(_kernel_scores(model, self.backend, PROBLEM, np.float32))
        assert actual.dtype == np.float32
        assert np.max(np.abs(actual - expected) / np.maximum(np.abs(expected), 1)) < (
            50 * tol(np.float32, "kernel"))

    def test_fwfm_with_unit_field_weights_is_fm(self):
        P = PROBLEM
        R = np.triu(np.ones_like(P.R)) + np.tril(np.full_like(P.R, 5.0), -1)
        X = CSR.from_scipy(P.X)
        actual = _jitted("fwfm", self.backend == "interpret", tuple(sorted(SMALL_TILES.items())))(
            X, jnp.asarray(P.field_ids, jnp.int32), jnp.asarray(P.w0), jnp.asarray(P.w),
            jnp.asarray(P.V), jnp.asarray(R))
        expected = oracle.fm_scores(P.X, P.w0, P.w, P.V)
        assert np.max(np.abs(np.asarray(actual) - expected) / np.maximum(np.abs(expected), 1)
                      ) < 1e-10

    def test_explicit_zeros_and_nan_parameters_of_absent_features_are_skipped(self):
        P = make_problem(seed=5, row_lengths=(2, 3, 1, 4))
        X_scipy = P.X.copy()
        X_scipy.data[1] = 0.0  # an explicit stored zero
        V = P.V.copy()
        V[X_scipy.indices[1]] = np.nan
        unused = np.setdiff1d(np.arange(V.shape[0]), X_scipy.indices)
        V[unused] = np.nan
        X = CSR.from_scipy(X_scipy)
        expected = oracle.fm_scores(X_scipy, P.w0, P.w, np.nan_to_num(V, nan=0.0))
        actual = _jitted("fm", self.backend == "interpret", tuple(sorted(SMALL_TILES.items())))(
            X, None, jnp.asarray(P.w0), jnp.asarray(P.w), jnp.asarray(V), None)
        assert_close(actual, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", [c for c in LOWERING_CASES if c.module == "factorization"],
                         ids=lambda c: c.name)
def test_registered_cases_lower_for_cuda(case):
    assert_lowers_for_cuda(case.fn, case.args)


def test_every_model_and_dtype_has_a_lowering_case():
    names = {c.name for c in LOWERING_CASES if c.module == "factorization"}
    assert names == {f"{m}_{d}" for m in ("fm", "ffm", "fwfm") for d in ("float32", "float64")}


def test_default_tiles_are_powers_of_two_and_bounded():
    for model in ("fm", "ffm", "fwfm"):
        for width in (1, 4, 32, 1024):
            for k in (1, 8, 16, 20):
                s = kernels.kernel_settings(model, width, k)
                assert s["block_w"] <= min(width, 32)
                for key in ("block_rows", "block_w"):
                    assert s[key] & (s[key] - 1) == 0
