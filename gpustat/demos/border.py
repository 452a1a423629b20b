"""Demo: a colour class of border Newton systems, against per-atom dense scipy Cholesky solves."""

from __future__ import annotations

import jax
import numpy as np
from scipy.linalg import cho_factor, cho_solve

from gpustat.border import BorderBatch, solve_batched_border
from gpustat.demos import DemoRow, max_rel_error, timed

CAPABILITY = "border"
FLOAT64_ONLY = True  # skipped when 64-bit types are off (GPUSTAT_X32=1)
RIDGE = 1e-6


def _atoms(rng, b, n_range, k_range, d=2):
    atoms = []
    for _ in range(b):
        n, k = rng.integers(*n_range), rng.integers(*k_range)
        A = rng.normal(size=(n, d, d))
        Bm = rng.normal(size=(k, k))
        H_tb = rng.normal(size=(n, d, k)) / np.sqrt(n * d * k)
        atoms.append((A.transpose(0, 2, 1) @ A + np.eye(d), H_tb, rng.normal(size=(n, d)),
                      Bm.T @ Bm / k + 2 * np.eye(k), rng.normal(size=k)))
    return atoms


def _dense_step(H_tt, H_tb, g_t, H_bb, g_b):
    """Assemble one atom's ridged bordered matrix and solve H delta = -g with scipy."""
    n, d, k = H_tb.shape
    H = np.zeros((n * d + k,) * 2)
    for i in range(n):
        H[i * d:(i + 1) * d, i * d:(i + 1) * d] = H_tt[i] + RIDGE * np.eye(d)
        H[i * d:(i + 1) * d, n * d:] = H_tb[i]
        H[n * d:, i * d:(i + 1) * d] = H_tb[i].T
    H[n * d:, n * d:] = H_bb + RIDGE * np.eye(k)
    return cho_solve(cho_factor(H, lower=True), -np.concatenate([g_t.ravel(), g_b]))


def run(backend: str, small: bool) -> list[DemoRow]:
    rng = np.random.default_rng(0)
    # Small: one kernel bucket (k in 3..4, n in 9..16) so interpret mode compiles once.
    atoms = _atoms(rng, 8, (9, 17), (3, 5)) if small else _atoms(rng, 10_000, (8, 129), (4, 13))
    batch = BorderBatch.from_atoms(*zip(*atoms, strict=True))
    solve = jax.jit(lambda bt: solve_batched_border(bt, RIDGE, RIDGE, backend=backend))
    sol, seconds = timed(solve, batch)
    check = range(len(atoms)) if small else rng.choice(len(atoms), 200, replace=False)
    got = [np.concatenate([np.ravel(x) for x in sol.atom(int(a))]) for a in check]
    want = [_dense_step(*atoms[a]) for a in check]
    rows = [DemoRow(CAPABILITY, "solve f64", backend, max_rel_error(got, want), seconds,
                    f"b={len(atoms)} atoms, d=2, vs scipy cho_factor per atom")]

    # One atom's row 0 made indefinite: only that atom reports status 1, the rest match.
    H_tt = batch.H_tt.at[0].set(-np.eye(2))
    broken = BorderBatch(H_tt, batch.H_tb, batch.g_t, batch.H_bb, batch.g_b, batch.layout)
    sol2, seconds = timed(solve, broken)
    status = np.asarray(sol2.status)
    ok = status[0] == 1 and int(sol2.row[0]) == 0 and np.all(status[1:] == 0)
    rest = [np.concatenate([np.ravel(x) for x in sol2.atom(int(a))]) for a in check if a != 0]
    rows.append(DemoRow(CAPABILITY, "per-atom failure", backend,
                        max_rel_error(rest, [w for a, w in zip(check, want) if a != 0]), seconds,
                        f"atom 0 status={status[0]} row={int(sol2.row[0])} "
                        f"bump={float(sol2.bump[0]):.3g}; others ok: {bool(ok)}"))
    return rows
