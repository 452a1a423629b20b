"""Border-system fixtures: the spec's deterministic systems and random PD batches.

Each atom is a tuple ``(H_tt (n, d, d), H_tb (n, d, k), g_t (n, d), H_bb (k, k), g_b (k,))``
of float64 numpy arrays.
"""

from __future__ import annotations

import numpy as np


def pd_k1_system(n: int, d: int, k: int, s: float):
    """Spec B.8 ``pd_k1_system``: diagonal blocks (2 + s) I and structured cross terms."""
    i = np.arange(n)[:, None, None]
    r = np.arange(d)[None, :, None]
    c = np.arange(k)[None, None, :]
    H_tt = np.broadcast_to((2 + s) * np.eye(d), (n, d, d)).copy()
    g_t = np.broadcast_to(0.1 * (np.arange(n)[:, None] + 1) + s, (n, d)).copy()
    H_tb = 0.05 * (r + c + i + 1) + np.zeros((n, d, k))
    H_bb = (2 + s) * np.eye(k)
    g_b = 0.2 * (np.arange(k) + 1) + s
    return H_tt, H_tb, g_t, H_bb, g_b


def indefinite_k1_system(n: int, d: int, k: int):
    """``pd_k1_system(n, d, k, 0)`` with every row block ``-2 I``."""
    _, H_tb, g_t, H_bb, g_b = pd_k1_system(n, d, k, 0.0)
    return -2.0 * np.broadcast_to(np.eye(d), (n, d, d)).copy(), H_tb, g_t, H_bb, g_b


class _Pcg:
    """The spec's PCG-style sampler: 64-bit LCG, sample ``(state >> 33) / 2^31 - 1``."""

    def __init__(self, seed: int):
        self.state = (seed * 0x9E3779B97F4A7C15) % 2**64

    def sample(self) -> float:
        self.state = (self.state * 6364136223846793005 + 1442695040888963407) % 2**64
        return (self.state >> 33) / 2**31 - 1.0


def pcg_system(n: int, d: int, k: int, seed: int = 1):
    """Spec B.8 arrow-Schur validation fixture (H_tt = A^T A + (d+1) I, H_bb = B^T B + (k+1) I)."""
    rng = _Pcg(seed)
    H_tt = np.zeros((n, d, d))
    H_tb = np.zeros((n, d, k))
    g_t = np.zeros((n, d))
    for i in range(n):
        A = np.array([[rng.sample() for _ in range(d)] for _ in range(d)])
        H_tt[i] = A.T @ A + (d + 1) * np.eye(d)
        for r in range(d):
            H_tb[i, r] = [0.1 * rng.sample() for _ in range(k)]
            g_t[i, r] = rng.sample()
    B = np.array([[rng.sample() for _ in range(k)] for _ in range(k)])
    H_bb = B.T @ B + (k + 1) * np.eye(k)
    g_b = np.array([rng.sample() for _ in range(k)])
    return H_tt, H_tb, g_t, H_bb, g_b


def random_pd_atom(rng: np.random.Generator, n: int, d: int, k: int):
    """A random atom whose whole bordered matrix is positive definite with margin.

    Rows ``A^T A + I``; cross terms scaled so the Schur complement keeps >= half of
    ``H_bb``'s smallest eigenvalue.
    """
    A = rng.normal(size=(n, d, d))
    H_tt = A.transpose(0, 2, 1) @ A + np.eye(d)
    H_tb = rng.normal(size=(n, d, k)) / np.sqrt(max(n, 1) * d * k)
    g_t = rng.normal(size=(n, d))
    Bm = rng.normal(size=(k, k))
    H_bb = Bm.T @ Bm / k + 2.0 * np.eye(k)
    g_b = rng.normal(size=k)
    return H_tt, H_tb, g_t, H_bb, g_b


def atoms_with_two_bad_rows(n: int, late: int, early: int, seed: int = 5):
    """A random PD atom of ``n`` rows (d = 2, k = 5) whose row ``late`` is ``-I`` and row
    ``early < late`` indefinite, beside a PD atom of 17 rows (k = 3): the first failing
    row is ``early``."""
    rng = np.random.default_rng(seed)
    atoms = [random_pd_atom(rng, n, 2, 5), random_pd_atom(rng, 17, 2, 3)]
    H_tt = atoms[0][0].copy()
    H_tt[late] = -np.eye(2)
    H_tt[early] = np.array([[1.0, 3.0], [3.0, 1.0]])
    atoms[0] = (H_tt, *atoms[0][1:])
    return atoms


def random_batch(seed: int, sizes: list[tuple[int, int]], d: int):
    """Random PD atoms with ``sizes = [(n_a, k_a), ...]``."""
    rng = np.random.default_rng(seed)
    return [random_pd_atom(rng, n, d, k) for n, k in sizes]
