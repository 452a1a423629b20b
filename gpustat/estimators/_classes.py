"""scikit-learn estimators for factorization machines trained on the device with optax.

``FMClassifier``/``FMRegressor`` (Rendle 2010), ``FFMClassifier``/``FFMRegressor``
(Juan et al. 2016) and ``FwFMClassifier``/``FwFMRegressor`` (Pan et al. 2018)
with modern_fm's constructor names. Parameters and optimizer state stay on the
device; one epoch is one compiled program (:mod:`gpustat.estimators._train`); the
sparse batch gradient is accumulated by a Pallas scatter-add kernel on a CUDA
GPU; optax drives the update with the lazy transformations of
:mod:`gpustat.estimators._optim`, on the rows a batch touches (or any optax
transformation the user passes, on the whole parameter tables).

Scores of a row x with nonzero set Z (feature i in field f(i)):

* FM:   ``s = w0 + sum_i w_i x_i + sum_{i<j} <V_i, V_j> x_i x_j``
* FFM:  ``s = w0 + sum_i w_i x_i + sum_{i<j} <V[i, f(j)], V[j, f(i)]> x_i x_j``
* FwFM: ``s = w0 + sum_i w_i x_i + sum_{i<j} r_{f(i) f(j)} <V_i, V_j> x_i x_j``

Losses: logistic (binary, label smoothing ``y (1 - eps) + eps / 2``), softmax
(multiclass, target ``1 - eps`` on the true class and ``eps / (C - 1)`` on the
others), squared (regression). Row weight = ``sample_weight * class_weight[y]``.

Random stream (reproducible, and the same as modern_fm's):
``rng = np.random.default_rng(random_state)``; with ``early_stopping`` and no
``eval_set`` one ``rng.permutation(n)`` picks the holdout first; then the
factors are drawn (FM/FwFM ``rng.normal(0, init_scale, shape)``, FFM
``rng.uniform(0, init_scale / sqrt(k), shape)`` with ``shape`` the public
``V_`` shape), then one ``rng.permutation(n)`` per epoch (a few epochs' orders are
drawn side by side, ahead, from copies of the stream: the same orders).
``partial_fit`` visits rows in their given order.
"""

from __future__ import annotations

import contextlib
import math
import numbers
import os
import pickle
from concurrent.futures import ThreadPoolExecutor

import jax
import numpy as np
import optax
import scipy.sparse as sp
from jaxtyping import ArrayLike
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
from sklearn.utils.multiclass import check_classification_targets, unique_labels
from sklearn.utils.validation import (
    _check_sample_weight,
    check_is_fitted,
    column_or_1d,
    validate_data,
)

from gpustat._checks import check_int, check_real
from gpustat._gc import collector_paused
from gpustat.estimators import _train as fm_train
from gpustat.estimators._optim import ftrl, lazy_adagrad, lazy_adam, lazy_sgd
from gpustat.estimators._orders import epoch_orders

__all__ = [
    "FFMClassifier",
    "FFMRegressor",
    "FMClassifier",
    "FMRegressor",
    "FwFMClassifier",
    "FwFMRegressor",
    "ftrl",
    "lazy_adagrad",
    "lazy_adam",
    "lazy_sgd",
]

OPTIMIZERS = ("sgd", "adagrad", "adam", "ftrl")
CLASSIFIER_LOSSES = ("logistic", "softmax")
_IO_VERSION = 1


def _label_codes(y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted class labels of 1-D ``y`` and each entry's code (index into the labels).

    Integer labels spanning a range no wider than ``4 len(y) + 1024`` are counted
    (one pass, no sort); other labels are checked by scikit-learn's
    ``check_classification_targets`` and sorted.
    """
    if y.size and (y.dtype.kind == "i" or (y.dtype.kind == "u" and y.dtype.itemsize < 8)):
        lo, hi = int(y.min()), int(y.max())
        if hi - lo <= 4 * y.size + 1024:
            offset = y.astype(np.int64, copy=False) - lo if lo else y.astype(np.int64, copy=False)
            present = np.bincount(offset, minlength=hi - lo + 1) > 0
            labels = (np.flatnonzero(present) + lo).astype(y.dtype)
            if present.all():  # the codes are the offsets
                return labels, offset
            return labels, (np.cumsum(present) - 1)[offset]
    check_classification_targets(y)
    labels, codes = np.unique(y, return_inverse=True)  # one sort: labels and codes
    return labels, codes.reshape(-1)


# from this many values the range scan runs on chunks in threads (numpy's reductions
# release the GIL); below it one pass is faster than starting them
_PARALLEL_SCAN_VALUES = 1 << 23


def _min_max(values: np.ndarray) -> tuple[float, float]:
    """(min, max) of a float array, NaN if any value is NaN."""
    if values.size < _PARALLEL_SCAN_VALUES:
        return float(values.min()), float(values.max())
    chunks = np.array_split(values, min(8, os.cpu_count() or 1))
    with ThreadPoolExecutor(len(chunks), thread_name_prefix="gpustat-scan") as pool:
        ranges = np.array(list(pool.map(lambda c: (c.min(), c.max()), chunks)))
    return float(ranges[:, 0].min()), float(ranges[:, 1].max())


def _value_range(values: np.ndarray, name: str) -> tuple[float, float] | None:
    """(min, max) of float64 ``values`` (None when there are none); NaN or infinity raise
    scikit-learn's messages (the range serves every later check)."""
    if not values.size:
        return None
    lo, hi = _min_max(values)  # a NaN anywhere gives NaN
    if np.isnan(lo) or np.isnan(hi):
        raise ValueError(f"Input {name} contains NaN.")
    if np.isinf(lo) or np.isinf(hi):
        raise ValueError(f"Input {name} contains infinity or a value too large for "
                         f"dtype('float64').")
    return lo, hi


def _canonical_csr(X, value_range) -> tuple[sp.csr_matrix, tuple[float, float] | None]:
    """Float64 CSR ``X`` with stored values in ``value_range`` (:func:`_value_range`) as
    canonical CSR (duplicates summed, explicit zeros dropped, indices sorted), and its
    values' range. A canonical input is shared (read only, never written); any other is
    copied."""
    may_hold_zeros = value_range is not None and value_range[0] <= 0 <= value_range[1]
    if X.has_canonical_format and not (may_hold_zeros and np.count_nonzero(X.data) < X.nnz):
        return X, value_range
    X = X.copy()
    X.sum_duplicates()  # sorts the indices too
    X.eliminate_zeros()
    return X, _value_range(X.data, "X")


class _FactorizationMachine(BaseEstimator):
    """Shared fit/predict machinery; subclasses fix the model and the task."""

    _model: str = "fm"
    _is_classifier = False

    # ------------------------------------------------------------ validation

    def _check_params(self):
        check_int(self.n_factors, "n_factors", 1)
        check_int(self.max_iter, "max_iter", 1)
        check_int(self.batch_size, "batch_size", 1)
        check_int(self.patience, "patience", 1)
        for name in ("l1_linear", "l1_factors", "l2_linear", "l2_factors", "init_scale",
                     "min_delta", "epsilon", "ftrl_beta"):
            check_real(getattr(self, name), name, 0)
        check_real(self.learning_rate, "learning_rate", 0, low_open=True)
        for name in ("beta_1", "beta_2"):
            check_real(getattr(self, name), name, 0, 1)
        if not 0 < self.validation_fraction < 1:
            raise ValueError(f"validation_fraction must be in (0, 1), got "
                             f"{self.validation_fraction=!r}")
        custom = isinstance(self.optimizer, optax.GradientTransformation)
        if not custom and self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS} or an optax "
                             f"GradientTransformation, got {self.optimizer=!r}")
        if (self.l1_linear or self.l1_factors) and self.optimizer != "ftrl":
            raise ValueError(f"l1_linear/l1_factors need optimizer='ftrl' (the only one with "
                             f"exact L1 zeros), got optimizer={self.optimizer!r} with "
                             f"{self.l1_linear=}, {self.l1_factors=}")
        if self.dtype not in ("float32", "float64"):
            raise ValueError(f"dtype must be 'float32' or 'float64', got {self.dtype=!r}")
        n_jobs = self.n_jobs
        if not (n_jobs is None or n_jobs == -1 or (isinstance(n_jobs, numbers.Integral)
                                                   and not isinstance(n_jobs, bool)
                                                   and n_jobs >= 1)):
            raise ValueError(f"n_jobs must be None, -1 or a positive integer, got {n_jobs=!r}")
        if self.dtype == "float64" and not jax.config.jax_enable_x64:
            raise ValueError("dtype='float64' needs 64-bit JAX: call "
                             "jax.config.update('jax_enable_x64', True) first")
        if self._is_classifier:
            if self.loss not in CLASSIFIER_LOSSES:
                raise ValueError(f"loss must be one of {CLASSIFIER_LOSSES}, got {self.loss=!r}")
            if not 0 <= self.label_smoothing < 1:
                raise ValueError(f"label_smoothing must be in [0, 1), got "
                                 f"{self.label_smoothing=!r}")
            cw = self.class_weight
            if not (cw is None or cw == "balanced" or isinstance(cw, dict)):
                raise ValueError(f"class_weight must be None, 'balanced' or a dict, got {cw!r}")
        return fm_train.scatter_backend(self.backend)

    def _validate_X(self, X, *, reset: bool) -> tuple[sp.csr_matrix, bool]:
        """:meth:`_prepared_X` of X after scikit-learn's checks."""
        return self._prepared_X(self._checked_X(X, reset=reset))

    def _checked_X(self, X, *, reset: bool):
        """scikit-learn's validation of X (shape, type, feature names), its values' check
        left to :meth:`_prepared_X`."""
        if sp.issparse(X) and X.dtype.kind in "biu":
            # widened first: converting to CSR sums duplicates in X's dtype (int8 wraps)
            X = X.astype(np.float64)
        return validate_data(self, X, accept_sparse="csr", dtype=np.float64, reset=reset,
                             ensure_all_finite=False)

    def _scanned_X(self, X) -> tuple[sp.csr_matrix, tuple[float, float] | None]:
        """``X`` as float64 CSR and the range of its stored values, checked: finite and held
        by the training dtype."""
        X = sp.csr_matrix(X, dtype=np.float64)  # shares the arrays of a float64 CSR input
        value_range = _value_range(X.data, "X")
        if value_range is not None:
            self._check_representable(*value_range, "X")
        return X, value_range

    def _prepared_X(self, X) -> tuple[sp.csr_matrix, bool]:
        """Canonical float64 CSR ``X`` of finite values the training dtype holds, and
        whether every stored value is 1 (one-hot rows)."""
        X, value_range = self._scanned_X(X)
        X, canonical_range = _canonical_csr(X, value_range)
        if canonical_range is not None and canonical_range != value_range:
            self._check_representable(*canonical_range, "X")  # duplicates were summed
        return X, canonical_range is None or canonical_range == (1.0, 1.0)

    def _check_representable(self, lo, hi, name):
        """Reject finite values (in [lo, hi]) the training dtype cannot hold (they would
        become inf); float64 training holds them all."""
        dtype = self._np_dtype()
        largest = max(-float(lo), float(hi))
        if dtype != np.float64 and largest > float(np.finfo(dtype).max):
            raise ValueError(f"{name} has values up to {largest:.3g}, beyond the range of "
                             f"dtype={self.dtype!r}: use dtype='float64'")

    def _check_representable_values(self, values, name):
        if np.size(values):
            self._check_representable(values.min(), values.max(), name)

    def _validate_fields(self, field_ids, n_features: int, *, first: bool) -> np.ndarray:
        if not first:
            if field_ids is not None and not np.array_equal(np.asarray(field_ids),
                                                            self.field_ids_):
                raise ValueError("field_ids differ from the ones fixed at the first fit call")
            return self.field_ids_
        if field_ids is None:
            fields = np.arange(n_features) if self._model != "fm" else np.zeros(n_features)
            return fields.astype(np.int64)
        fields = np.asarray(field_ids)
        if fields.shape != (n_features,):
            raise ValueError(f"field_ids must have one entry per feature: expected shape "
                             f"({n_features},), got {fields.shape=}")
        if fields.size and not np.issubdtype(fields.dtype, np.integer):
            if (not np.issubdtype(fields.dtype, np.floating) or not np.all(np.isfinite(fields))
                    or np.any(fields != np.round(fields))):
                raise ValueError(f"field_ids must be integers, got dtype {fields.dtype}")
        if fields.size and fields.min() < 0:
            raise ValueError(f"field_ids must be non-negative, got min(field_ids)="
                             f"{fields.min()}")
        return fields.astype(np.int64)

    def _eval_data(self, eval_set, n_features):
        """(X_val, whether its values are all 1, y_val) from ``eval_set`` = (X, y) or
        [(X, y)]."""
        if isinstance(eval_set, list) and len(eval_set) != 1:
            # xgboost-style [(X_train, y_train), (X_val, y_val)] would stop on the first pair
            raise ValueError(f"eval_set must be (X_val, y_val) or a list of one such pair, got "
                             f"a list of {len(eval_set)}")
        item = eval_set[0] if isinstance(eval_set, list) else eval_set
        try:
            X_val, y_val = item
        except (TypeError, ValueError) as exc:
            raise ValueError("eval_set must be (X_val, y_val) or [(X_val, y_val)]") from exc
        X_val, ones = self._validate_X(X_val, reset=False)
        y_val = column_or_1d(y_val, warn=True)
        if len(y_val) != X_val.shape[0]:
            raise ValueError(f"eval_set: X has {X_val.shape[0]} rows but y has {len(y_val)}")
        return X_val, ones, y_val

    # ------------------------------------------------------------ parameters

    @property
    def _n_outputs(self) -> int:
        return len(self.classes_) if self._loss() == "softmax" else 1

    def _loss(self) -> str:
        """The training loss: squared (regressor), softmax (more than 2 classes, or
        ``loss="softmax"``: one parameter set per class) or logistic."""
        if not self._is_classifier:
            return "squared"
        return "softmax" if len(self.classes_) > 2 or self.loss == "softmax" else "logistic"

    def _np_dtype(self):
        return np.dtype(self.dtype)

    def _init_public(self, rng, n_features, n_fields):
        """Spec init in the public layout (``V_`` shape drawn in one call)."""
        c, k = self._n_outputs, self.n_factors
        lead = (c,) if c > 1 else ()
        if self._model == "ffm":
            shape = (*lead, n_features, n_fields, k)
            try:
                V = rng.uniform(0.0, self.init_scale / math.sqrt(k), size=shape)
            except MemoryError as exc:  # e.g. no field_ids: one field per feature
                raise MemoryError(
                    f"FFM factors V_ of shape {shape} ({math.prod(shape) * 8 / 2**30:.3g} GiB "
                    f"in float64) do not fit in host memory: n_fields={n_fields}; pass "
                    "field_ids grouping the features into fewer fields") from exc
        else:
            V = rng.normal(0.0, self.init_scale, size=(*lead, n_features, k))
        params = {"w0": np.zeros(lead), "w": np.zeros((*lead, n_features)), "V": V}
        if self._model == "fwfm":
            params["r"] = np.ones((*lead, n_fields, n_fields))
        return params

    def _public(self):
        params = {"w0": np.asarray(self.w0_), "w": self.w_, "V": self.V_}
        if self._model == "fwfm":
            params["r"] = self.r_
        return params

    def _to_internal(self, public):
        """Public layout -> internal (class axis after the feature axis), on the device.

        Features and fields are zero-padded to their compile bucket; no data row
        refers to the padding, so it is never touched and never moves.
        """
        dtype = self._np_dtype()
        single = self._n_outputs == 1
        out = {}
        for name, value in public.items():
            value = np.asarray(value)  # cast once, below, into the padded array
            if single:
                value = value[None]
            out[name] = value if name in ("w0", "r") else np.moveaxis(value, 0, 1)
        p, n_fields = out["w"].shape[0], self._n_fields_of(public)
        p_pad = fm_train.bucket(p, 16)
        # fields: at least 8 while the padded FFM table stays small (few compiles)
        small = p_pad * 8 * out["w"].shape[1] * self.n_factors <= 1 << 22
        f_pad = fm_train.bucket(n_fields, 8 if small and self._model != "fm" else 1)
        pads = {"w": [(0, p_pad - p), (0, 0)], "V": [(0, p_pad - p)] + [(0, 0)] * 2}
        if self._model == "ffm":
            pads["V"] = [(0, p_pad - p), (0, 0), (0, f_pad - n_fields), (0, 0)]
        if self._model == "fwfm":
            pads["r"] = [(0, 0), (0, f_pad - n_fields), (0, f_pad - n_fields)]
        padded = {}
        for name, value in out.items():
            shape = [n + after for n, (_, after) in zip(value.shape, pads.get(name, []))]
            padded[name] = np.zeros(shape + list(value.shape[len(shape):]), dtype)
            padded[name][tuple(slice(n) for n in value.shape)] = value
        return jax.device_put(padded)

    def _n_fields_of(self, public):
        if self._model == "ffm":
            return public["V"].shape[-2]
        if self._model == "fwfm":
            return public["r"].shape[-1]
        return 1

    def _store(self, internal, n_features, n_fields):
        """Internal (padded) -> public attributes ``w0_``, ``w_``, ``V_``, ``r_``."""
        single = self._n_outputs == 1
        for name, value in jax.device_get(internal).items():
            value = np.asarray(value) if name in ("w0", "r") else np.moveaxis(value, 1, 0)
            if name in ("w", "V"):
                value = value[:, :n_features]
            if name == "V" and self._model == "ffm":
                value = value[:, :, :n_fields]
            if name == "r":
                value = value[:, :n_fields, :n_fields]
            value = value[0] if single else value
            if name == "w0":
                self.w0_ = float(value) if single else value
            else:
                setattr(self, f"{name}_", value)

    def _optimizer(self):
        return fm_train.make_optimizer(
            self.optimizer, model=self._model, learning_rate=float(self.learning_rate),
            beta_1=float(self.beta_1), beta_2=float(self.beta_2), epsilon=float(self.epsilon),
            ftrl_beta=float(self.ftrl_beta), l1_linear=float(self.l1_linear),
            l1_factors=float(self.l1_factors), l2_linear=float(self.l2_linear),
            l2_factors=float(self.l2_factors))

    # ------------------------------------------------------------ training

    def _targets(self, y_codes, dtype=np.float64):
        """(n, C) training targets from label codes (classifier) or values (regressor)."""
        if not self._is_classifier:
            return np.asarray(y_codes, dtype)[:, None]
        eps = self.label_smoothing
        if self._loss() == "logistic":
            return (y_codes * (1 - eps) + eps / 2).astype(dtype)[:, None]
        c = len(self.classes_)
        t = np.full((len(y_codes), c), eps / (c - 1), dtype)
        t[np.arange(len(y_codes)), y_codes] = 1 - eps
        return t

    def _row_weights(self, X, y_codes, sample_weight, *, whole_data: bool):
        """sample_weight x class_weight[y] per row (validated).

        ``whole_data`` (``fit``) also requires a positive weight and two classes
        with positive weight; ``partial_fit`` chunks may hold one class.
        """
        if sample_weight is None and not (self._is_classifier and self.class_weight is not None):
            # ones: finite, representable, and every class present in y has weight
            return np.ones(X.shape[0])
        sw = _check_sample_weight(sample_weight, X, dtype=np.float64, ensure_non_negative=True)
        if not np.all(np.isfinite(sw)):
            raise ValueError("sample_weight must be finite")
        if whole_data and not np.any(sw > 0):
            raise ValueError("sample_weight must contain at least one positive weight")
        if self._is_classifier and self.class_weight is not None:
            c = len(self.classes_)
            if self.class_weight == "balanced":
                per_class = len(y_codes) / (c * np.maximum(np.bincount(y_codes, minlength=c), 1))
            else:
                per_class = self._class_weight_dict()
            sw = sw * per_class[y_codes]
        self._check_representable_values(sw, "sample_weight")
        if whole_data and self._is_classifier:
            alive = np.flatnonzero(np.bincount(y_codes, weights=sw > 0))
            if len(alive) < 2:
                raise ValueError(f"only one class ({self.classes_[alive].tolist()}) has a "
                                 "positive sample weight: a classifier needs two")
        return sw

    def _class_weight_dict(self) -> np.ndarray:
        """Per-class weights of a ``class_weight`` dict (1 for classes it leaves out)."""
        labels = self.classes_.tolist()
        unknown = [key for key in self.class_weight if key not in labels]
        if unknown:
            raise ValueError(f"class_weight has keys {unknown} that are not classes "
                             f"(classes_={labels})")
        try:
            weights = np.array([self.class_weight.get(label, 1.0) for label in labels],
                               np.float64)
        except (TypeError, ValueError):
            weights = np.array([np.nan])
        if not np.all(np.isfinite(weights) & (weights >= 0)):
            raise ValueError(f"class_weight values must be finite and >= 0, got "
                             f"{self.class_weight!r}")
        return weights

    def _metric(self, scores, y_codes):
        """Validation metric: logloss, softmax cross-entropy or 1/2 MSE (float64)."""
        s = np.asarray(scores, np.float64)
        loss = self._loss()
        if loss == "squared":
            return float(0.5 * np.mean((s[:, 0] - y_codes) ** 2))
        if loss == "logistic":
            z = s[:, 0]
            return float(np.mean(np.maximum(z, 0) - z * y_codes + np.log1p(np.exp(-np.abs(z)))))
        s = s - s.max(axis=1, keepdims=True)
        log_p = s - np.log(np.exp(s).sum(axis=1, keepdims=True))
        return float(-np.mean(log_p[np.arange(len(y_codes)), y_codes]))

    @collector_paused()  # the first call traces and compiles the training programs
    def _train(self, X, y_codes, weights, *, orders, epochs, params, opt_state, eval_data,
               backend, fields, ones):
        """Run an epoch per row order the iterator ``orders`` yields (drawn as needed; at
        most ``epochs``).

        ``ones``: whether every stored value of X is 1 (:meth:`_prepared_X`);
        ``eval_data``: None or (X_val, its ``ones``, y_val's codes).
        Without ``eval_data`` and ``verbose`` the rows go to the device in one
        transfer and all epochs run in one compiled program; the parameters,
        state and losses come back in one copy at the end.

        Returns:
            ``(params, opt_state, losses, val_scores)`` on the host: ``losses`` the
            weighted mean training loss of each epoch run, ``val_scores`` the
            validation metric of each epoch (None without ``eval_data``).
        """
        tx, lazy, (l2_linear, l2_factors) = self._optimizer()
        n_fields = params["r"].shape[-1] if self._model == "fwfm" else (
            params["V"].shape[2] if self._model == "ffm" else 1)
        cfg = fm_train.TrainConfig(self._model, self._loss(), params["w"].shape[0], n_fields,
                                   int(self.batch_size), tx, lazy, l2_linear, l2_factors, backend)
        dtype = self._np_dtype()
        rows = fm_train.host_rows(X, fields, self._targets(y_codes, dtype), weights, dtype,
                                  ones=ones)
        total_weight = max(float(weights.sum()), np.finfo(np.float64).tiny)
        if eval_data is None and not self.verbose:
            # a fresh state (opt_state None) starts inside the one program
            params, opt_state, sums = fm_train.fit_epochs(cfg, params, opt_state, rows, orders,
                                                          epochs)
            params, opt_state, sums = jax.device_get((params, opt_state, sums))
            losses = np.concatenate([group[:count] for group, count in sums]) / total_weight
            return params, opt_state, losses.tolist(), None
        if opt_state is None:
            opt_state = fm_train.init_state(tx, params)
        data = fm_train._ell_layout(rows.z, *jax.device_put(rows.arrays))
        val_rows = None
        if eval_data is not None:
            X_val, val_ones, y_val_codes = eval_data
            val_rows = fm_train.to_device_rows(X_val, fields, np.zeros((X_val.shape[0], 1)),
                                               np.zeros(X_val.shape[0]), dtype, val_ones)
        bar = None
        if self.verbose:
            from tqdm.auto import tqdm

            bar = tqdm(total=self.max_iter, desc=type(self).__name__, unit="epoch")
        best = (np.inf, params, opt_state)
        stale = 0
        losses, val_scores = [], []
        for order in orders:
            params, opt_state, loss_sum = fm_train.train_epoch(cfg, params, opt_state, data, order)
            losses.append(float(loss_sum) / total_weight)
            postfix = {"loss": losses[-1]}
            if val_rows is not None:
                scores = fm_train.decision_scores(self._model, params, val_rows)
                metric = self._metric(scores[: X_val.shape[0]], y_val_codes)
                val_scores.append(metric)
                postfix["val"] = metric
                if metric < best[0] - self.min_delta:
                    best, stale = (metric, params, opt_state), 0
                else:
                    stale += 1
            if bar is not None:
                bar.set_postfix(postfix)
                bar.update()
            if val_rows is not None and stale >= self.patience:
                break
        if bar is not None:
            bar.close()
        if val_rows is not None:
            params, opt_state = best[1], best[2]
        params, opt_state = jax.device_get((params, opt_state))
        return params, opt_state, losses, (None if val_rows is None else val_scores)

    def _encode(self, y, *, first, classes=None):
        """Label codes (classifier) or float targets (regressor); sets ``classes_``."""
        if not self._is_classifier:
            y = column_or_1d(y, warn=True).astype(np.float64)
            if not np.all(np.isfinite(y)):
                raise ValueError("y contains NaN or infinity")
            self._check_representable_values(y, "y")
            return y
        y = column_or_1d(y, warn=True)
        labels, codes = _label_codes(y)  # the few distinct labels, then each row's
        if first and classes is None:
            if len(labels) < 2:
                raise ValueError(f"a classifier needs at least 2 classes, got only one class: "
                                 f"{labels.tolist()}")
            self.classes_ = labels
            return codes
        if first:
            labels_all = unique_labels(np.asarray(classes))
            if len(labels_all) < 2:
                raise ValueError(f"a classifier needs at least 2 classes, got only one class: "
                                 f"{labels_all.tolist()}")
            self.classes_ = labels_all
        elif classes is not None and not np.array_equal(unique_labels(np.asarray(classes)),
                                                        self.classes_):
            raise ValueError(f"classes={list(classes)} differ from classes_="
                             f"{self.classes_.tolist()} of the first call")
        unknown = ~np.isin(labels, self.classes_)
        if np.any(unknown):
            raise ValueError(f"y contains labels {labels[unknown].tolist()} not in "
                             f"classes_={self.classes_.tolist()}")
        return np.searchsorted(self.classes_, labels)[codes]

    @contextlib.contextmanager
    def _restored_on_error(self):
        """Input validation sets ``classes_`` and ``n_features_in_`` before a fit can still be
        rejected (e.g. a ``warm_start`` with other classes): put them back if it is, so an
        earlier fitted model stays usable."""
        names = ("classes_", "n_features_in_", "feature_names_in_")
        saved = {name: getattr(self, name) for name in names if hasattr(self, name)}
        try:
            yield
        except BaseException:
            for name in names:
                if name in saved:
                    setattr(self, name, saved[name])
                elif hasattr(self, name):
                    delattr(self, name)
            raise

    def _fit(self, X, y, field_ids, sample_weight, eval_set):
        with self._restored_on_error():
            return self._fit_validated(X, y, field_ids, sample_weight, eval_set)

    def _fit_validated(self, X, y, field_ids, sample_weight, eval_set):
        backend = self._check_params()
        fitted_classes = getattr(self, "classes_", None)
        X, y = validate_data(self, X, y, accept_sparse="csr", dtype=np.float64,
                             y_numeric=not self._is_classifier, reset=True,
                             ensure_all_finite=False)
        fields = self._validate_fields(field_ids, X.shape[1], first=True)
        y_codes = self._encode(y, first=True)
        rng = np.random.default_rng(self.random_state)
        eval_data = split = None
        if eval_set is not None:
            X_val, val_ones, y_val = self._eval_data(eval_set, X.shape[1])
            if self._is_classifier:
                check_classification_targets(y_val)
                unknown = ~np.isin(y_val, self.classes_)
                if np.any(unknown):
                    raise ValueError(f"eval_set contains labels {np.unique(y_val[unknown])} "
                                     f"not seen in y (classes_={self.classes_.tolist()})")
            eval_data = (X_val, val_ones, self._encode(y_val, first=False))
        elif self.early_stopping:
            perm = rng.permutation(X.shape[0])
            n_val = max(1, round(self.validation_fraction * X.shape[0]))
            if n_val >= X.shape[0]:
                raise ValueError(f"validation_fraction={self.validation_fraction} leaves no "
                                 f"training rows out of {X.shape[0]}")
            split = perm[:n_val], perm[n_val:]
        resume = self.warm_start and hasattr(self, "w0_")
        if resume:
            self._check_resume(X.shape[1], fields, fitted_classes)
            params, opt_state = self._to_internal(self._public()), self._resume_state()
        else:
            params, opt_state = self._to_internal(self._init_public(rng, X.shape[1],
                                                                    int(fields.max()) + 1)), None
        n_rows = X.shape[0] if split is None else len(split[1])
        # the epoch orders (max_iter orders of n rows need not fit in memory at once) are
        # drawn a few ahead, side by side, by worker threads while this one checks, packs
        # and sends the rows
        with contextlib.closing(epoch_orders(rng, n_rows, self.max_iter,
                                             ahead=min(self.max_iter, 4))) as orders:
            weights = self._row_weights(X, y_codes, sample_weight, whole_data=True)
            if split is not None:
                val_idx, tr_idx = split
                eval_data = (*self._prepared_X(X[val_idx]), y_codes[val_idx])
                X, y_codes, weights = X[tr_idx], y_codes[tr_idx], weights[tr_idx]
            X, ones = self._prepared_X(X)
            params, opt_state, losses, val_scores = self._train(
                X, y_codes, weights, orders=orders, epochs=self.max_iter, params=params,
                opt_state=opt_state, eval_data=eval_data, backend=backend, fields=fields,
                ones=ones)
        self.field_ids_ = fields
        self.n_fields_ = int(fields.max()) + 1
        self._store(params, X.shape[1], self.n_fields_)
        self._opt_state = (self._optimizer_key(), opt_state)
        self.n_iter_ = len(losses)
        # warm_start continues the curves, as scikit-learn's MLP does
        earlier = resume and getattr(self, "loss_curve_", None) is not None
        self.loss_curve_ = (self.loss_curve_ if earlier else []) + losses
        self.validation_scores_ = None if val_scores is None else (
            ((resume and getattr(self, "validation_scores_", None)) or []) + val_scores)
        return self

    def _partial_fit(self, X, y, classes, field_ids, sample_weight):
        with self._restored_on_error():
            return self._partial_fit_validated(X, y, classes, field_ids, sample_weight)

    def _partial_fit_validated(self, X, y, classes, field_ids, sample_weight):
        backend = self._check_params()
        first = not hasattr(self, "w0_")
        if first and self._is_classifier and classes is None:
            raise ValueError("classes must be passed on the first call to partial_fit")
        if self._is_classifier and self.class_weight == "balanced":
            raise ValueError("class_weight='balanced' needs all labels at once; use fit")
        X, ones = self._validate_X(X, reset=first)
        fields = self._validate_fields(field_ids, X.shape[1], first=first)
        y_codes = self._encode(y, first=first, classes=classes)
        if len(y_codes) != X.shape[0]:
            raise ValueError(f"X has {X.shape[0]} rows but y has {len(y_codes)}")
        sw = self._row_weights(X, y_codes, sample_weight, whole_data=False)
        if first:
            rng = np.random.default_rng(self.random_state)
            params = self._to_internal(self._init_public(rng, X.shape[1], int(fields.max()) + 1))
            # started here, not in the training program: every chunk then runs the same
            # program (a fresh and a continued state would be two)
            opt_state = fm_train.init_state(self._optimizer()[0], params)
            self.n_iter_ = 0
        else:
            self._check_outputs()
            params, opt_state = self._to_internal(self._public()), self._resume_state()
        params, opt_state, losses, _ = self._train(
            X, y_codes, sw, orders=iter([np.arange(X.shape[0])]), epochs=1, params=params,
            opt_state=opt_state, eval_data=None, backend=backend, fields=fields, ones=ones)
        self.field_ids_ = fields
        self.n_fields_ = int(fields.max()) + 1
        self._store(params, X.shape[1], self.n_fields_)
        self._opt_state = (self._optimizer_key(), opt_state)
        self.n_iter_ += 1
        self.loss_curve_ = ([] if first else getattr(self, "loss_curve_", [])) + losses
        if first:
            self.validation_scores_ = None
        return self

    def _optimizer_key(self):
        names = ("optimizer", "learning_rate", "beta_1", "beta_2", "epsilon", "ftrl_beta",
                 "l1_linear", "l1_factors", "l2_linear", "l2_factors", "dtype")
        return repr([getattr(self, n) for n in names])

    def _resume_state(self):
        """Stored optimizer state when it belongs to the current settings, else None (fresh)."""
        key, state = getattr(self, "_opt_state", (None, None))
        if key != self._optimizer_key():
            return None
        return jax.device_put(state)

    def _check_resume(self, n_features, fields, fitted_classes):
        # n_features_in_ and classes_ are already reset to the new data here: compare
        # with w_ and the classes_ from before the call
        if n_features != np.shape(self.w_)[-1] or not np.array_equal(fields, self.field_ids_):
            raise ValueError("warm_start needs the same features and field_ids as the first fit")
        # the same labels, not only as many: parameters belong to class positions
        if self._is_classifier and not np.array_equal(fitted_classes, self.classes_):
            raise ValueError(f"warm_start needs the same classes as the first fit: fitted with "
                             f"classes_={fitted_classes.tolist()}, now y has "
                             f"{self.classes_.tolist()}")
        self._check_outputs()

    def _check_outputs(self):
        """The fitted parameters have the current loss's parameter sets (``loss`` unchanged)."""
        fitted = np.shape(self.w_)[0] if np.ndim(self.w_) == 2 else 1
        if fitted != self._n_outputs:
            raise ValueError(f"the model was fitted with {fitted} parameter set(s); loss="
                             f"{self.loss!r} needs {self._n_outputs}: continue with the loss "
                             "it was fitted with")

    # ------------------------------------------------------------ prediction

    def _scores(self, X) -> np.ndarray:
        check_is_fitted(self)
        X, ones = self._validate_X(X, reset=False)
        rows = fm_train.to_device_rows(X, self.field_ids_, np.zeros((X.shape[0], 1)),
                                       np.zeros(X.shape[0]), self._np_dtype(), ones)
        scores = fm_train.decision_scores(self._model, self._to_internal(self._public()), rows)
        return np.asarray(scores[: X.shape[0]])

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        return tags

    # ------------------------------------------------------------ inspection and I/O

    def top_interactions(self, n_top: int = 10, class_idx: int | None = None):
        """The ``n_top`` strongest learned pairwise interactions.

        Strength of a feature pair (i < j): FM ``|<V_i, V_j>|``, FFM
        ``|<V[i, f(j)], V[j, f(i)]>|``, FwFM ``|r_{f(i) f(j)} <V_i, V_j>|``.
        Exact scan over all pairs in blocks of rows (O(p^2 k)).

        Args:
            n_top: number of pairs to return (>= 1).
            class_idx: class whose parameters to inspect; required for a
                multiclass model, rejected otherwise.

        Returns:
            list of ``(i, j, strength)`` sorted by decreasing strength.
        """
        check_is_fitted(self)
        check_int(n_top, "n_top", 1)
        V = np.asarray(self.V_, np.float64)
        r = np.asarray(self.r_, np.float64) if self._model == "fwfm" else None
        if self._n_outputs > 1:
            if class_idx is None or not 0 <= class_idx < self._n_outputs:
                raise ValueError(f"a multiclass model needs class_idx in [0, {self._n_outputs}),"
                                 f" got {class_idx=}")
            V = V[class_idx]
            r = r[class_idx] if r is not None else None
        elif class_idx is not None:
            raise ValueError(f"class_idx is only for multiclass models, got {class_idx=}")
        return _top_pairs(self._model, V, r, self.field_ids_, n_top)

    def save_model(self, path) -> None:
        """Write the constructor parameters, learned attributes and optimizer state (pickle)."""
        check_is_fitted(self)
        state = {"format_version": _IO_VERSION, "class": type(self).__name__,
                 "params": self.get_params(),
                 "attrs": {k: v for k, v in vars(self).items() if k.endswith("_")},
                 "opt_state": getattr(self, "_opt_state", None)}
        with open(path, "wb") as fh:
            pickle.dump(state, fh)

    @classmethod
    def load_model(cls, path):
        """Read a model written by :meth:`save_model` (same class; continues training)."""
        with open(path, "rb") as fh:
            state = pickle.load(fh)
        if state.get("format_version", 0) > _IO_VERSION:
            raise ValueError(f"{path!r} has format_version {state['format_version']}; this "
                             f"gpustat reads <= {_IO_VERSION}")
        if state.get("class") != cls.__name__:
            raise ValueError(f"{path!r} holds a {state.get('class')!r}, not a {cls.__name__!r}")
        model = cls(**state["params"])
        for key, value in state["attrs"].items():
            setattr(model, key, value)
        if state.get("opt_state") is not None:
            model._opt_state = state["opt_state"]
        return model


def _top_pairs(model, V, r, fields, n_top):
    p = V.shape[0]
    r_full = None if r is None else np.triu(r) + np.triu(r, 1).T
    block = max(1, (1 << 22) // max(1, p * V.shape[-1]))
    cand_i, cand_j, cand_s = [], [], []
    for start in range(0, p, block):
        rows = np.arange(start, min(start + block, p))
        if model == "ffm":
            # S[i, j] = <V[i, f(j)], V[j, f(i)]>
            left = V[rows][:, fields, :]  # (b, p, k)
            right = np.moveaxis(V[:, fields[rows], :], 1, 0)  # (b, p, k)
            S = np.abs((left * right).sum(-1))
        else:
            S = np.abs(V[rows] @ V.T)
            if r_full is not None:
                S = S * np.abs(r_full[fields[rows][:, None], fields[None, :]])
        S[np.arange(p)[None, :] <= rows[:, None]] = -1.0  # pairs i < j only
        flat = S.ravel()
        take = min(n_top, flat.size)
        best = np.argpartition(-flat, take - 1)[:take]
        best = best[flat[best] >= 0]
        cand_i.append(rows[best // p])
        cand_j.append(best % p)
        cand_s.append(flat[best])
    i, j, s = (np.concatenate(c) for c in (cand_i, cand_j, cand_s))
    order = np.lexsort((j, i, -s))[:n_top]
    return [(int(i[t]), int(j[t]), float(s[t])) for t in order]


class _ClassifierMixin(ClassifierMixin):
    _is_classifier = True

    def fit(self, X: ArrayLike, y: ArrayLike, field_ids: ArrayLike | None = None,
            sample_weight: ArrayLike | None = None, eval_set=None):
        """Train from scratch (or continue with ``warm_start``) for ``max_iter`` epochs.

        Args:
            X: (n, p) dense array, scipy sparse matrix (duplicates summed) or
                DataFrame; finite values; exact zeros are skipped.
            y: (n,) class labels (2 classes: logistic loss; more: softmax).
            field_ids: (p,) non-negative int field of each feature (FFM/FwFM;
                default: each feature its own field). Fixed at the first call.
            sample_weight: (n,) non-negative row weights.
            eval_set: (X_val, y_val) or [(X_val, y_val)] for early stopping.

        Returns:
            self.
        """
        return self._fit(X, y, field_ids, sample_weight, eval_set)

    def partial_fit(self, X: ArrayLike, y: ArrayLike, classes: ArrayLike | None = None,
                    field_ids: ArrayLike | None = None, sample_weight: ArrayLike | None = None):
        """One pass over ``X`` in row order, continuing parameters and optimizer state.

        Args:
            X: (n, p) rows.
            y: (n,) labels.
            classes: all labels; required on the first call.
            field_ids: (p,) fields; fixed at the first call.
            sample_weight: (n,) row weights.

        Returns:
            self.
        """
        return self._partial_fit(X, y, classes, field_ids, sample_weight)

    def decision_function(self, X: ArrayLike) -> np.ndarray:
        """Scores: (n,) logits for 2 classes, (n, C) per-class logits otherwise."""
        scores = self._scores(X)
        return scores[:, 0] if scores.shape[1] == 1 else scores

    def predict_proba(self, X: ArrayLike) -> np.ndarray:
        """(n, C) class probabilities (sigmoid for 2 classes, softmax otherwise)."""
        scores = self._scores(X).astype(np.float64)
        if scores.shape[1] == 1:
            p = 1.0 / (1.0 + np.exp(-scores[:, 0]))
            return np.column_stack([1.0 - p, p])
        scores -= scores.max(axis=1, keepdims=True)
        e = np.exp(scores)
        return e / e.sum(axis=1, keepdims=True)

    def predict(self, X: ArrayLike) -> np.ndarray:
        """(n,) predicted labels."""
        scores = self._scores(X)
        if scores.shape[1] == 1:
            return self.classes_[(scores[:, 0] > 0).astype(int)]
        return self.classes_[np.argmax(scores, axis=1)]


class _RegressorMixin(RegressorMixin):
    _is_classifier = False

    def fit(self, X: ArrayLike, y: ArrayLike, field_ids: ArrayLike | None = None,
            sample_weight: ArrayLike | None = None, eval_set=None):
        """Train from scratch (or continue with ``warm_start``) for ``max_iter`` epochs.

        Args:
            X: (n, p) dense array, scipy sparse matrix (duplicates summed) or
                DataFrame; finite values; exact zeros are skipped.
            y: (n,) finite targets (squared loss).
            field_ids: (p,) non-negative int field of each feature (FFM/FwFM;
                default: each feature its own field). Fixed at the first call.
            sample_weight: (n,) non-negative row weights.
            eval_set: (X_val, y_val) or [(X_val, y_val)] for early stopping.

        Returns:
            self.
        """
        return self._fit(X, y, field_ids, sample_weight, eval_set)

    def partial_fit(self, X: ArrayLike, y: ArrayLike, field_ids: ArrayLike | None = None,
                    sample_weight: ArrayLike | None = None):
        """One pass over ``X`` in row order, continuing parameters and optimizer state.

        Args:
            X: (n, p) rows.
            y: (n,) targets.
            field_ids: (p,) fields; fixed at the first call.
            sample_weight: (n,) row weights.

        Returns:
            self.
        """
        return self._partial_fit(X, y, None, field_ids, sample_weight)

    def predict(self, X: ArrayLike) -> np.ndarray:
        """(n,) predicted values."""
        return self._scores(X)[:, 0]


def _init_common(self, n_factors, optimizer, learning_rate, beta_1, beta_2, epsilon, ftrl_beta,
                 l1_linear, l1_factors, l2_linear, l2_factors, max_iter, batch_size, init_scale,
                 early_stopping, validation_fraction, patience, min_delta, warm_start,
                 random_state, verbose, dtype, backend, n_jobs):
    self.n_factors = n_factors
    self.optimizer = optimizer
    self.learning_rate = learning_rate
    self.beta_1 = beta_1
    self.beta_2 = beta_2
    self.epsilon = epsilon
    self.ftrl_beta = ftrl_beta
    self.l1_linear = l1_linear
    self.l1_factors = l1_factors
    self.l2_linear = l2_linear
    self.l2_factors = l2_factors
    self.max_iter = max_iter
    self.batch_size = batch_size
    self.init_scale = init_scale
    self.early_stopping = early_stopping
    self.validation_fraction = validation_fraction
    self.patience = patience
    self.min_delta = min_delta
    self.warm_start = warm_start
    self.random_state = random_state
    self.verbose = verbose
    self.dtype = dtype
    self.backend = backend
    self.n_jobs = n_jobs


def _classifier_init(default_factors: int, default_iter: int):
    """``__init__`` of a classifier: modern_fm's names and defaults, explicit for scikit-learn."""

    def __init__(self, n_factors=default_factors, loss="logistic", optimizer="adagrad",
                 learning_rate=0.05, beta_1=0.9, beta_2=0.999, epsilon=1e-8, ftrl_beta=1.0,
                 l1_linear=0.0, l1_factors=0.0, l2_linear=1e-5, l2_factors=1e-5,
                 max_iter=default_iter, batch_size=1, init_scale=0.01, early_stopping=False,
                 validation_fraction=0.1, patience=10, min_delta=0.0, warm_start=False,
                 label_smoothing=0.0, class_weight=None, random_state=None, n_jobs=-1,
                 verbose=0, dtype="float32", backend="auto"):
        _init_common(self, n_factors, optimizer, learning_rate, beta_1, beta_2, epsilon,
                     ftrl_beta, l1_linear, l1_factors, l2_linear, l2_factors, max_iter,
                     batch_size, init_scale, early_stopping, validation_fraction, patience,
                     min_delta, warm_start, random_state, verbose, dtype, backend, n_jobs)
        self.loss = loss
        self.label_smoothing = label_smoothing
        self.class_weight = class_weight

    return __init__


def _regressor_init(default_factors: int, default_iter: int):
    """``__init__`` of a regressor: the classifier's names less the label settings (as in
    modern_fm, no ``loss``: squared)."""

    def __init__(self, n_factors=default_factors, optimizer="adagrad", learning_rate=0.05,
                 beta_1=0.9, beta_2=0.999, epsilon=1e-8, ftrl_beta=1.0, l1_linear=0.0,
                 l1_factors=0.0, l2_linear=1e-5, l2_factors=1e-5, max_iter=default_iter,
                 batch_size=1, init_scale=0.01, early_stopping=False, validation_fraction=0.1,
                 patience=10, min_delta=0.0, warm_start=False, random_state=None, n_jobs=-1,
                 verbose=0, dtype="float32", backend="auto"):
        _init_common(self, n_factors, optimizer, learning_rate, beta_1, beta_2, epsilon,
                     ftrl_beta, l1_linear, l1_factors, l2_linear, l2_factors, max_iter,
                     batch_size, init_scale, early_stopping, validation_fraction, patience,
                     min_delta, warm_start, random_state, verbose, dtype, backend, n_jobs)

    return __init__


class FMClassifier(_ClassifierMixin, _FactorizationMachine):
    """Factorization machine classifier (2 classes: logistic; more: softmax), trained on the device.

    Args:
        n_factors: k, factors per feature (per feature and field for FFM); 16 for
            FM, 8 for FFM and FwFM.
        loss: "logistic" (default; softmax anyway for more than 2 classes) or
            "softmax" (also for 2 classes: one parameter set per class), as in
            modern_fm.
        optimizer: "sgd", "adagrad", "adam", "ftrl", or an optax
            ``GradientTransformation``. The named ones (and gpustat's lazy
            transformations passed directly) step only the rows a batch touches:
            a batch's cost does not grow with p. A user's transformation sees
            the data gradient plus L2 on touched coordinates, zero elsewhere,
            and updates with its own (dense) semantics, unless it accepts the
            ``touched`` keyword; it reads and writes the whole (p, ...) gradient,
            parameters and state every batch.
        learning_rate: step size (FTRL's alpha); unused by a user's transformation.
        beta_1: Adam's first-moment decay.
        beta_2: Adam's second-moment decay.
        epsilon: Adam's epsilon (outside the root).
        ftrl_beta: FTRL's beta.
        l1_linear: FTRL's L1 on w (exact zeros); needs optimizer="ftrl".
        l1_factors: FTRL's L1 on V (and r); needs optimizer="ftrl".
        l2_linear: L2 on w (coupled into the gradient; inside FTRL's step for FTRL).
        l2_factors: L2 on V (and r, pulled toward 0).
        max_iter: epochs (modern_fm's defaults: 100 for FM, 50 for FFM and FwFM).
        batch_size: rows per mini-batch; gradients are averaged over the batch
            and every row is scored with the batch-start parameters. 1 is
            modern_fm's per-row default; on a GPU use 1024-8192.
        init_scale: factor initialisation scale.
        early_stopping: hold out ``validation_fraction`` of the rows (or use
            ``eval_set``), stop after ``patience`` epochs without a ``min_delta``
            improvement of the validation loss, restore the best parameters.
        validation_fraction: holdout share for early stopping.
        patience: epochs without improvement before stopping.
        min_delta: least improvement that counts.
        warm_start: continue from the fitted parameters and optimizer state.
        label_smoothing: eps in [0, 1): binary targets ``y (1 - eps) + eps / 2``;
            multiclass ``1 - eps`` on the true class, ``eps / (C - 1)`` elsewhere.
        class_weight: None, "balanced" (``n / (C count_c)``) or {label: weight}.
        random_state: seed of the init and epoch permutations (module docs).
        n_jobs: modern_fm's host thread count (None, -1 or >= 1); validated and
            unused: the training runs on the device.
        verbose: show a progress bar per epoch with training loss and validation metric.
        dtype: "float32" (default) or "float64" (needs ``jax_enable_x64``):
            the dtype of parameters, optimizer state and training arithmetic;
            values of X, y or sample_weight beyond its range raise ValueError.
        backend: "auto", "pallas", "interpret" or "reference": how the sparse
            batch gradient is summed ("auto": XLA's scatter-add, which ties the
            kernel at CTR shapes).

    Attributes:
        w0_: bias (float; (C,) for C > 2 classes).
        w_: linear weights (p,), or (C, p) for C > 2 classes.
        V_: factors (p, k), or (C, p, k) for C > 2 classes.
        classes_: sorted class labels.
        field_ids_: (p,) field of each feature.
        n_fields_: F.
        n_features_in_: p.
        n_iter_: epochs run (each partial_fit call counts one).
        loss_curve_: weighted mean training loss of each epoch (the data loss at
            each batch's start parameters, without L2), like scikit-learn's MLP;
            ``warm_start`` and ``partial_fit`` append.
        validation_scores_: the validation metric of each epoch (logloss,
            softmax cross-entropy or 1/2 MSE: lower is better) when
            ``early_stopping`` or ``eval_set`` evaluates one, else None.
    """

    _model = "fm"
    __init__ = _classifier_init(16, 100)


class FMRegressor(_RegressorMixin, _FactorizationMachine):
    """Factorization machine regressor (squared loss), trained on the device.

    Parameters as :class:`FMClassifier` without ``loss`` (squared), ``label_smoothing``
    and ``class_weight``. Attributes ``w0_`` (float), ``w_`` (p,), ``V_`` (p, k),
    ``field_ids_``, ``n_fields_``, ``n_features_in_``, ``n_iter_``, ``loss_curve_``,
    ``validation_scores_``.
    """

    _model = "fm"
    __init__ = _regressor_init(16, 100)


class FFMClassifier(_ClassifierMixin, _FactorizationMachine):
    """Field-aware factorization machine classifier, trained on the device.

    Parameters and methods as :class:`FMClassifier` (``n_factors`` defaults to
    8); ``fit`` takes ``field_ids``. ``V_`` is (p, F, k), or (C, p, F, k) for
    C > 2 classes.
    """

    _model = "ffm"
    __init__ = _classifier_init(8, 50)


class FFMRegressor(_RegressorMixin, _FactorizationMachine):
    """Field-aware factorization machine regressor (squared loss), trained on the device.

    Parameters as :class:`FMRegressor` (``n_factors`` defaults to 8); ``V_`` is (p, F, k).
    """

    _model = "ffm"
    __init__ = _regressor_init(8, 50)


class FwFMClassifier(_ClassifierMixin, _FactorizationMachine):
    """Field-weighted factorization machine classifier, trained on the device.

    Parameters and methods as :class:`FMClassifier` (``n_factors`` defaults to
    8); ``fit`` takes ``field_ids``. Extra attribute ``r_``: field-pair weights
    (F, F), or (C, F, F) for C > 2 classes, of which the upper triangle with the
    diagonal is read; it starts at 1 and its L2 is ``l2_factors``.
    """

    _model = "fwfm"
    __init__ = _classifier_init(8, 50)


class FwFMRegressor(_RegressorMixin, _FactorizationMachine):
    """Field-weighted factorization machine regressor (squared loss), trained on the device.

    Parameters as :class:`FMRegressor` (``n_factors`` defaults to 8); extra attribute
    ``r_`` (F, F) as in :class:`FwFMClassifier`.
    """

    _model = "fwfm"
    __init__ = _regressor_init(8, 50)
