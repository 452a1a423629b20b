"""Demo: a Gaussian mixture fitted by EM end to end, the E-step under each backend."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.mixture import GaussianMixture

from gpustat.demos import DemoRow, max_rel_error, timed

CAPABILITY = "mixture"


def _data(small: bool):
    rng = np.random.default_rng(0)
    n_per, p, k = (200, 4, 3) if small else (5000, 8, 6)
    centres = rng.normal(size=(k, p)) * 4
    X = np.concatenate([rng.normal(size=(n_per, p)) + c for c in centres])
    return X, k


def _sklearn_em(X, init, max_iter: int):
    """scikit-learn's EM from the same start, every iteration run (tol = 0): the oracle."""
    gm = GaussianMixture(len(init.weights), covariance_type="full", tol=0.0, max_iter=max_iter,
                         reg_covar=1e-6, weights_init=np.asarray(init.weights),
                         means_init=np.asarray(init.means),
                         precisions_init=np.linalg.inv(np.asarray(init.covariances)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return gm.fit(X)


def run(backend: str, small: bool) -> list[DemoRow]:
    """E-step statistics and a full EM fit through ``backend`` vs the reference."""
    from gpustat import mixture

    X, k = _data(small)
    Xj = jnp.asarray(X)
    init = jax.tree.map(lambda a: a[0], mixture.initialize(jax.random.key(0), Xj, k,
                                                           method="k-means++"))
    stats_fn = jax.jit(lambda X: mixture.suff_stats(X, init, backend=backend))
    got, seconds = timed(stats_fn, Xj)
    # the oracle: raw sums of the reference responsibilities, written out here
    resp = mixture.responsibilities(Xj, init, backend="reference")
    want = (resp.sum(0), resp.T @ Xj, jnp.einsum("nk,na,nb->kab", resp, Xj, Xj))
    rows = [DemoRow(CAPABILITY, f"suff_stats n={len(X)} p={X.shape[1]} k={k}", backend,
                    max_rel_error((got.counts, got.sum_x, got.sum_xx), want), seconds)]
    # fit_em is jitted inside (one executable per backend and setting)
    fitted, seconds = timed(lambda X: mixture.fit_em(X, init, max_iter=20, tol=0.0,
                                                     backend=backend), Xj, repeats=1)
    oracle = _sklearn_em(X, init, max_iter=20)
    rows.append(DemoRow(CAPABILITY, "fit_em 20 iterations (full)", backend,
                        max_rel_error((fitted.params.means, fitted.params.covariances),
                                      (oracle.means_, oracle.covariances_)), seconds,
                        note=f"lower bound {float(fitted.lower_bound):.4f}; vs scikit-learn "
                             "from the same start"))
    return rows
