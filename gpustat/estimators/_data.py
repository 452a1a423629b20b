"""Synthetic CTR data shaped like the factorization spec's anchor (demos, benchmarks, notebook).

Each row has one active category in each of ``n_fields`` fields (one-hot,
value 1), categories drawn Zipf-like (probability proportional to
``1 / (rank + 1) ** zipf``), so ``n_fields`` nonzeros per row over
``n_features`` features split evenly between the fields. Labels come from a
planted field-weighted FM (FwFM) truth:
``logit = b + sum_i w_i + sum_{i<j} r_{f(i) f(j)} <v_i, v_j>``, ``y ~ Bernoulli(sigmoid(logit))``.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

__all__ = ["make_ctr"]


def make_ctr(n_rows: int, *, n_features: int = 100_000, n_fields: int = 16,
             n_factors: int = 4, zipf: float = 1.1, seed: int = 0):
    """CTR-style one-hot data with a planted FwFM truth.

    Args:
        n_rows: n.
        n_features: p (a positive multiple of ``n_fields``).
        n_fields: F, also the nonzeros per row.
        n_factors: rank of the planted interactions.
        zipf: exponent of the category popularity.
        seed: the truth and the rows both come from ``np.random.default_rng(seed)``;
            draw train and test with one call and split.

    Returns:
        ``(X, y, field_ids)``: (n, p) CSR float64 with F ones per row, (n,) int
        0/1 labels, (p,) field of each feature.
    """
    if n_fields < 1 or n_features < n_fields or n_features % n_fields:
        raise ValueError("n_features must be a positive multiple of n_fields >= 1, got "
                         f"{n_features=}, {n_fields=}")
    rng = np.random.default_rng(seed)
    per_field = n_features // n_fields
    field_ids = np.repeat(np.arange(n_fields), per_field)
    w = rng.normal(0.0, 0.4, n_features)
    V = rng.normal(0.0, 0.35, (n_features, n_factors))
    r = np.triu(rng.uniform(-1.0, 2.0, (n_fields, n_fields)))
    popularity = 1.0 / np.arange(1, per_field + 1) ** zipf
    cdf = np.cumsum(popularity / popularity.sum())
    # a random category order per field, so popular categories differ between fields
    rank_to_cat = np.argsort(rng.random((n_fields, per_field)), axis=1)
    ranks = np.minimum(np.searchsorted(cdf, rng.random((n_rows, n_fields))), per_field - 1)
    cols = np.arange(n_fields) * per_field + rank_to_cat[np.arange(n_fields), ranks]
    logit = np.full(n_rows, -1.2) + w[cols].sum(axis=1)
    upper = np.triu(r, 1)
    for start in range(0, n_rows, 65536):  # pair term in chunks of rows
        M = V[cols[start:start + 65536]]  # (rows, F, k)
        # sum_{a<b} r_ab <M_a, M_b> = sum_a <M_a, sum_b upper_ab M_b>: one batched matmul
        logit[start:start + 65536] += (M * (upper @ M)).sum(axis=(1, 2))
    y = (rng.random(n_rows) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int64)
    indptr = np.arange(0, n_rows * n_fields + 1, n_fields)
    X = sp.csr_matrix((np.ones(n_rows * n_fields), cols.ravel(), indptr),
                      shape=(n_rows, n_features))
    return X, y, field_ids
