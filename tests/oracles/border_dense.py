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
