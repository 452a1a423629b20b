"""Row-sparse training steps, the device-built row layout, streaming partial_fit and the
modern_fm-compatible settings (loss=, n_jobs, per-epoch curves)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import scipy.sparse as sp

from gpustat.estimators import (
    FFMClassifier,
    FFMRegressor,
    FMClassifier,
    FMRegressor,
    FwFMClassifier,
    FwFMRegressor,
)
from gpustat.estimators import _train as fm_train
from tests.oracles import fm_trainer as oracle


def _step_flops(model, n_features, optimizer):
    """XLA's flop count of one compiled training step (8 rows x 8 slots)."""
    n_fields, k, rows, z = 4, 2, 64, 8
    tx, lazy, (l2w, l2v) = fm_train.make_optimizer(
        optimizer, model=model, learning_rate=0.1, beta_1=0.9, beta_2=0.999, epsilon=1e-8,
        ftrl_beta=1.0, l1_linear=0.0, l1_factors=0.0, l2_linear=1e-3, l2_factors=1e-3)
    cfg = fm_train.TrainConfig(model, "logistic", n_features, n_fields, 8, tx, lazy, l2w, l2v,
                               "reference")
    shape = (n_features, 1, n_fields, k) if model == "ffm" else (n_features, 1, k)
    params = {"w0": jnp.zeros(1), "w": jnp.zeros((n_features, 1)), "V": jnp.zeros(shape)}
    if model == "fwfm":
        params["r"] = jnp.ones((1, n_fields, n_fields))
    rng = np.random.default_rng(0)
    data = fm_train.DeviceRows(
        jnp.asarray(rng.integers(0, n_features, (rows, z)), jnp.int32), jnp.ones((rows, z)),
        jnp.asarray(rng.integers(0, n_fields, (rows, z)), jnp.int32), jnp.zeros((rows, 1)),
        jnp.ones(rows))
    step = jax.jit(functools.partial(fm_train._batch_step, cfg))
    compiled = step.lower(params, tx.init(params), data, jnp.arange(8), 8.0).compile()
    return compiled.cost_analysis()["flops"]


@pytest.mark.parametrize("model", ["fm", "ffm", "fwfm"])
@pytest.mark.parametrize("optimizer", ["adagrad", "ftrl"])
def test_rowwise_step_work_does_not_grow_with_the_vocabulary(model, optimizer):
    # a step of a built-in optimizer computes on the touched rows only: the same
    # arithmetic for 1k and 256k features (the rows are gathered and scattered back)
    small, large = _step_flops(model, 1 << 10, optimizer), _step_flops(model, 1 << 18, optimizer)
    assert small == large, (small, large)


def test_a_dense_optax_step_grows_with_the_vocabulary():
    # the counter-check: a user's optax transformation steps the whole (p, ...) gradient
    small = _step_flops("fm", 1 << 10, optax.sgd(0.1))
    large = _step_flops("fm", 1 << 18, optax.sgd(0.1))
    assert large > 100 * small, (small, large)


def test_device_row_layout_matches_a_python_loop():
    rng = np.random.default_rng(2)
    X = sp.random(41, 30, density=0.25, random_state=3, format="lil")
    X[0] = 0
    X[5] = 0
    X[40] = 0  # empty rows, the last one included
    X = X.tocsr()
    X.eliminate_zeros()
    fields = rng.integers(0, 4, 30)
    target, weight = rng.normal(size=(41, 2)), rng.random(41)
    rows = fm_train.to_device_rows(X, fields, target, weight, np.float64)
    n_pad, z = rows.idx.shape
    assert n_pad >= 42 and z >= max(np.diff(X.indptr).max(), 8)
    idx, val, fld = (np.zeros((n_pad, z), int), np.zeros((n_pad, z)), np.zeros((n_pad, z), int))
    for r in range(41):
        for slot, (i, v) in enumerate(zip(X[r].indices, X[r].data)):
            idx[r, slot], val[r, slot], fld[r, slot] = i, v, fields[i]
    fld[idx == 0] = fields[0]  # unused slots point at feature 0
    np.testing.assert_array_equal(rows.idx, idx)
    np.testing.assert_array_equal(rows.val, val)
    np.testing.assert_array_equal(rows.fld, fld)
    np.testing.assert_array_equal(rows.target[:41], target)
    np.testing.assert_array_equal(rows.weight[:41], weight)
    assert not np.any(rows.weight[41:]) and not np.any(rows.target[41:])


def _row(x):
    """(indices, values, fields) of a dense row, each feature its own field."""
    nz = np.flatnonzero(x)
    return nz, x[nz], nz


def _logloss(scores, y):
    return np.mean(np.maximum(scores, 0) - scores * y + np.log1p(np.exp(-np.abs(scores))))


def test_loss_curve_and_validation_scores_per_epoch():
    # one batch per epoch: epoch e's training loss is the loss at the parameters after
    # e epochs, which a fit with max_iter = e predicts
    rng = np.random.default_rng(4)
    X = rng.normal(size=(30, 6)) * (rng.random((30, 6)) < 0.6)
    y = (X[:, 0] + 0.5 * rng.normal(size=30) > 0).astype(int)
    X_val, y_val = X[:10] + 0.1, y[:10]
    kw = dict(n_factors=2, batch_size=64, learning_rate=0.2, random_state=1, dtype="float64",
              init_scale=0.3, patience=100)
    est = FFMClassifier(max_iter=3, **kw).fit(X, y, eval_set=(X_val, y_val))
    assert len(est.loss_curve_) == len(est.validation_scores_) == est.n_iter_ == 3
    init = oracle.init_params("ffm", np.random.default_rng(1), 1, 6, 6, 2, 0.3, True)
    init_scores = np.array([oracle.score("ffm", init, 0, *_row(x)) for x in X])
    np.testing.assert_allclose(est.loss_curve_[0], _logloss(init_scores, y), rtol=1e-10)
    for e in range(3):
        after = FFMClassifier(max_iter=e + 1, **kw).fit(X, y)
        np.testing.assert_allclose(est.validation_scores_[e],
                                   _logloss(after.decision_function(X_val), y_val), rtol=1e-10)
        if e < 2:
            np.testing.assert_allclose(est.loss_curve_[e + 1],
                                       _logloss(after.decision_function(X), y), rtol=1e-10)
    plain = FFMClassifier(max_iter=3, **kw).fit(X, y)
    assert plain.validation_scores_ is None
    np.testing.assert_allclose(plain.loss_curve_, est.loss_curve_, rtol=1e-12)
    warm = FFMClassifier(max_iter=2, warm_start=True, **kw).fit(X, y).fit(X, y)
    assert len(warm.loss_curve_) == 4


# a batch of 4 rows x 8 slots lists every row of the 16-row table; one row of 8 slots
# sorts its touched ids (fm_train.touched_rows)
@pytest.mark.parametrize(("cls", "batch_size"), [(FMClassifier, 4), (FFMClassifier, 4),
                                                 (FFMClassifier, 1)])
def test_streamed_csr_chunks_equal_the_reference_trainer(cls, batch_size):
    # partial_fit over CSR chunks (classes on the first call) is one pass in row order
    rng = np.random.default_rng(6)
    n, p, k = 24, 7, 2
    X = rng.normal(size=(n, p)) * (rng.random((n, p)) < 0.5)
    fields = np.arange(p) % 3
    y = rng.choice(np.array(["no", "yes"]), n)
    est = cls(n_factors=k, batch_size=batch_size, learning_rate=0.1, init_scale=0.3, random_state=3,
              dtype="float64", optimizer="adam")
    chunks = ((sp.csr_matrix(X[a:a + 8]), y[a:a + 8]) for a in range(0, n, 8))
    for i, (X_chunk, y_chunk) in enumerate(chunks):
        est.partial_fit(X_chunk, y_chunk, classes=["no", "yes"] if i == 0 else None,
                        field_ids=fields)
    model = "fm" if cls is FMClassifier else "ffm"
    n_fields = 1 if model == "fm" else 3
    params = oracle.init_params(model, np.random.default_rng(3), 1, p, n_fields, k, 0.3, True)
    opt = oracle.Optimizer("adam", params, lr=0.1)
    oracle.train(model, "logistic", oracle.dense_rows(X), fields if model == "ffm" else
                 np.zeros(p, int), (y == "yes").astype(float)[:, None], np.ones(n), params, opt,
                 [np.arange(n)], batch_size=batch_size, l2_linear=1e-5, l2_factors=1e-5)
    np.testing.assert_allclose(est.V_, params["V"][0], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(est.w_, params["w"][0], rtol=1e-9, atol=1e-12)
    assert est.n_iter_ == 3 and len(est.loss_curve_) == 3


def test_modern_fm_settings():
    assert FMClassifier().max_iter == FMRegressor().max_iter == 100
    for cls in (FFMClassifier, FFMRegressor, FwFMClassifier, FwFMRegressor):
        assert cls().max_iter == 50 and cls().n_jobs == -1
    X = np.random.default_rng(0).normal(size=(12, 3))
    y = np.arange(12) % 2
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="n_jobs"):
            FMRegressor(n_jobs=bad, max_iter=1).fit(X, y)
    with pytest.raises(ValueError, match="loss must be one of"):
        FMClassifier(loss="hinge").fit(X, y)
    est = FMClassifier(loss="softmax", n_jobs=4, max_iter=1, batch_size=4).fit(X, y)
    assert est.V_.shape == (2, 3, 16) and est.decision_function(X).shape == (12, 2)
    est.set_params(loss="logistic", warm_start=True)
    with pytest.raises(ValueError, match="parameter set"):
        est.fit(X, y)
    with pytest.raises(ValueError, match="parameter set"):
        est.partial_fit(X, y)
