"""What a public FM/FFM/FwFM ``fit`` runs: its compiled programs, its host-side label
coding and the read-ahead of row orders and file chunks."""

from __future__ import annotations

import threading
import time

import jax
import numpy as np
import pytest
import scipy.sparse as sp

import gpustat
from gpustat._prefetch import prefetched
from gpustat.estimators import FFMClassifier, FMClassifier, _classes
from gpustat.estimators._classes import _label_codes
from gpustat.factorization import _libffm
from tests.helpers import compiled_programs


def _ctr(n=300, p=40, f=4, seed=0):
    rng = np.random.default_rng(seed)
    cols = np.sort(rng.choice(p, size=(n, f), replace=True), axis=1) // f * f \
        + np.arange(f)  # one feature per field
    X = sp.csr_matrix((np.ones(n * f), cols.ravel(), np.arange(0, n * f + 1, f)), shape=(n, p))
    return X, rng.integers(0, 2, n), np.arange(p) % f


def test_fit_compiles_one_program_and_an_equal_fit_none():
    """Layout, optimizer state and every epoch are one program; a new estimator with equal
    settings and shapes in the same buckets (here 3 more, unused, features) reuses it (an
    unusual learning rate keys a fresh compile)."""
    X, y, fields = _ctr()
    kw = dict(n_factors=3, max_iter=3, batch_size=64, learning_rate=0.0123457, random_state=0)
    first = compiled_programs(lambda: FFMClassifier(**kw).fit(X, y, field_ids=fields))
    fitted = []

    def fit_again():
        fitted.append(FFMClassifier(**kw).fit(X, y, field_ids=fields))
        wider = sp.hstack([X, sp.csr_matrix((X.shape[0], 3))], format="csr")  # p 40 -> 43
        FFMClassifier(**kw).fit(wider, y, field_ids=np.r_[fields, 0, 1, 2])

    again = compiled_programs(fit_again)
    est = fitted[0]
    assert first == ["jit(_fit_epochs)"], first
    assert again == [], again  # same settings, same shape buckets
    assert len(est.loss_curve_) == 3 and np.all(np.isfinite(est.loss_curve_))


def test_partial_fit_chunks_share_one_training_program():
    """The first chunk starts the optimizer state in a program of its own, so every chunk
    (fresh state or continued) runs the same training program."""
    X, y, _ = _ctr(n=256)
    est = FMClassifier(n_factors=3, batch_size=32, learning_rate=0.0234568)
    def fit_chunks():
        for start in range(0, 256, 64):
            est.partial_fit(X[start:start + 64], y[start:start + 64], classes=[0, 1])

    compiles = compiled_programs(fit_chunks)
    assert sorted(compiles) == ["jit(_fit_epochs)", "jit(init_state)"], compiles


@pytest.mark.parametrize("y", [
    np.array([5, -2, 5, 9, -2], np.int8),
    np.array([300, 2, 300], np.uint16),
    np.array([2**40, 7, 2**40 + 3]),  # a span far wider than n: sorted instead
    np.array(["b", "a", "b"]),
    np.array([1.0, 0.0, 1.0]),
])
def test_label_codes_equal_numpy_unique(y):
    labels, codes = _label_codes(y)
    want_labels, want_codes = np.unique(y, return_inverse=True)
    np.testing.assert_array_equal(labels, want_labels)
    assert labels.dtype == want_labels.dtype
    np.testing.assert_array_equal(codes, want_codes.reshape(-1))


def test_canonical_input_is_read_not_written_and_others_are_copied():
    X, y, _ = _ctr(n=64)
    canonical = X.copy()
    # a last row with an explicit zero and a duplicated, unsorted feature
    messy = sp.csr_matrix((np.r_[X.data, 2.0, 0.0, 1.0], np.r_[X.indices, 5, 1, 5],
                           np.r_[X.indptr, X.nnz + 3]), shape=(65, X.shape[1]))
    before = [a.copy() for a in (messy.data, messy.indices, messy.indptr)]
    FMClassifier(n_factors=2, max_iter=1, batch_size=16).fit(canonical, y)
    FMClassifier(n_factors=2, max_iter=1, batch_size=16).fit(messy, np.r_[y, 1])
    for array, want in zip((messy.data, messy.indices, messy.indptr), before):
        np.testing.assert_array_equal(array, want)
    np.testing.assert_array_equal(canonical.toarray(), X.toarray())


def test_prefetched_reads_ahead_in_order_and_reraises_in_place():
    pulled = []

    def source():
        for i in range(6):
            pulled.append(i)
            if i == 4:
                raise KeyError("item 4")
            yield i

    it = prefetched(source(), 2)
    deadline = time.monotonic() + 10
    while len(pulled) < 2 and time.monotonic() < deadline:  # started before the first next()
        time.sleep(0.01)
    assert pulled == [0, 1]
    assert [next(it) for _ in range(4)] == [0, 1, 2, 3]
    with pytest.raises(KeyError, match="item 4"):
        next(it)
    assert list(prefetched(range(3), 0)) == [0, 1, 2]


def test_prefetched_closed_before_its_first_item_reads_no_further():
    """A fit that fails its checks after the epoch orders started closes the read-ahead:
    the reads not started are cancelled."""
    pulled = []

    def source():
        for i in range(100):
            pulled.append(i)
            yield i

    it = prefetched(source(), 2)
    it.close()
    assert len(pulled) <= 2
    with pytest.raises(StopIteration):
        next(it)


def test_streamed_file_trains_the_same_model_with_and_without_read_ahead(tmp_path,
                                                                         monkeypatch):
    """``iter_libffm(prefetch=2)`` parses the next chunks in a worker thread while
    ``partial_fit`` trains: the chunks, and so the model, are those of the sequential
    read; the worker runs ahead of the consumer."""
    X, y, fields = _ctr(n=200, seed=2)
    path = tmp_path / "train.ffm"
    gpustat.dump_libffm(path, X, y, fields)
    models = []
    for depth in (0, 2):
        est = FFMClassifier(n_factors=2, batch_size=16, random_state=1, dtype="float64"
                            if jax.config.jax_enable_x64 else "float32")
        for X_chunk, y_chunk, _ in gpustat.iter_libffm(path, chunk_rows=48, field_ids=fields,
                                                       prefetch=depth):
            est.partial_fit(X_chunk, y_chunk, classes=[0, 1], field_ids=fields)
        models.append(est)
    assert models[0].n_iter_ == models[1].n_iter_ == 5
    for name in ("w0_", "w_", "V_"):
        np.testing.assert_array_equal(getattr(models[1], name), getattr(models[0], name))
    np.testing.assert_array_equal(models[1].loss_curve_, models[0].loss_curve_)

    threads = set()

    def lines():
        with open(path, "rb") as fh:
            for line in fh:
                threads.add(threading.current_thread())
                yield line

    monkeypatch.setattr(_libffm, "_BLOCK_BYTES", 256)  # many blocks: the worker reads most
    chunks = gpustat.iter_libffm(lines(), chunk_rows=48, field_ids=fields, prefetch=1)
    assert next(chunks)[0].shape == (48, X.shape[1])
    assert threading.current_thread() in threads and len(threads) == 2, threads


def test_large_data_runs_an_epoch_per_call_with_the_same_result(monkeypatch):
    """From ``_EPOCH_PER_CALL_ROWS`` rows each call runs one epoch (the device starts
    while the host draws the next orders): the same parameters and losses as one call,
    and one training program for every call (the state starts in ``init_state``)."""
    from gpustat.estimators import _train as fm_train

    X, y, fields = _ctr()
    kw = dict(n_factors=3, max_iter=3, batch_size=64, random_state=0, dtype="float64",
              optimizer="adam", learning_rate=0.0345679)
    calls = []
    with monkeypatch.context() as patch:
        patch.setattr(fm_train, "_EPOCH_PER_CALL_ROWS", 1)
        patch.setattr(fm_train, "_epoch_plan",
                      lambda *a, plan=fm_train._epoch_plan: calls.append(a) or plan(*a))
        fitted = []
        compiles = compiled_programs(
            lambda: fitted.append(FFMClassifier(**kw).fit(X, y, field_ids=fields)))
    per_epoch = fitted[0]
    whole = FFMClassifier(**kw).fit(X, y, field_ids=fields)
    assert [len(a[2]) for a in calls] == [1, 1, 1]
    assert sorted(compiles) == ["jit(_fit_epochs)", "jit(init_state)"], compiles
    np.testing.assert_allclose(per_epoch.V_, whole.V_, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(per_epoch.loss_curve_, whole.loss_curve_, rtol=1e-12)


@pytest.mark.parametrize("bad", [None, np.nan, np.inf, -np.inf])
def test_chunked_value_range_equals_one_pass(monkeypatch, bad):
    values = np.random.default_rng(3).normal(size=1001)
    if bad is not None:
        values[997] = bad  # in the last chunk
    monkeypatch.setattr(_classes, "_PARALLEL_SCAN_VALUES", 1)
    lo, hi = _classes._min_max(values)
    np.testing.assert_array_equal([lo, hi], [values.min(), values.max()])
