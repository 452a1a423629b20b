"""NumPy reference trainer for FM / FFM / FwFM, written from the spec's training contract.

Row by row, pair by pair, in float64 (``../shared/specs/factorization.md``,
"Training contract"): each epoch visits the rows in the given order in
contiguous batches; every row of a batch is scored with the parameters frozen
at the batch start; for each touched coordinate
``g = (1/B) sum_rows weight_r dL/ds_r ds_r/dtheta + lambda theta`` (no lambda
term for FTRL, which folds L1/L2 into its step; the bias is never
regularised); coordinates a batch does not touch get no step and no state
change. Parameters use the estimators' public layout: ``w0`` (C,), ``w``
(C, p), ``V`` (C, p, k) or FFM (C, p, F, k), ``r`` (C, F, F).
"""

from __future__ import annotations

import math

import numpy as np


def init_params(model, rng, n_classes, n_features, n_fields, n_factors, init_scale, squeeze):
    """Spec init: w0 = w = 0; FM/FwFM V ~ N(0, s^2); FFM V ~ U(0, s / sqrt(k)); R = 1.

    The draw has the estimators' documented shape: (p, ...) for one output
    (``squeeze``), (C, p, ...) for C > 1 classes.
    """
    lead = () if squeeze else (n_classes,)
    if model == "ffm":
        V = rng.uniform(0.0, init_scale / math.sqrt(n_factors),
                        size=(*lead, n_features, n_fields, n_factors))
    else:
        V = rng.normal(0.0, init_scale, size=(*lead, n_features, n_factors))
    params = {"w0": np.zeros(n_classes), "w": np.zeros((n_classes, n_features)),
              "V": V.reshape(n_classes, *V.shape[len(lead):])}
    if model == "fwfm":
        params["r"] = np.ones((n_classes, n_fields, n_fields))
    return params


def _r(r, a, b):
    return r[min(a, b), max(a, b)]


def score(model, params, c, idx, val, fld):
    """Score of one row for class c, straight from the definitions."""
    s = params["w0"][c] + sum(params["w"][c, i] * x for i, x in zip(idx, val))
    V = params["V"][c]
    for a in range(len(idx)):
        for b in range(a + 1, len(idx)):
            xx = val[a] * val[b]
            if model == "fm":
                s += V[idx[a]] @ V[idx[b]] * xx
            elif model == "ffm":
                s += V[idx[a], fld[b]] @ V[idx[b], fld[a]] * xx
            else:
                s += _r(params["r"][c], fld[a], fld[b]) * (V[idx[a]] @ V[idx[b]]) * xx
    return s


def loss_derivative(loss, s, target):
    """dL/ds per class; ``target`` is the (smoothed) label vector."""
    if loss == "logistic":
        return np.array([1.0 / (1.0 + math.exp(-s[0])) - target[0]])
    if loss == "squared":
        return np.array([s[0] - target[0]])
    e = np.exp(s - s.max())
    return e / e.sum() - target


def _row_gradient(model, params, c, idx, val, fld, g, acc, touched):
    """Add g * ds/dtheta of one row (class c) into ``acc``; mark touched coordinates."""
    V = params["V"][c]
    acc["w0"][c] += g
    for a, (i, x) in enumerate(zip(idx, val)):
        acc["w"][c, i] += g * x
        touched["w"][c, i] = True
        if model == "fm":
            q = sum(V[j] * xj for j, xj in zip(idx, val))
            acc["V"][c, i] += g * (x * q - V[i] * x * x)
            touched["V"][c, i] = True
        elif model == "fwfm":
            touched["V"][c, i] = True
            for b, (j, xj) in enumerate(zip(idx, val)):
                if b != a:
                    acc["V"][c, i] += g * x * _r(params["r"][c], fld[a], fld[b]) * V[j] * xj
    for a in range(len(idx)):
        for b in range(a + 1, len(idx)):
            xx = g * val[a] * val[b]
            if model == "ffm":
                i, j = idx[a], idx[b]
                acc["V"][c, i, fld[b]] += xx * V[j, fld[a]]
                acc["V"][c, j, fld[a]] += xx * V[i, fld[b]]
                touched["V"][c, i, fld[b]] = True
                touched["V"][c, j, fld[a]] = True
            elif model == "fwfm":
                lo, hi = min(fld[a], fld[b]), max(fld[a], fld[b])
                acc["r"][c, lo, hi] += xx * (V[idx[a]] @ V[idx[b]])
                touched["r"][c, lo, hi] = True


class Optimizer:
    """Per-coordinate lazy optimizers of the spec, state starting at 0."""

    def __init__(self, name, params, *, lr, beta_1=0.9, beta_2=0.999, epsilon=1e-8,
                 ftrl_beta=1.0):
        self.name, self.lr = name, lr
        self.b1, self.b2, self.eps, self.beta = beta_1, beta_2, epsilon, ftrl_beta
        self.state = {k: [np.zeros_like(v) for _ in range(3)] for k, v in params.items()}

    def step(self, key, theta, g, mask, l1=0.0, l2=0.0):
        """Update ``theta[mask]`` in place with gradient ``g[mask]``."""
        s0, s1, s2 = self.state[key]
        for pos in zip(*np.nonzero(mask)):
            gi, th = g[pos], theta[pos]
            if self.name == "sgd":
                theta[pos] = th - self.lr * gi
            elif self.name == "adagrad":
                s0[pos] += gi * gi
                theta[pos] = th - self.lr * gi / math.sqrt(s0[pos] + 1e-10)
            elif self.name == "adam":
                s2[pos] += 1
                t = s2[pos]
                s0[pos] = self.b1 * s0[pos] + (1 - self.b1) * gi
                s1[pos] = self.b2 * s1[pos] + (1 - self.b2) * gi * gi
                m_hat = s0[pos] / (1 - self.b1**t)
                v_hat = s1[pos] / (1 - self.b2**t)
                theta[pos] = th - self.lr * m_hat / (math.sqrt(v_hat) + self.eps)
            else:  # FTRL-Proximal: s0 = z, s1 = n
                n_new = s1[pos] + gi * gi
                sigma = (math.sqrt(n_new) - math.sqrt(s1[pos])) / self.lr
                s0[pos] += gi - sigma * th
                s1[pos] = n_new
                z = s0[pos]
                if abs(z) <= l1:
                    theta[pos] = 0.0
                else:
                    theta[pos] = -(z - math.copysign(l1, z)) / (
                        (self.beta + math.sqrt(n_new)) / self.lr + l2)


def train(model, loss, rows, fields, targets, weights, params, opt, orders, *, batch_size,
          l2_linear=0.0, l2_factors=0.0, l1_linear=0.0, l1_factors=0.0):
    """Run the epochs in ``orders`` (a list of row orders); updates ``params`` in place.

    Args:
        rows: list of (feature indices, values) per row (exact zeros removed).
        fields: (p,) field of each feature.
        targets: (n, C) training targets (smoothed labels / regression targets).
        weights: (n,) row weights.
        opt: an :class:`Optimizer` (its state persists across calls).
    """
    n_classes = params["w0"].shape[0]
    ftrl = opt.name == "ftrl"
    lam = {"w": l2_linear, "V": l2_factors, "r": l2_factors}
    l1 = {"w0": 0.0, "w": l1_linear, "V": l1_factors, "r": l1_factors}
    l2 = {"w0": 0.0, "w": l2_linear, "V": l2_factors, "r": l2_factors}
    for order in orders:
        for start in range(0, len(order), batch_size):
            batch = order[start:start + batch_size]
            acc = {k: np.zeros_like(v) for k, v in params.items()}
            touched = {k: np.zeros(v.shape, bool) for k, v in params.items()}
            touched["w0"][:] = True
            for r in batch:
                idx, val = rows[r]
                fld = [fields[i] for i in idx]
                s = np.array([score(model, params, c, idx, val, fld) for c in range(n_classes)])
                g = loss_derivative(loss, s, targets[r]) * weights[r]
                for c in range(n_classes):
                    _row_gradient(model, params, c, idx, val, fld, g[c], acc, touched)
            for key in params:  # every gradient is taken before any update
                acc[key] /= len(batch)
                if not ftrl and key in lam:
                    acc[key] = np.where(touched[key], acc[key] + lam[key] * params[key], acc[key])
            for key in params:
                opt.step(key, params[key], acc[key], touched[key], l1[key], l2[key])
    return params


def targets_for(loss, y, n_classes, label_smoothing):
    """Spec targets: smoothed 0/1 labels, regression values, or smoothed one-hot rows."""
    eps = label_smoothing
    if loss == "squared":
        return np.asarray(y, float)[:, None]
    if loss == "logistic":
        return (np.asarray(y, float) * (1 - eps) + eps / 2)[:, None]
    t = np.full((len(y), n_classes), eps / (n_classes - 1))
    t[np.arange(len(y)), y] = 1 - eps
    return t


def dense_rows(X):
    """Rows of a dense matrix as (indices, values) with exact zeros skipped."""
    return [(np.nonzero(x)[0], x[np.nonzero(x)[0]]) for x in np.asarray(X, float)]
