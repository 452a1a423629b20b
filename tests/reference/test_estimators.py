"""Device training (reference scatter) vs the NumPy reference trainer written from the spec."""

from __future__ import annotations

import numpy as np
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
from gpustat.reference.estimators import scatter_add_rows_reference
from tests.oracles import fm_trainer as oracle

N, P, F, K, BATCH, EPOCHS = 23, 9, 3, 4, 5, 2
CLASSIFIERS = {"fm": FMClassifier, "ffm": FFMClassifier, "fwfm": FwFMClassifier}
REGRESSORS = {"fm": FMRegressor, "ffm": FFMRegressor, "fwfm": FwFMRegressor}


def _data(seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(N, P)) * (rng.random((N, P)) < 0.45)
    X[0] = 0.0  # an empty row
    X[1] = 0.0
    X[1, 4] = 1.5  # a one-nonzero row
    fields = rng.integers(0, F, P)
    fields[-1] = F - 1
    y = rng.integers(0, 3, N)
    return X, fields, y


def _settings(optimizer):
    kw = dict(optimizer=optimizer, learning_rate=0.07, l2_linear=1e-2, l2_factors=3e-2)
    if optimizer == "ftrl":
        kw.update(l1_linear=2e-3, l1_factors=4e-3, ftrl_beta=0.5)
    return kw


def _oracle_fit(model, loss, X, fields, y, n_classes, kw, *, random_state, init_scale,
                weights=None, label_smoothing=0.0):
    """The spec's random stream (init, then one permutation per epoch) and trainer."""
    rng = np.random.default_rng(random_state)
    params = oracle.init_params(model, rng, n_classes, P, F, K, init_scale, n_classes == 1)
    orders = [rng.permutation(N) for _ in range(EPOCHS)]
    opt = oracle.Optimizer(kw["optimizer"], params, lr=kw["learning_rate"],
                           ftrl_beta=kw.get("ftrl_beta", 1.0))
    weights = np.ones(N) if weights is None else weights
    targets = oracle.targets_for(loss, y, n_classes, label_smoothing)
    oracle.train(model, loss, oracle.dense_rows(X), fields, targets, weights, params, opt,
                 orders, batch_size=BATCH, l2_linear=kw["l2_linear"],
                 l2_factors=kw["l2_factors"], l1_linear=kw.get("l1_linear", 0.0),
                 l1_factors=kw.get("l1_factors", 0.0))
    return params


def _assert_params_equal(est, params, squeeze):
    for name, expected in params.items():
        expected = expected[0] if squeeze else expected
        actual = np.asarray(getattr(est, f"{name}_"), np.float64)
        np.testing.assert_allclose(actual, expected, rtol=1e-9, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "adam", "ftrl"])
@pytest.mark.parametrize("model", ["fm", "ffm", "fwfm"])
def test_binary_two_epochs_match_reference_trainer(model, optimizer):
    X, fields, y = _data()
    y = y % 2
    kw = _settings(optimizer)
    est = CLASSIFIERS[model](n_factors=K, max_iter=EPOCHS, batch_size=BATCH, init_scale=0.3,
                             random_state=7, dtype="float64", backend="reference",
                             label_smoothing=0.1, **kw)
    est.fit(X, y, field_ids=fields)
    params = _oracle_fit(model, "logistic", X, fields, y, 1, kw, random_state=7,
                         init_scale=0.3, label_smoothing=0.1)
    _assert_params_equal(est, params, squeeze=True)
    if optimizer == "ftrl":
        zeros = int((est.V_ == 0).sum() + (est.w_ == 0).sum())
        assert zeros > 0, "FTRL with L1 should produce exact zeros here"
        assert zeros == int((params["V"] == 0).sum() + (params["w"] == 0).sum())


@pytest.mark.parametrize("model", ["fm", "ffm", "fwfm"])
def test_multiclass_softmax_with_smoothing_and_class_weight(model):
    X, fields, y = _data(1)
    kw = _settings("adagrad")
    class_weight = {0: 2.0, 2: 0.5}
    est = CLASSIFIERS[model](n_factors=K, max_iter=EPOCHS, batch_size=BATCH, init_scale=0.3,
                             random_state=3, dtype="float64", backend="reference",
                             label_smoothing=0.2, class_weight=class_weight, **kw)
    sample_weight = np.linspace(0.5, 1.5, N)
    est.fit(X, y, field_ids=fields, sample_weight=sample_weight)
    weights = sample_weight * np.array([2.0, 1.0, 0.5])[y]
    params = _oracle_fit(model, "softmax", X, fields, y, 3, kw, random_state=3, init_scale=0.3,
                         weights=weights, label_smoothing=0.2)
    _assert_params_equal(est, params, squeeze=False)


@pytest.mark.parametrize("model", ["fm", "ffm", "fwfm"])
def test_regression_adam_matches_reference_trainer(model):
    X, fields, _ = _data(2)
    y = np.random.default_rng(5).normal(size=N)
    kw = _settings("adam")
    est = REGRESSORS[model](n_factors=K, max_iter=EPOCHS, batch_size=BATCH, init_scale=0.3,
                            random_state=11, dtype="float64", backend="reference", **kw)
    est.fit(sp.csr_matrix(X), y, field_ids=fields)
    params = _oracle_fit(model, "squared", X, fields, y, 1, kw, random_state=11, init_scale=0.3)
    _assert_params_equal(est, params, squeeze=True)


def test_scatter_reference_sums_duplicates():
    rng = np.random.default_rng(0)
    idx = rng.integers(0, 5, 40)
    rows = rng.normal(size=(40, 3))
    expected = np.zeros((7, 3))
    for i, r in zip(idx, rows):
        expected[i] += r
    np.testing.assert_allclose(scatter_add_rows_reference(idx, rows, 7), expected, rtol=1e-14)


@pytest.mark.parametrize("model", ["fm", "fwfm"])
def test_binary_softmax_loss_matches_reference_trainer(model):
    # loss="softmax" on two classes (modern_fm's option): two parameter sets, softmax targets
    X, fields, y = _data(3)
    y = y % 2
    kw = _settings("adagrad")
    est = CLASSIFIERS[model](n_factors=K, max_iter=EPOCHS, batch_size=BATCH, init_scale=0.3,
                             random_state=5, dtype="float64", backend="reference",
                             loss="softmax", label_smoothing=0.1, **kw)
    est.fit(X, y, field_ids=fields)
    params = _oracle_fit(model, "softmax", X, fields, y, 2, kw, random_state=5, init_scale=0.3,
                         label_smoothing=0.1)
    _assert_params_equal(est, params, squeeze=False)


@pytest.mark.parametrize("model", ["fm", "ffm", "fwfm"])
def test_one_hot_rows_and_gapped_integer_labels_match_reference_trainer(model):
    """All-ones values travel as row lengths only (the device rebuilds them) and
    int8 labels -3 / 7 are coded by counting: the fit equals the trainer's on 0/1
    labels and the 0/1 design."""
    X, fields, y = _data(seed=3)
    X = (X != 0).astype(np.float64)
    labels = np.where(y % 2 == 1, 7, -3).astype(np.int8)
    kw = _settings("adagrad")
    est = CLASSIFIERS[model](n_factors=K, max_iter=EPOCHS, batch_size=BATCH, init_scale=0.3,
                             random_state=5, dtype="float64", backend="reference", **kw)
    est.fit(sp.csr_matrix(X), labels, field_ids=fields)
    np.testing.assert_array_equal(est.classes_, np.array([-3, 7], np.int8))
    params = _oracle_fit(model, "logistic", X, fields, (labels == 7).astype(int), 1, kw,
                         random_state=5, init_scale=0.3)
    _assert_params_equal(est, params, squeeze=True)
