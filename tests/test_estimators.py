"""Public API of gpustat.estimators: scikit-learn conformance, training contract, bad input."""

from __future__ import annotations

import pickle
import tracemalloc
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from sklearn.exceptions import NotFittedError
from sklearn.utils.estimator_checks import check_estimator

from gpustat.estimators import (
    FFMClassifier,
    FFMRegressor,
    FMClassifier,
    FMRegressor,
    FwFMClassifier,
    FwFMRegressor,
    ftrl,
    lazy_adagrad,
    lazy_adam,
    lazy_sgd,
)
from tests.oracles import fm_trainer as oracle

ALL = [FMClassifier, FMRegressor, FFMClassifier, FFMRegressor, FwFMClassifier, FwFMRegressor]
CLASSIFIERS = [FMClassifier, FFMClassifier, FwFMClassifier]

# per-row (or per-batch) SGD is not invariant to repeating a row versus doubling
# its weight: the repeated row is visited twice, at different parameters
EXPECTED_FAILED = {
    "check_sample_weight_equivalence_on_dense_data":
        "stochastic mini-batch training: a weight-2 row is not the same as two visits",
    "check_sample_weight_equivalence_on_sparse_data":
        "stochastic mini-batch training: a weight-2 row is not the same as two visits",
}


def _data(n=40, p=8, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, p)) * (rng.random((n, p)) < 0.5)
    fields = np.arange(p) % 3
    y = (X[:, 0] - X[:, 1] + 0.3 * rng.normal(size=n) > 0).astype(int)
    return X, fields, y


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_check_estimator(cls):
    est = cls(n_factors=2, max_iter=10, batch_size=8, learning_rate=0.1, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = check_estimator(est, expected_failed_checks=EXPECTED_FAILED, on_fail=None)
    failed = [(r["check_name"], repr(r["exception"])) for r in results
              if r["status"] == "failed"]
    assert not failed, failed
    xfailed = {r["check_name"] for r in results if r["status"] == "xfail"}
    assert xfailed <= set(EXPECTED_FAILED)


# ---------------------------------------------------------------- training contract


def test_epoch_by_epoch_equals_multi_epoch_fit():
    X, fields, y = _data()
    kw = dict(n_factors=3, batch_size=6, random_state=5, dtype="float64", optimizer="adam",
              init_scale=0.2)
    whole = FwFMClassifier(max_iter=3, **kw).fit(X, y, field_ids=fields)
    # the same random stream, consumed one epoch per call
    rng = np.random.default_rng(5)
    oracle.init_params("fwfm", rng, 1, X.shape[1], 3, 3, 0.2, True)
    stepwise = FwFMClassifier(max_iter=1, **kw)
    for _ in range(3):
        order = rng.permutation(len(y))
        stepwise.partial_fit(X[order], y[order], classes=[0, 1], field_ids=fields)
    for name in ("w0_", "w_", "V_", "r_"):
        np.testing.assert_allclose(getattr(stepwise, name), getattr(whole, name), rtol=1e-12,
                                   atol=1e-15, err_msg=name)
    assert stepwise.n_iter_ == whole.n_iter_ == 3


@pytest.mark.parametrize("cls", [FMRegressor, FFMRegressor])
def test_chunked_partial_fit_equals_one_pass(cls):
    X, fields, _ = _data(n=36)
    y = np.random.default_rng(1).normal(size=36)
    kw = dict(n_factors=3, batch_size=6, random_state=2, dtype="float64", optimizer="ftrl",
              l1_linear=1e-3, l1_factors=1e-3)
    one = cls(**kw).partial_fit(X, y, field_ids=fields)
    chunked = cls(**kw)
    for start in (0, 12, 30):  # chunks of 12, 18, 6 rows: multiples of batch_size
        stop = {0: 12, 12: 30, 30: 36}[start]
        chunked.partial_fit(X[start:stop], y[start:stop], field_ids=fields)
    np.testing.assert_allclose(chunked.V_, one.V_, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(chunked.w_, one.w_, rtol=1e-12, atol=1e-15)
    assert chunked.w0_ == pytest.approx(one.w0_, rel=1e-12)


def test_warm_start_continues_parameters_and_optimizer_state():
    X, _, _ = _data(n=30)
    y = np.random.default_rng(2).normal(size=30)
    kw = dict(n_factors=3, batch_size=4, max_iter=1, random_state=3, dtype="float64",
              optimizer="adam")
    warm = FwFMRegressor(warm_start=True, **kw).fit(X, y)
    warm.fit(X, y)  # resumes: no init draw, so its epoch uses the stream's first permutation
    manual = FwFMRegressor(**kw).fit(X, y)
    order = np.random.default_rng(3).permutation(30)
    manual.partial_fit(X[order], y[order])
    for name in ("w0_", "w_", "V_", "r_"):
        np.testing.assert_allclose(getattr(warm, name), getattr(manual, name), rtol=1e-12,
                                   atol=1e-15, err_msg=name)
    with pytest.raises(ValueError, match="same features"):
        warm.fit(X[:, :5], y)
    # the rejected call left the fitted model as it was
    assert warm.n_features_in_ == X.shape[1]
    np.testing.assert_array_equal(warm.predict(X), manual.predict(X))


def test_rejected_warm_start_keeps_the_fitted_classifier():
    X, _fields, y = _data()
    est = FMClassifier(warm_start=True, max_iter=1, batch_size=8, random_state=0).fit(X, y)
    before = est.predict_proba(X)
    with pytest.raises(ValueError, match="same classes"):
        est.fit(X, np.arange(len(y)) % 3)
    np.testing.assert_array_equal(est.classes_, [0, 1])
    np.testing.assert_array_equal(est.predict_proba(X), before)


def test_warm_start_with_other_labels_raises():
    # as many classes as before, but other labels: the fitted parameters belong to
    # the old classes' positions, so continuing would relabel them silently
    X, _fields, y = _data()
    est = FMClassifier(warm_start=True, max_iter=1, batch_size=8, random_state=0).fit(X, y)
    before = est.predict_proba(X)
    for relabelled in (y + 5, np.where(y == 1, "yes", "no")):
        with pytest.raises(ValueError, match="same classes"):
            est.fit(X, relabelled)
        np.testing.assert_array_equal(est.classes_, [0, 1])
        np.testing.assert_array_equal(est.predict_proba(X), before)


def test_epoch_orders_are_drawn_as_needed():
    # early stopping after a few epochs must not first draw max_iter permutations
    # (max_iter x n int64 of host memory: 8 GB for 10M rows x 100 epochs)
    X, _fields, y = _data()
    kw = dict(n_factors=2, batch_size=8, early_stopping=True, patience=1, random_state=0)
    FMClassifier(max_iter=1, **kw).fit(X, y)  # compile outside the measurement
    tracemalloc.start()
    try:
        est = FMClassifier(max_iter=200_000, **kw).fit(X, y)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, peak  # all the orders would take ~70 MB
    assert est.n_iter_ < 100


def test_ftrl_l1_gives_exact_zeros():
    X, _fields, y = _data(n=60, p=12)
    est = FFMClassifier(optimizer="ftrl", l1_linear=0.05, l1_factors=0.05, max_iter=3,
                        batch_size=8, random_state=0).fit(X, y, field_ids=np.arange(12) % 4)
    assert 0 < np.count_nonzero(est.w_ == 0) < est.w_.size or np.all(est.w_ == 0)
    assert np.count_nonzero(est.V_ == 0) > 0
    dense = FFMClassifier(optimizer="adagrad", max_iter=3, batch_size=8, random_state=0)
    assert np.count_nonzero(dense.fit(X, y).V_ == 0) == 0


def test_early_stopping_restores_best_epoch():
    X, _fields, _y = _data(n=60, seed=3)
    rng = np.random.default_rng(0)
    y_noise = rng.integers(0, 2, 60)  # unlearnable: the validation loss turns up
    X_val, y_val = X[:20], y_noise[:20]
    kw = dict(n_factors=4, batch_size=4, learning_rate=0.5, random_state=1, dtype="float64")
    es = FMClassifier(max_iter=40, patience=3, early_stopping=True, **kw)
    es.fit(X[20:], y_noise[20:], eval_set=(X_val, y_val))
    assert es.n_iter_ < 40
    losses = []
    for epochs in range(1, es.n_iter_ + 1):
        plain = FMClassifier(max_iter=epochs, **kw).fit(X[20:], y_noise[20:])
        p = plain.predict_proba(X_val)[:, 1]
        losses.append(-np.mean(y_val * np.log(p) + (1 - y_val) * np.log1p(-p)))
    best = int(np.argmin(losses))
    assert es.n_iter_ == best + 1 + 3  # stopped after `patience` epochs without improvement
    plain = FMClassifier(max_iter=best + 1, **kw).fit(X[20:], y_noise[20:])
    np.testing.assert_allclose(es.V_, plain.V_, rtol=1e-12)


def test_custom_optax_sgd_equals_builtin_sgd():
    X, _fields, y = _data()
    kw = dict(n_factors=3, batch_size=5, max_iter=2, random_state=0, dtype="float64")
    ours = FMClassifier(optimizer="sgd", learning_rate=0.1, **kw).fit(X, y)
    theirs = FMClassifier(optimizer=optax.sgd(0.1), **kw).fit(X, y)
    np.testing.assert_allclose(theirs.V_, ours.V_, rtol=1e-12)
    dense_adam = FMClassifier(optimizer=optax.adam(0.01), **kw).fit(X, y)
    assert np.all(np.isfinite(dense_adam.V_))


def test_verbose_progress_bar(capsys):
    X, _fields, y = _data()
    FMClassifier(n_factors=2, max_iter=2, batch_size=8, verbose=1, early_stopping=True,
                 random_state=0).fit(X, y)
    err = capsys.readouterr().err
    assert "loss=" in err and "val=" in err and "2/2" in err


def test_save_load_and_pickle_continue_training(tmp_path):
    X, fields, y = _data()
    est = FFMClassifier(n_factors=2, batch_size=8, dtype="float64", random_state=0,
                        optimizer="adam").partial_fit(X, y, classes=[0, 1], field_ids=fields)
    path = tmp_path / "m.pkl"
    est.save_model(path)
    loaded = FFMClassifier.load_model(path)
    copied = pickle.loads(pickle.dumps(est))
    np.testing.assert_array_equal(loaded.predict_proba(X), est.predict_proba(X))
    for other in (loaded, copied, est):
        other.partial_fit(X, y)
    np.testing.assert_allclose(loaded.V_, est.V_, rtol=1e-14)
    np.testing.assert_allclose(copied.V_, est.V_, rtol=1e-14)
    with pytest.raises(ValueError, match="FFMRegressor"):
        FFMRegressor.load_model(path)


@pytest.mark.parametrize("cls", [FMClassifier, FFMClassifier, FwFMClassifier])
def test_top_interactions_match_brute_force(cls):
    X, fields, y = _data(p=7)
    est = cls(n_factors=3, max_iter=1, batch_size=8, random_state=0, init_scale=0.5)
    est.fit(X, y, field_ids=fields)
    strengths = {}
    for i in range(7):
        for j in range(i + 1, 7):
            if cls is FFMClassifier:
                s = est.V_[i, fields[j]] @ est.V_[j, fields[i]]
            else:
                s = est.V_[i] @ est.V_[j]
                if cls is FwFMClassifier:
                    a, b = sorted((fields[i], fields[j]))
                    s = s * est.r_[a, b]
            strengths[(i, j)] = abs(float(s))
    expected = sorted(strengths.items(), key=lambda kv: -kv[1])[:5]
    got = est.top_interactions(5)
    assert [(i, j) for i, j, _ in got] == [pair for pair, _ in expected]
    np.testing.assert_allclose([s for *_, s in got], [s for _, s in expected], rtol=1e-5)


def test_multiclass_predict_proba_and_top_interactions_class_idx():
    X, _fields, _ = _data()
    y = np.random.default_rng(0).integers(0, 3, len(X))
    est = FwFMClassifier(n_factors=2, max_iter=2, batch_size=8, random_state=0).fit(X, y)
    proba = est.predict_proba(X)
    assert proba.shape == (len(X), 3)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-6)
    assert est.V_.shape == (3, X.shape[1], 2) and est.r_.shape == (3, X.shape[1], X.shape[1])
    assert len(est.top_interactions(3, class_idx=2)) == 3
    with pytest.raises(ValueError, match="class_idx"):
        est.top_interactions(3)


# ---------------------------------------------------------------- optax transformations


def test_transformations_under_jit_and_vmap():
    params = {"a": jnp.array([0.5, -1.0, 2.0]), "b": jnp.array([[0.1, 0.2]])}
    grads = {"a": jnp.array([0.3, -0.2, 0.1]), "b": jnp.array([[1.0, -1.0]])}
    touched = {"a": jnp.array([True, False, True]), "b": jnp.array([[True]])}
    for tx in (lazy_sgd(0.1), lazy_adagrad(0.1), lazy_adam(0.1), ftrl(0.1, 1.0, 0.05, 0.01)):
        state = tx.init(params)
        step = jax.jit(lambda g, s, p, tx=tx: tx.update(g, s, p, touched=touched)[0])
        # a batch of two problems: the second with everything doubled
        stack = jax.tree.map(lambda x: jnp.stack([x, 2 * x]), (grads, state, params))
        batched = jax.jit(jax.vmap(step))(*stack)
        for i in range(2):
            one = step(*jax.tree.map(lambda x, i=i: x[i], stack))
            assert float(one["a"][1]) == 0.0  # untouched: no step
            for key in one:
                np.testing.assert_allclose(batched[key][i], one[key], rtol=1e-12)


def test_ftrl_closed_form_and_exact_zero():
    theta, g = jnp.array([0.3, 0.0]), jnp.array([0.2, 0.01])
    alpha, beta, l1, l2 = 0.5, 1.0, 0.05, 0.1
    tx = ftrl(alpha, beta, l1, l2)
    updates, state = tx.update(g, tx.init(theta), theta)
    new = optax.apply_updates(theta, updates)
    n = g**2
    z = g - (np.sqrt(n) / alpha) * theta
    expected = np.where(np.abs(z) <= l1, 0.0,
                        -(z - np.sign(z) * l1) / ((beta + np.sqrt(n)) / alpha + l2))
    np.testing.assert_allclose(new, expected, rtol=1e-12)
    assert float(new[1]) == 0.0  # |z| = 0.01 <= l1: exactly zero
    with pytest.raises(ValueError, match="params"):
        tx.update(g, state)


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_input_raises(bad):
    X, _fields, y = _data()
    Xb = X.copy()
    Xb[3, 2] = bad
    with pytest.raises(ValueError, match=r"NaN|infinity"):
        FMClassifier(max_iter=1).fit(Xb, y)
    est = FMClassifier(max_iter=1, batch_size=8).fit(X, y)
    with pytest.raises(ValueError, match=r"NaN|infinity"):
        est.predict(Xb)
    with pytest.raises(ValueError, match=r"NaN|infinity"):
        FMRegressor(max_iter=1).fit(X, np.where(np.arange(len(y)) == 2, bad, 1.0))


def test_eval_set_of_several_pairs_raises():
    # xgboost users pass [(X_train, y_train), (X_val, y_val)]: stopping on the first
    # pair would early-stop on the training rows
    X, _fields, y = _data()
    with pytest.raises(ValueError, match="eval_set must be"):
        FMClassifier(max_iter=1).fit(X, y, eval_set=[(X, y), (X[:5], y[:5])])


def test_values_beyond_float32_range_raise():
    # finite float64 input that float32 training would turn into inf (then NaN parameters)
    X, _fields, y = _data()
    big = np.where(np.arange(X.size).reshape(X.shape) == 3, 1e40, X)
    with pytest.raises(ValueError, match=r"X has values up to 1e\+40.*dtype='float64'"):
        FMClassifier(max_iter=1).fit(big, y)
    est = FMClassifier(max_iter=1, batch_size=8).fit(X, y)
    with pytest.raises(ValueError, match="X has values"):
        est.predict(big)
    with pytest.raises(ValueError, match="y has values"):
        FMRegressor(max_iter=1).fit(X, 1e40 * y)
    with pytest.raises(ValueError, match="sample_weight has values"):
        FMClassifier(max_iter=1).fit(X, y, sample_weight=np.full(len(y), 1e39))


def test_unknown_labels_in_eval_set_raise():
    X, _fields, y = _data()
    with pytest.raises(ValueError, match="eval_set contains labels"):
        FMClassifier(max_iter=1).fit(X, y, eval_set=(X[:5], np.array([0, 1, 7, 0, 1])))


@pytest.mark.parametrize("cls", [FFMClassifier, FwFMClassifier])
def test_bad_field_ids_raise(cls):
    X, _fields, y = _data()
    with pytest.raises(ValueError, match=r"expected shape \(8,\), got fields.shape=\(5,\)"):
        cls(max_iter=1).fit(X, y, field_ids=np.arange(5))
    with pytest.raises(ValueError, match="non-negative"):
        cls(max_iter=1).fit(X, y, field_ids=np.arange(8) - 1)
    with pytest.raises(ValueError, match="integers"):
        cls(max_iter=1).fit(X, y, field_ids=np.arange(8) + 0.5)
    with pytest.raises(ValueError, match="integers"):
        cls(max_iter=1).fit(X, y, field_ids=np.array(list("abcdefgh")))


def test_ffm_too_large_without_field_ids_names_field_ids():
    # one field per feature: V_ would be 10^6 x 10^6 x 8 (58 PiB); numpy refuses at once
    import scipy.sparse as sp

    X = sp.random(4, 10**6, density=1e-5, format="csr", random_state=0)
    with pytest.raises(MemoryError, match="n_fields=1000000; pass field_ids"):
        FFMClassifier(max_iter=1).fit(X, np.array([0, 1, 0, 1]))


def test_integer_sparse_duplicates_are_summed_without_wrapping():
    # int8 COO entries 100 + 100 at one position: 200 (a conversion in int8 gives -56)
    import scipy.sparse as sp

    X, _fields, y = _data()
    dense = np.zeros((4, 8))
    dense[0, 1] = 200.0
    coo = sp.coo_array((np.array([100, 100], np.int8), ([0, 0], [1, 1])), shape=(4, 8))
    est = FMRegressor(max_iter=1, random_state=0).fit(X, y)
    np.testing.assert_array_equal(est.predict(coo), est.predict(dense))


def test_l1_without_ftrl_raises():
    X, _fields, y = _data()
    with pytest.raises(ValueError, match="optimizer='ftrl'"):
        FMClassifier(l1_linear=0.1, optimizer="adagrad").fit(X, y)


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_predict_before_fit_raises(cls):
    with pytest.raises(NotFittedError):
        cls().predict(np.ones((2, 3)))


def test_feature_count_mismatch_raises():
    X, fields, y = _data()
    est = FFMClassifier(max_iter=1, batch_size=8).fit(X, y, field_ids=fields)
    with pytest.raises(ValueError, match="X has 5 features, but FFMClassifier is expecting 8"):
        est.predict(X[:, :5])
    with pytest.raises(ValueError, match="X has 5 features"):
        est.partial_fit(X[:, :5], y)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"optimizer": "rmsprop"}, "optimizer must be one of"),
    ({"dtype": "float16"}, "dtype must be"),
    ({"backend": "cuda"}, "backend must be one of"),
    ({"batch_size": 0}, "batch_size must be an integer >= 1"),
    ({"label_smoothing": 1.0}, "label_smoothing"),
    ({"class_weight": "auto"}, "class_weight"),
    ({"class_weight": {"0": 2.0}}, r"class_weight has keys \['0'\] that are not classes"),
    ({"class_weight": {7: 2.0}}, "not classes"),
    ({"class_weight": {0: np.inf}}, "class_weight values must be finite"),
    ({"class_weight": {0: -1.0}}, "class_weight values must be finite and >= 0"),
    ({"learning_rate": np.inf}, "learning_rate must be a finite number"),
    ({"beta_1": 1.0}, r"beta_1 must be a finite number in \[0, 1\)"),
    ({"epsilon": -1.0}, "epsilon must be a finite number >= 0"),
])
def test_bad_settings_raise(kwargs, match):
    X, _fields, y = _data()
    with pytest.raises(ValueError, match=match):
        FMClassifier(**kwargs).fit(X, y)


def test_bad_sample_weight_raises():
    X, _, y = _data()
    with pytest.raises(ValueError, match="non-zero"):
        FMClassifier().fit(X, y, sample_weight=np.zeros(len(y)))
    with pytest.raises(ValueError, match="Negative values"):
        FMClassifier().fit(X, y, sample_weight=-np.ones(len(y)))
    with pytest.raises(ValueError, match="one class"):
        FMClassifier().fit(X, y, sample_weight=(y == 1).astype(float))


def test_partial_fit_needs_classes_first():
    X, _fields, y = _data()
    with pytest.raises(ValueError, match="classes"):
        FMClassifier().partial_fit(X, y)
    est = FMClassifier(batch_size=8).partial_fit(X, y, classes=[0, 1])
    with pytest.raises(ValueError, match="not in classes_"):
        est.partial_fit(X[:2], np.array([0, 5]))
