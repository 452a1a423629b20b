"""Spec golden values (dense reference, ridge_t = ridge_beta = 1e-6) and the batches the
border tests share, built so that tests reuse one compiled solve per layout."""

from __future__ import annotations

import numpy as np

from tests.oracles.border_fixtures import indefinite_k1_system, pd_k1_system, random_batch

GOLDEN_RIDGE = 1e-6

#: (n, d, k, s) -> golden values; None where the spec quotes no value.
GOLDEN = {
    (5, 2, 3, 0.0): {
        "delta_t": [-0.04419563049389668, -0.04291228649392269, -0.09291226149393521,
                    -0.09162891749396121, -0.1416288924939737, -0.14034554849399974,
                    -0.19034552349401224, -0.18906217949403822, -0.23906215449405072,
                    -0.23777881049407673],
        "delta_beta": [0.04764190061130895, -0.01711126188861313, -0.08186442438853526],
        "log_det": 8.442028534227665,
    },
    (4, 2, 2, 0.0): {
        "delta_t": [-0.04462775448563511, -0.04169001975310342],  # the first two entries
        "delta_beta": [-0.020129968092418044, -0.09737947996354401],
        "log_det": 6.780697682260387,
    },
    (6, 2, 3, 0.5): {
        "delta_t": None,
        "delta_beta": [0.11777086194918031, 0.1287458851202612, 0.13972090829134207],
        "log_det": 13.208630457508944,
    },
    (3, 1, 2, 1.0): {
        "delta_t": [-0.3469275382007617, -0.36736984593923266, -0.38781215367770366],
        "delta_beta": [-0.36258148428763287, -0.41087964255795184],
        "log_det": 5.481047234129324,
    },
}

GOLDEN_D2 = [(5, 2, 3, 0.0), (4, 2, 2, 0.0), (6, 2, 3, 0.5)]


def golden_d2_atoms():
    """The three d = 2 golden systems (positional-independence class of spec B.8)."""
    return [pd_k1_system(*key) for key in GOLDEN_D2]


def failing_d2_atoms():
    """Same layout as :func:`golden_d2_atoms`: atom 0 row 2 = -I (status 1, row 2),
    atom 1 all rows -2 I (status 1, row 0, spec's indefinite system), atom 2 untouched."""
    atoms = golden_d2_atoms()
    H_tt = atoms[0][0].copy()
    H_tt[2] = -np.eye(2)
    atoms[0] = (H_tt, *atoms[0][1:])
    atoms[1] = indefinite_k1_system(4, 2, 2)
    return atoms


def schur_and_nonfinite_d2_atoms():
    """Same layout: atom 0 border -2 I (status 2), atom 1 NaN in g_b (status 3), atom 2 untouched."""
    atoms = golden_d2_atoms()
    atoms[0] = (*atoms[0][:3], -2.0 * np.eye(3), atoms[0][4])
    g_b = atoms[1][4].copy()
    g_b[1] = np.nan
    atoms[1] = (*atoms[1][:4], g_b)
    return atoms


def check_golden(solution, keys):
    """Atom ``a`` equals ``GOLDEN[keys[a]]`` (skipped where None): 1e-12 absolute on the steps
    (spec B.8), 1e-12 relative on log_det."""
    for a, key in enumerate(keys):
        if key is None:
            continue
        want = GOLDEN[key]
        delta_t, delta_beta = (np.asarray(x) for x in solution.atom(a))
        if want["delta_t"] is not None:
            np.testing.assert_allclose(delta_t.ravel()[:len(want["delta_t"])], want["delta_t"],
                                       rtol=0, atol=1e-12)
        np.testing.assert_allclose(delta_beta, want["delta_beta"], rtol=0, atol=1e-12)
        np.testing.assert_allclose(solution.log_det[a], want["log_det"], rtol=1e-12)


#: Random PD batches per d: n_a from 1 to hundreds, k_a from 1 to 32.
RANDOM_SIZES = {
    1: [(1, 1), (150, 2), (3, 2)],
    2: [(3, 32), (300, 29), (17, 5)],
    3: [(2, 5), (60, 7)],
    4: [(1, 12), (100, 16)],
}


def random_pd_atoms(d: int, seed: int = 0):
    """Random PD atoms of :data:`RANDOM_SIZES` ``[d]`` (d = 1 also holds pd_k1_system(3, 1, 2, 1))."""
    atoms = random_batch(seed + d, RANDOM_SIZES[d], d)
    if d == 1:
        atoms[2] = pd_k1_system(3, 1, 2, 1.0)
    return atoms
