"""Brute-force per-pair oracles for FM / FFM / FwFM scores and their gradients (numpy loops).

Written from the spec's formulas, independently of gpustat: every pair i < j of a
row's nonzeros is visited explicitly (no FM square-of-sum identity, no masking).
Float64 throughout. Input: a scipy CSR matrix (duplicates already summed).
"""

from __future__ import annotations

import numpy as np


def _row_nonzeros(X, r):
    lo, hi = X.indptr[r], X.indptr[r + 1]
    cols = np.asarray(X.indices[lo:hi])
    vals = np.asarray(X.data[lo:hi], dtype=np.float64)
    keep = vals != 0
    return cols[keep], vals[keep]


def fm_scores(X, w0, w, V):
    w, V = np.asarray(w, np.float64), np.asarray(V, np.float64)
    out = np.empty(X.shape[0])
    for r in range(X.shape[0]):
        cols, x = _row_nonzeros(X, r)
        s = float(w0) + sum(w[c] * v for c, v in zip(cols, x))
        for a in range(len(cols)):
            for b in range(a + 1, len(cols)):
                s += float(V[cols[a]] @ V[cols[b]]) * x[a] * x[b]
        out[r] = s
    return out


def ffm_scores(X, field_ids, w0, w, V):
    w, V = np.asarray(w, np.float64), np.asarray(V, np.float64)
    out = np.empty(X.shape[0])
    for r in range(X.shape[0]):
        cols, x = _row_nonzeros(X, r)
        s = float(w0) + sum(w[c] * v for c, v in zip(cols, x))
        for a in range(len(cols)):
            for b in range(a + 1, len(cols)):
                i, j = cols[a], cols[b]
                s += float(V[i, field_ids[j]] @ V[j, field_ids[i]]) * x[a] * x[b]
        out[r] = s
    return out


def fwfm_scores(X, field_ids, w0, w, V, R):
    w, V, R = (np.asarray(a, np.float64) for a in (w, V, R))
    out = np.empty(X.shape[0])
    for r in range(X.shape[0]):
        cols, x = _row_nonzeros(X, r)
        s = float(w0) + sum(w[c] * v for c, v in zip(cols, x))
        for a in range(len(cols)):
            for b in range(a + 1, len(cols)):
                i, j = cols[a], cols[b]
                fa, fb = sorted((field_ids[i], field_ids[j]))
                s += R[fa, fb] * float(V[i] @ V[j]) * x[a] * x[b]
        out[r] = s
    return out
