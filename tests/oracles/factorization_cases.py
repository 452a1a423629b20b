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


def make_large_value_problem(seed: int = 0) -> tuple[Problem, dict[str, np.ndarray]]:
    """Values near 1e20 whose scores fit in float32, and each model's error scale per row.

    Features 8-10 carry values near 1e20 with factors near 0.1: on rows 0 and 1, FM's
    ``(sum_i v_i x_i)**2`` reaches 7e38 (beyond float32) while the pair terms stay
    near 1.5e38; they sort after the ordinary features, so a kernel meets them in a
    later chunk of the row. Features 3-5 carry values near 1e20 with factors near
    1e-21: each ``v x`` is near 0.1, but a factor product ``<v_i, v_j>`` (1e-42) is
    subnormal in float32. Features 0-2, 6 and 7 are ordinary. The error scale of a
    row is ``|w0| + sum_i |w_i x_i| + sum_{i != j} |pair term|``, plus
    ``sum_i |v_i x_i|**2`` for FM, whose identity subtracts those squares (its
    rounding error is relative to them).
    """
    base = make_problem(seed)
    rng = np.random.default_rng(seed + 1)
    p, k = N_FEATURES, K
    entries = [{8: 1e20, 9: 1e20, 0: 0.5, 1: -1.25},
               {8: -8e19, 3: 2e20, 4: -1.5e20, 2: 0.75},
               {3: 1e20, 4: 3e20, 5: -2e20},
               {9: 1.2e20},
               {10: 9e19, 5: 1.1e20, 6: 2.0, 7: -0.5},
               {}]
    rows = [r for r, row in enumerate(entries) for _ in row]
    cols = [c for row in entries for c in row]
    vals = [v for row in entries for v in row.values()]
    X = sp.csr_array((vals, (rows, cols)), shape=(len(entries), p))
    X.sort_indices()
    large, tiny = np.arange(p) >= 8, (np.arange(p) >= 3) & (np.arange(p) < 6)
    scale = np.where(large, 0.1, np.where(tiny, 1e-21, 1.0))[:, None]
    V = rng.normal(size=(p, k)) * scale
    V[8], V[9] = [0.15, 0.02, -0.05], [0.12, -0.03, 0.04]  # same sign in factor 0
    V_ffm = rng.normal(size=(p, N_FIELDS, k)) * scale[:, :, None]
    V_ffm[8:10] = V[8:10, None, :]
    w = rng.normal(size=p) * np.where(large | tiny, 1e-20, 1.0)
    problem = dataclasses.replace(base, X=X, w=w, V=V, V_ffm=V_ffm)
    r_max = np.abs(np.triu(base.R)).max()
    error_scale = {model: np.empty(len(entries)) for model in ("fm", "ffm", "fwfm")}
    for r, row in enumerate(entries):
        c, x = np.array(list(row), int), np.array(list(row.values()))
        u = V[c] * x[:, None]
        u_ffm = V_ffm[c][:, base.field_ids[c]] * x[:, None, None]  # [i, j] = V[c_i, f_j] x_i
        off = ~np.eye(len(c), dtype=bool)
        linear = abs(base.w0) + np.abs(w[c] * x).sum()
        error_scale["fm"][r] = linear + (u * u).sum() + np.abs(u @ u.T)[off].sum()
        error_scale["ffm"][r] = linear + np.abs(np.einsum("ijk,jik->ij", u_ffm, u_ffm))[off].sum()
        error_scale["fwfm"][r] = linear + r_max * np.abs(u @ u.T)[off].sum()
    return problem, error_scale
