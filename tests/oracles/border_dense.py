"""Dense per-atom oracle for border solves (spec B.4), independent of gpustat's code.

Assembles the whole ridged ``(n d + k) x (n d + k)`` bordered matrix of one atom and
factors it with LAPACK ``dpotrf``; ``info`` locates the first failing leading minor,
which tells a row-block failure (index < n d) from a Schur failure.
"""

from __future__ import annotations

import numpy as np
from scipy.linalg import lapack, solve_triangular


def assemble(H_tt, H_tb, g_t, H_bb, g_b, ridge_t, ridge_beta):
    """Dense ridged matrix and gradient of one atom (arrays as in spec B.1)."""
    n, d, _ = H_tt.shape
    k = H_bb.shape[0]
    m = n * d + k
    H = np.zeros((m, m))
    for i in range(n):
        H[i * d:(i + 1) * d, i * d:(i + 1) * d] = H_tt[i] + ridge_t * np.eye(d)
        H[i * d:(i + 1) * d, n * d:] = H_tb[i]
        H[n * d:, i * d:(i + 1) * d] = H_tb[i].T
    H[n * d:, n * d:] = H_bb + ridge_beta * np.eye(k)
    g = np.concatenate([np.asarray(g_t).reshape(-1), np.asarray(g_b)])
    return H, g


def dense_solve(H_tt, H_tb, g_t, H_bb, g_b, ridge_t, ridge_beta):
    """Return ``(status, row, delta_t (n, d), delta_beta (k,), log_det)`` of one atom.

    status 0 ok, 1 a row block failed (row = its index), 2 the border part failed.
    """
    H_tt, H_tb, g_t, H_bb, g_b = (np.asarray(x, np.float64) for x in (H_tt, H_tb, g_t, H_bb, g_b))
    n, d, _ = H_tt.shape
    k = H_bb.shape[0]
    H, g = assemble(H_tt, H_tb, g_t, H_bb, g_b, ridge_t, ridge_beta)
    if H.size == 0:
        return 0, -1, np.zeros((n, d)), np.zeros(k), 0.0
    L, info = lapack.dpotrf(H, lower=1, clean=1)
    if info > 0:
        failed = info - 1
        if failed < n * d:
            return 1, failed // d, None, None, None
        return 2, -1, None, None, None
    delta = -solve_triangular(L.T, solve_triangular(L, g, lower=True), lower=False)
    log_det = 2.0 * np.sum(np.log(np.diag(L)))
    return 0, -1, delta[:n * d].reshape(n, d), delta[n * d:], log_det


def assert_matches_dense(atoms, solution, ridge_t, ridge_beta, rtol: float = 1e-10,
                         only=None):
    """Every atom of ``solution`` against :func:`dense_solve`: ``|x - e| <= rtol (1 + |e|)``.

    ``atoms`` is the list of per-atom tuples the batch was built from; ridges are scalars
    or per-atom sequences. Checks status (0/1/2), row, and for status 0 the steps and log_det,
    for every atom or the indices ``only``.
    """
    b = len(atoms)
    ridge_t = np.broadcast_to(np.asarray(ridge_t, np.float64), (b,))
    ridge_beta = np.broadcast_to(np.asarray(ridge_beta, np.float64), (b,))
    status = np.asarray(solution.status)
    rows = np.asarray(solution.row)
    log_det = np.asarray(solution.log_det)
    for a in range(b) if only is None else only:
        atom = atoms[a]
        want_status, want_row, dt, db, ld = dense_solve(*atom, ridge_t[a], ridge_beta[a])
        assert status[a] == want_status, f"atom {a}: status {status[a]} != dense {want_status}"
        assert rows[a] == want_row, f"atom {a}: row {rows[a]} != dense {want_row}"
        got_dt, got_db = (np.asarray(x, np.float64) for x in solution.atom(a))
        if want_status != 0:
            assert np.all(np.isnan(got_dt)) and np.all(np.isnan(got_db)) and np.isnan(log_det[a])
            continue
        for name, got, want in (("delta_t", got_dt, dt), ("delta_beta", got_db, db),
                                ("log_det", log_det[a], ld)):
            err = np.max(np.abs(got - want) / (1 + np.abs(want)), initial=0.0)
            assert err <= rtol, f"atom {a} {name}: scaled error {err:.3g} > {rtol}"
