"""Benchmarks: the public ``GaussianMixture(...).fit(X)`` end to end beside scikit-learn.

What a user runs: validation, k-means initialisation, the EM loop and the final E-step
(``fit`` returns after labelling the rows), timed on the first call (compilation
included) and warm (a new estimator, same shapes: nothing compiles). In the same run:

* ``fit_parts``: the pieces a fit cannot avoid, timed alone: the initialisation plus one
  E-step (``max_iter=0``) and one EM iteration (``gpustat.mixture.fit_em`` with
  ``max_iter=1``); the warm fit is compared with ``init_and_estep + n_iter x iteration``;
  the k-means initialisation alone (``gpustat.mixture.initialize``) in EM iterations;
* ``sklearn_fit``: scikit-learn's ``GaussianMixture.fit`` with the same settings on all
  host cores, on a subset of rows, extrapolated to n and to gpustat's iteration count
  (seconds per row per iteration times n times n_iter; said in the record).

``--quick`` runs every case with scikit-learn on 20k rows (the whole run in about two
minutes on one GPU); the full run gives scikit-learn 50k rows.

Data: float32 blobs, centres ~ N(0, 4^2 I), per-cluster covariance (I + 0.4 E)(I + 0.4 E)^T
with E standard normal, equal weights; ``kmeans`` initialisation, ``tol=1e-3``.

``GPUSTAT_BENCH_SMOKE=1`` runs tiny sizes on a CPU to check the script.
"""

from __future__ import annotations

import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.harness import Recorder, main_from_args, x64_for

SMOKE = os.environ.get("GPUSTAT_BENCH_SMOKE") == "1"
# (n, p, k): the shapes; the smoke run keeps their proportions small
CASES = ([(4000, 4, 4)] if SMOKE
         else [(1_000_000, 16, 64), (1_000_000, 16, 256), (200_000, 8, 16)])
SKLEARN_ROWS = 2000 if SMOKE else 50_000
SKLEARN_ROWS_QUICK = 2000 if SMOKE else 20_000


def blobs(n, p, k, seed=0):
    """(n, p) float32 rows of k Gaussian clusters (the issue's data family)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(0.0, 4.0, (k, p))
    mix = np.eye(p) + 0.4 * rng.standard_normal((k, p, p))
    labels = rng.integers(0, k, n)
    z = rng.standard_normal((n, p))
    X = centres[labels] + np.einsum("nab,nb->na", mix[labels], z)
    return X.astype(np.float32)


def _seconds(fn):
    start = time.perf_counter()
    out = fn()
    jax.block_until_ready(out)
    return time.perf_counter() - start, out


def _estimator(k, **kw):
    from gpustat import GaussianMixture

    return GaussianMixture(k, covariance_type="full", tol=1e-3, init_params="kmeans",
                           random_state=0, **kw)


def bench_case(rec, n, p, k, sklearn_rows):
    from sklearn.mixture import GaussianMixture as SkGaussianMixture

    from gpustat import mixture

    X = blobs(n, p, k)
    shape = (n, p, k)
    first_s, gm = _seconds(lambda: _estimator(k).fit(X))
    warm = []
    for _ in range(3):
        seconds, gm = _seconds(lambda: _estimator(k).fit(X))
        warm.append(seconds)
    warm_s = float(np.median(warm))
    n_iter = int(gm.n_iter_)
    # the unavoidable pieces, each warm: init + final E-step, one EM iteration
    _seconds(lambda: _estimator(k, max_iter=0).fit(X))
    init_s = float(np.median([_seconds(lambda: _estimator(k, max_iter=0).fit(X))[0]
                              for _ in range(3)]))
    params = gm.params_
    Xd = jnp.asarray(X)

    def one_iteration():
        return mixture.fit_em(Xd, params, max_iter=1, tol=0.0).params.means

    jax.block_until_ready(one_iteration())
    iteration_s = float(np.median([_seconds(one_iteration)[0] for _ in range(5)]))

    def kmeans_init():
        return mixture.initialize(jax.random.key(0), Xd, k).means

    jax.block_until_ready(kmeans_init())
    kmeans_s = float(np.median([_seconds(kmeans_init)[0] for _ in range(3)]))
    budget_s = init_s + n_iter * iteration_s
    rec.record("fit_parts", shape=shape, dtype="float32", backend="gpustat", timing=None,
               extra={"init_and_estep_s": init_s, "em_iteration_s": iteration_s,
                      "kmeans_init_s": kmeans_s,
                      "kmeans_init_over_iteration": kmeans_s / iteration_s,
                      "n_iter": n_iter, "budget_s": budget_s})
    # scikit-learn on all host cores, same settings, on a subset of rows
    rows = min(n, sklearn_rows)
    sk = SkGaussianMixture(k, covariance_type="full", tol=1e-3, init_params="kmeans",
                           random_state=0)
    sk_s, _ = _seconds(lambda: sk.fit(X[:rows].astype(np.float64)))
    sk_per_fit = sk_s / max(sk.n_iter_, 1) * max(n_iter, 1) * (n / rows)
    rec.record("fit", shape=shape, dtype="float32", backend="gpustat", timing=None,
               extra={"first_call_s": first_s, "warm_s": warm_s, "warm_runs_s": warm,
                      "n_iter": n_iter, "converged": bool(gm.converged_),
                      "warm_over_budget": warm_s / budget_s,
                      "first_minus_warm_s": first_s - warm_s,
                      "speedup_vs_sklearn": sk_per_fit / warm_s,
                      "speedup_vs_sklearn_first_call": sk_per_fit / first_s,
                      "heldout_score": float(gm.score(blobs(min(n, 100_000), p, k, seed=1)))})
    rec.record("sklearn_fit", shape=shape, dtype="float64", backend="sklearn_cpu", timing=None,
               extra={"measured_rows": rows, "measured_s": sk_s, "sklearn_n_iter": int(sk.n_iter_),
                      "extrapolated_s": sk_per_fit, "host_cpus": os.cpu_count(),
                      "note": "seconds per row per iteration at the subset x n x gpustat's "
                              "n_iter"})
    print(f"fit n={n} p={p} k={k}: first {first_s:.2f} s, warm {warm_s:.3f} s, "
          f"{n_iter} iterations, budget {budget_s:.3f} s ({warm_s / budget_s:.2f}x), "
          f"k-means init {kmeans_s:.3f} s ({kmeans_s / iteration_s:.1f} EM iterations), "
          f"scikit-learn {sk_per_fit:.1f} s ({sk_per_fit / warm_s:.0f}x)", flush=True)


def run(quick: bool, out=None) -> None:
    rec = Recorder("mixture_fit", out)
    with x64_for(jnp.float32):
        for n, p, k in CASES:
            bench_case(rec, n, p, k, SKLEARN_ROWS_QUICK if quick else SKLEARN_ROWS)


if __name__ == "__main__":
    main_from_args(run, "mixture_fit")
