"""Small FM / FFM / FwFM problems for the tests: ragged rows, empty rows, same-field pairs.

Row lengths 0, 1, 3, 5, 7, 6, 1, 0, 4 give buckets of width 1, 4 and 8
(including rows that do not fill their bucket); 3 fields over 11 features make
same-field pairs common. The COO input holds a duplicate entry (summed by CSR).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import scipy.sparse as sp

ROW_LENGTHS = (0, 1, 3, 5, 7, 6, 1, 0, 4)
N_FEATURES = 11
N_FIELDS = 3
K = 3


@dataclasses.dataclass(frozen=True)
class Problem:
    X: sp.csr_array  # scipy CSR, duplicates summed
    field_ids: np.ndarray  # (p,)
    w0: float
    w: np.ndarray  # (p,)
    V: np.ndarray  # (p, k)
    V_ffm: np.ndarray  # (p, f, k)
    R: np.ndarray  # (f, f), lower triangle garbage (must be ignored)


def make_problem(seed: int = 0, row_lengths=ROW_LENGTHS, p: int = N_FEATURES,
                 n_fields: int = N_FIELDS, k: int = K) -> Problem:
    rng = np.random.default_rng(seed)
    rows, cols = [], []
    for r, length in enumerate(row_lengths):
        rows += [r] * length
        cols += list(rng.choice(p, length, replace=False))
    vals = list(rng.normal(size=len(rows)))
    if len(rows) > 1:  # a duplicate of the first entry, summed when converted
        rows.append(rows[0])
        cols.append(cols[0])
        vals.append(0.25)
    coo = sp.coo_array((vals, (rows, cols)), shape=(len(row_lengths), p))
    X = sp.csr_array(coo)
    X.sum_duplicates()
    R = rng.normal(size=(n_fields, n_fields))
    R[np.tril_indices(n_fields, -1)] = 1e3  # never read
    return Problem(
        X=X,
        field_ids=rng.integers(0, n_fields, p),
        w0=float(rng.normal()),
        w=rng.normal(size=p),
        V=rng.normal(size=(p, k)),
        V_ffm=rng.normal(size=(p, n_fields, k)),
        R=R,
    )


def make_one_hot_problem(seed: int = 0, n_rows: int = 13, n_fields: int = 5, p: int = 23,
                         k: int = 3) -> Problem:
    """Rows with at most one nonzero per field (the field-slot layout's case).

    Row 0 has every field, row 1 one nonzero, row 2 none; the others
    hold a random subset of fields, each with a random feature of that field.
    ``n_rows`` and ``n_fields`` default to non-powers of two.
    """
    rng = np.random.default_rng(seed)
    field_ids = np.concatenate([np.arange(n_fields), rng.integers(0, n_fields, p - n_fields)])
    rng.shuffle(field_ids)
    rows, cols = [], []
    for r in range(n_rows):
        present = {0: list(range(n_fields)), 1: [int(rng.integers(n_fields))], 2: []}.get(
            r, list(np.flatnonzero(rng.random(n_fields) < 0.7)))
        for f in present:
            rows.append(r)
            cols.append(int(rng.choice(np.flatnonzero(field_ids == f))))
    X = sp.csr_array((rng.normal(size=len(rows)), (rows, cols)), shape=(n_rows, p))
    R = rng.normal(size=(n_fields, n_fields))
    R[np.tril_indices(n_fields, -1)] = 1e3  # never read
    return Problem(X=X, field_ids=field_ids, w0=float(rng.normal()), w=rng.normal(size=p),
                   V=rng.normal(size=(p, k)), V_ffm=rng.normal(size=(p, n_fields, k)), R=R)
