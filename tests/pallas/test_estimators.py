"""Pallas gradient scatter vs its reference; training through the kernel vs the NumPy trainer.

Interpret mode runs one entry per grid step (it loses duplicate-index atomics
inside one vector); the compiled GPU twin runs the default blocks, where
duplicates inside one vector must add up: ``test_duplicates_in_one_block``
is the check of that, on the GPU only.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gpustat.estimators import FFMClassifier, FwFMRegressor
from gpustat.pallas.estimators import default_block_entries, scatter_add_rows
from tests.helpers import KernelTests, tol
from tests.oracles import fm_trainer as oracle
from tests.pallas.lowering_cases import estimators_cases


def _dense_sum(idx, rows, n_targets):
    out = np.zeros((n_targets, rows.shape[1]))
    for i, r in zip(np.asarray(idx), np.asarray(rows, np.float64)):
        out[i] += r
    return out


class TestScatterAddRows(KernelTests):
    @pytest.mark.parametrize("dtype", [np.float32, np.float64])
    @pytest.mark.parametrize(("n_entries", "width", "n_targets"),
                             [(1, 1, 1), (13, 3, 5), (37, 18, 50)])
    def test_matches_dense_sum(self, n_entries, width, n_targets, dtype):
        rng = np.random.default_rng(n_entries)
        idx = rng.integers(0, n_targets, n_entries).astype(np.int32)
        rows = rng.normal(size=(n_entries, width)).astype(dtype)
        out = scatter_add_rows(jnp.asarray(idx), jnp.asarray(rows), n_targets,
                               interpret=self.backend == "interpret")
        assert out.dtype == dtype and out.shape == (n_targets, width)
        np.testing.assert_allclose(out, _dense_sum(idx, rows, n_targets),
                                   rtol=10 * tol(dtype, "kernel"), atol=10 * tol(dtype, "kernel"))

    def test_duplicates_in_one_block(self):
        if self.backend == "interpret":
            pytest.skip("interpret mode loses duplicate atomics inside one vector (GPU twin)")
        rng = np.random.default_rng(1)
        n_entries, width = 4096 * 16, 8
        idx = rng.integers(0, 37, n_entries).astype(np.int32)  # heavy duplication
        rows = rng.normal(size=(n_entries, width))
        assert default_block_entries(n_entries, width) > 1
        out = scatter_add_rows(jnp.asarray(idx), jnp.asarray(rows), 37)
        np.testing.assert_allclose(out, _dense_sum(idx, rows, 37), rtol=1e-10, atol=1e-10)

    def test_ffm_training_through_kernel_matches_reference_trainer(self):
        rng = np.random.default_rng(4)
        n, p, n_fields, k = 11, 7, 3, 2
        X = rng.normal(size=(n, p)) * (rng.random((n, p)) < 0.5)
        fields = np.arange(p) % n_fields
        y = rng.integers(0, 2, n)
        est = FFMClassifier(n_factors=k, max_iter=1, batch_size=4, init_scale=0.5,
                            random_state=2, dtype="float64", backend=self.backend,
                            learning_rate=0.1)
        est.fit(X, y, field_ids=fields)
        r = np.random.default_rng(2)
        params = oracle.init_params("ffm", r, 1, p, n_fields, k, 0.5, True)
        opt = oracle.Optimizer("adagrad", params, lr=0.1)
        oracle.train("ffm", "logistic", oracle.dense_rows(X), fields,
                     oracle.targets_for("logistic", y, 1, 0.0), np.ones(n), params, opt,
                     [r.permutation(n)], batch_size=4, l2_linear=1e-5, l2_factors=1e-5)
        np.testing.assert_allclose(est.V_, params["V"][0], rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(est.w_, params["w"][0], rtol=1e-9, atol=1e-12)

    def test_fwfm_float32_training_through_kernel(self):
        rng = np.random.default_rng(5)
        n, p = 9, 6
        X = rng.normal(size=(n, p)) * (rng.random((n, p)) < 0.6)
        fields = np.arange(p) % 2
        y = rng.normal(size=n)
        kw = dict(n_factors=2, max_iter=2, batch_size=3, init_scale=0.5, random_state=0,
                  learning_rate=0.1)
        est = FwFMRegressor(dtype="float32", backend=self.backend, **kw).fit(X, y, fields)
        ref = FwFMRegressor(dtype="float64", backend="reference", **kw).fit(X, y, fields)
        for name in ("w_", "V_", "r_"):
            np.testing.assert_allclose(getattr(est, name), getattr(ref, name), rtol=1e-4,
                                       atol=1e-5, err_msg=name)


def test_lowering_cases_cover_both_dtypes():
    # tests/pallas/test_lowering.py lowers every case for CUDA
    dtypes = {c.args[1].dtype for c in estimators_cases()}
    assert dtypes == {jnp.dtype(jnp.float32), jnp.dtype(jnp.float64)}
    assert jax.config.jax_enable_x64
