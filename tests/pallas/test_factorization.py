"""FM / FFM / FwFM Pallas kernels (interpret on CPU, compiled on a GPU) vs the per-pair oracle."""

import functools
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gpustat._arrays import next_pow2
from gpustat.csr import CSR
from gpustat.pallas import factorization as kernels
from tests.helpers import KernelTests, assert_close, tol
from tests.oracles import factorization_oracle as oracle
from tests.oracles.factorization_cases import (
    make_large_value_problem,
    make_one_hot_problem,
    make_problem,
)
from tests.pallas.lowering_cases import factorization_cases

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
    def test_float32_values_near_1e20_score_like_float64(self, model):
        # chunks of 2: FM meets the large v x in a row's second chunk and rescales
        large, error = make_large_value_problem()
        actual = np.asarray(_kernel_scores(model, self.backend, large, np.float32,
                                           (("block_rows", 2), ("block_w", 2))))
        assert np.all(np.isfinite(actual))
        eps = np.finfo(np.float32).eps
        assert np.all(np.abs(actual - _oracle(model, large)) <= 16 * eps * error[model])

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

    @pytest.mark.parametrize("model", ["ffm", "fwfm_slots"])
    def test_no_factors_scores_the_linear_model(self, model):
        """k = 0: every score is ``w0 + x . w`` (the kernels gathered from an empty V)."""
        P = ONE_HOT
        X = CSR.from_scipy(P.X)
        if model == "fwfm_slots":
            model, X = "fwfm", X.with_field_slots(P.field_ids)
        n_fields = P.R.shape[0]
        V = np.zeros((P.X.shape[1], n_fields, 0) if model == "ffm" else (P.X.shape[1], 0))
        actual = _jitted(model, self.backend == "interpret", ())(
            X, jnp.asarray(P.field_ids, jnp.int32), jnp.asarray(P.w0), jnp.asarray(P.w),
            jnp.asarray(V), jnp.asarray(P.R))
        assert_close(actual, P.w0 + P.X @ P.w, rtol=1e-12, atol=1e-12)


ONE_HOT = make_one_hot_problem()  # 13 rows, 5 fields, k = 3: a ragged last row block


@functools.cache
def _jitted_slots(interpret: bool, block_rows: int | None):
    """The field-slot kernel alone: (scores without w0, per-row misplaced flags)."""
    def call(X, f, w, V, R):
        return kernels.fwfm_slot_scores(X, f, w, V.reshape(-1), R, w.dtype, V.shape[1],
                                        interpret=interpret, block_rows=block_rows)

    return jax.jit(call)


def _slotted(P, dtype):
    X = CSR.from_scipy(P.X, dtype=dtype).with_field_slots(P.field_ids)
    return X, [jnp.asarray(a, dtype) for a in (P.w, P.V, P.R)]


class TestFieldSlotKernel(KernelTests):
    # float64 on 4-row tiles (four grid steps, the last one ragged), float32 on the default
    @pytest.mark.parametrize(("dtype", "block_rows"), [(np.float64, 4), (np.float32, None)])
    def test_matches_oracle_and_flags_no_row(self, dtype, block_rows):
        P = ONE_HOT
        lengths = np.diff(P.X.indptr)
        assert {0, 1, P.R.shape[0]} <= set(lengths.tolist())  # empty, single, full rows
        X, (w, V, R) = _slotted(P, dtype)
        scores, misplaced = _jitted_slots(self.backend == "interpret", block_rows)(
            X, jnp.asarray(P.field_ids), w, V, R)
        expected = oracle.fwfm_scores(P.X, P.field_ids, P.w0, P.w, P.V, P.R)
        actual = np.asarray(scores) + P.w0
        assert scores.dtype == dtype
        bound = 1e-10 if dtype == np.float64 else 50 * tol(np.float32, "kernel")
        assert np.max(np.abs(actual - expected) / np.maximum(np.abs(expected), 1)) < bound
        assert not np.asarray(misplaced).any()

    def test_single_row_and_unit_weights_give_fm(self):
        P = make_one_hot_problem(seed=3, n_rows=1, n_fields=3, p=7, k=1)
        X, (w, V, _) = _slotted(P, np.float64)
        R = jnp.asarray(np.triu(np.ones((3, 3))) + np.tril(np.full((3, 3), 5.0), -1))
        scores, misplaced = _jitted_slots(self.backend == "interpret", None)(
            X, jnp.asarray(P.field_ids), w, V, R)
        expected = oracle.fm_scores(P.X, P.w0, P.w, P.V)
        np.testing.assert_allclose(np.asarray(scores) + P.w0, expected, rtol=1e-12, atol=1e-12)
        assert scores.shape == (1,) and not np.asarray(misplaced).any()

    def test_rows_without_nonzeros_score_zero(self):
        import scipy.sparse as sp

        X = CSR.from_scipy(sp.csr_array((2, 4))).with_field_slots(np.array([0, 1, 1, 0]))
        scores, misplaced = _jitted_slots(self.backend == "interpret", None)(
            X, jnp.asarray([0, 1, 1, 0]), jnp.ones(4), jnp.ones((4, 2)), jnp.ones((2, 2)))
        np.testing.assert_array_equal(np.asarray(scores), 0.0)
        assert not np.asarray(misplaced).any()

    def test_table_that_does_not_fit_the_field_ids_falls_back_to_row_buckets(self):
        P = ONE_HOT
        X, (w, V, R) = _slotted(P, np.float64)
        shifted = (P.field_ids + 1) % P.R.shape[0]  # every nonzero now outside its slot
        _, misplaced = _jitted_slots(self.backend == "interpret", None)(
            X, jnp.asarray(shifted), w, V, R)
        lengths = np.diff(P.X.indptr)
        np.testing.assert_array_equal(np.asarray(misplaced) != 0, lengths > 0)
        actual = _jitted("fwfm", self.backend == "interpret", ())(
            X, jnp.asarray(shifted), jnp.asarray(P.w0), w, V, R)
        expected = oracle.fwfm_scores(P.X, shifted, P.w0, P.w, P.V, P.R)
        assert np.max(np.abs(np.asarray(actual) - expected) / np.maximum(np.abs(expected), 1)
                      ) < 1e-10

    def test_public_kernel_entry_takes_the_slot_path(self):
        P = ONE_HOT
        X, (w, V, R) = _slotted(P, np.float64)
        actual = _jitted("fwfm", self.backend == "interpret", ())(
            X, jnp.asarray(P.field_ids), jnp.asarray(P.w0), w, V, R)
        expected = oracle.fwfm_scores(P.X, P.field_ids, P.w0, P.w, P.V, P.R)
        assert np.max(np.abs(np.asarray(actual) - expected) / np.maximum(np.abs(expected), 1)
                      ) < 1e-10
        with mock.patch.object(kernels, "fwfm_slot_scores", wraps=kernels.fwfm_slot_scores) as spy:
            jax.make_jaxpr(functools.partial(kernels.fwfm_scores, interpret=True))(
                X, jnp.asarray(P.field_ids), jnp.asarray(P.w0), w, V, R)
            jax.make_jaxpr(functools.partial(kernels.fwfm_scores, interpret=True))(
                CSR.from_scipy(P.X), jnp.asarray(P.field_ids), jnp.asarray(P.w0), w, V, R)
        assert spy.call_count == 1  # the table was read; the plain CSR took the row buckets


def test_every_model_and_dtype_has_a_lowering_case():
    names = {c.name for c in factorization_cases()}
    assert names == {f"{m}_{d}" for m in ("fm", "ffm", "fwfm", "fwfm_slots")
                     for d in ("float32", "float64")}


def test_default_tiles_are_powers_of_two_and_bounded():
    for model in ("fm", "ffm", "fwfm"):
        for width in (1, 4, 32, 1024):
            for k in (1, 8, 16, 20):
                s = kernels.kernel_settings(model, width, k)
                assert s["block_w"] <= min(width, 32)
                for key in ("block_rows", "block_w"):
                    assert s[key] & (s[key] - 1) == 0
    for n_fields in (1, 5, 24, 100):
        for k in (1, 3, 8, 64):
            rows = kernels.slot_kernel_settings(n_fields, k)["block_rows"]
            assert rows & (rows - 1) == 0 and rows * next_pow2(k) >= 16
    assert kernels.slot_kernel_settings(24, 8)["block_rows"] == 64  # the H100 sweep's best
