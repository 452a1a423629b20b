"""Benchmarks: Gaussian-mixture EM iteration and Gibbs sweep (n = 1e6, p = 16, k = 256, full).

Cases (float32 unless said, same process, same device):

* correctness first: per-point log-likelihood vs float64 on 65,536 rows for the kernels
  (the Triton E-step's density pass too, where it runs), XLA's chunked reference (what
  ``backend="auto"`` runs off-kernel) and the quadratic GEMM;
* ``em_iteration``: the kernels (suff_stats + m_step) at "tf32x3" and "highest" (IEEE
  fp32), first at their default blocks, then at the fastest swept ones; the XLA
  reference's iteration; baseline ``xla_quadratic_gemm``: the plain-XLA quadratic-feature
  formulation (Phi = [x_a x_b (a <= b), x, 1], logits = Phi W, softmax, R^T Phi),
  HIGHEST precision;
* ``em_iteration`` of the Triton E-step (:mod:`gpustat.triton.mixture`, precision "f16x3",
  where jax-triton is installed) and of its Mosaic GPU twin
  (:mod:`gpustat.pallas._mosaic_mixture`, sm_90+) against the same baseline, and the
  Mosaic GPU density pass alone (``density_pass``, log p(x));
* ``em_pieces``: per precision, the density pass alone (log p(x), no logits written)
  over block settings, then the E-step (density pass writing the logits + statistics
  pass) over statistics settings (block shapes and "full"/"packed" second moments);
* ``sklearn_iteration``: scikit-learn's E-step + M-step on the host CPUs at n = 1e5,
  extrapolated linearly to n = 1e6 (said in the record);
* ``gibbs_sweep``: the fused label-draw + label-statistics kernels vs the plain-XLA sweep
  (Phi W, inverse-CDF on the n x k matrix, one-hot R^T Phi), same NIW/stick draws;
* ``fit_1e8``: n = 1e8 rows fitted on one GPU (two EM iterations), peak memory recorded.
* float64 (``bench_float64``): ``log_prob``, ``em_iteration`` and ``gibbs_labels`` (label
  draw + label statistics) of the kernels at their float64 defaults against XLA's chunked
  reference, outputs checked against it first.

FLOP per EM iteration of the kernels (p = P = 16, k = 256): the whitened density once,
2 n k p P = 1.3e11 counted as full products (the kernel contracts 8 features for the first
8 coordinates, 3/4 of that; its logits are stored and read back by the statistics pass),
and the statistics products 2 n k P (P + 1) = 1.4e11 ("full"; "packed" 2 n k P (3P/4 + 1)).
"""

from __future__ import annotations

import functools
import importlib
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.harness import Recorder, check_close, main_from_args, time_fn, x64_for
from gpustat._backend import available_backends, mosaic_unavailable_reason
from gpustat.mixture import (
    GibbsState,
    MixtureParams,
    NIWPrior,
    StickBreakingPrior,
    m_step,
    sample_niw_posterior,
    sample_sticks,
)
from gpustat.pallas import mixture as kernels
from gpustat.pallas.mixture import LABEL_BLOCKS
from gpustat.reference import mixture as ref
from gpustat.reference._mixture_split import split_features, split_weights
from gpustat.reference.mixture import (
    n_features,
    quadratic_features,
    quadratic_weights,
    stats_from_quadratic,
)

# GPUSTAT_BENCH_MIXTURE_SMOKE=1: tiny sizes in interpret mode (checks the script on a CPU)
SMOKE = os.environ.get("GPUSTAT_BENCH_MIXTURE_SMOKE") == "1"
N, P, K, N_HOST, N_HUGE = ((4096, 16, 64, 1024, 8192) if SMOKE
                           else (1_000_000, 16, 256, 100_000, 100_000_000))
INTERPRET = SMOKE
HIGHEST = jax.lax.Precision.HIGHEST


def make_problem(n, p, k, seed=0):
    """Synthetic mixture data (centred, unit-scale) and parameters near the truth."""
    key_means, key_cov, key_x, key_z = jax.random.split(jax.random.key(seed), 4)
    means = jax.random.normal(key_means, (k, p), jnp.float32) * 2.0
    A = jax.random.normal(key_cov, (k, p, p), jnp.float32) * 0.15
    cov = A @ jnp.swapaxes(A, 1, 2) + 0.3 * jnp.eye(p, dtype=jnp.float32)
    labels = jax.random.randint(key_z, (n,), 0, k)
    noise = jax.random.normal(key_x, (n, p), jnp.float32)
    if n <= 10_000_000:  # correlated noise per component; isotropic for huge n (memory)
        noise = jnp.einsum("nab,nb->na", jnp.linalg.cholesky(cov)[labels], noise)
    else:
        noise = noise * jnp.sqrt(0.3)
    X = means[labels] + noise
    params = MixtureParams.from_covariances(jnp.full((k,), 1.0 / k, jnp.float32), means * 1.05,
                                            cov * 1.1, "full")
    return X - jnp.mean(X, axis=0), params


# ------------------------------------------------------------------ plain-XLA baselines

def xla_em_iteration(X, params, precision=HIGHEST):
    Phi = quadratic_features(X)
    logits = jnp.dot(Phi, quadratic_weights(params), precision=precision)
    lse = jax.nn.logsumexp(logits, axis=1)
    R = jnp.exp(logits - lse[:, None])
    stats = stats_from_quadratic(jnp.dot(R.T, Phi, precision=precision), X.shape[1],
                                 jnp.sum(lse))
    return m_step(stats, reg_covar=1e-6), stats.loglik


def _niw_and_sticks(key, stats, state, prior, sticks):
    k_niw, k_v = jax.random.split(key)
    drawn = sample_niw_posterior(k_niw, prior, stats)
    v, w, alpha = sample_sticks(k_v, stats.counts, sticks, state.alpha)
    return GibbsState(MixtureParams(w, drawn.means, drawn.covariances,
                                    drawn.precisions_cholesky, "full"), v, alpha)


def xla_gibbs_sweep(key, X, state, prior, sticks):
    k_z, k_rest = jax.random.split(key)
    Phi = quadratic_features(X)
    logits = jnp.dot(Phi, quadratic_weights(state.params), precision=HIGHEST)
    cdf = jnp.cumsum(jax.nn.softmax(logits, axis=1), axis=1)
    u = jax.random.uniform(k_z, (X.shape[0],), X.dtype)
    labels = jnp.minimum(jnp.sum(cdf <= u[:, None], axis=1), logits.shape[1] - 1)
    onehot = jax.nn.one_hot(labels, logits.shape[1], dtype=X.dtype)
    stats = stats_from_quadratic(jnp.dot(onehot.T, Phi, precision=HIGHEST), X.shape[1])
    return _niw_and_sticks(k_rest, stats, state, prior, sticks)


def kernel_gibbs_sweep(key, X, state, prior, sticks, **kw):
    k_z, k_rest = jax.random.split(key)
    _, _, stats = kernels.sample_labels_with_stats(k_z, X, state.params, interpret=INTERPRET,
                                                   **kw)
    return _niw_and_sticks(k_rest, stats, state, prior, sticks)


def reference_em_iteration(X, params):
    stats = ref.suff_stats(X, params)
    return m_step(stats, reg_covar=1e-6), stats.loglik


# ------------------------------------------------------------------ cases

# Block settings timed per precision; the first of each list is the default (DEFAULT_BLOCKS).
DENSITY_CONFIGS = {
    "tf32x3": [dict(block_n=128, block_k=32, num_warps=4, tiles_per_program=32, num_stages=1),
               dict(block_n=128, block_k=32, num_warps=4, tiles_per_program=32, num_stages=3),
               dict(block_n=64, block_k=32, num_warps=4, num_stages=1),
               dict(block_n=256, block_k=16, num_warps=4, tiles_per_program=32, num_stages=1)],
    "highest": [dict(block_n=64, block_k=32, num_warps=4, tiles_per_program=32, num_stages=3),
                dict(block_n=64, block_k=32, num_warps=4, tiles_per_program=32, num_stages=1),
                dict(block_n=128, block_k=32, num_warps=4, tiles_per_program=32, num_stages=1),
                dict(block_n=32, block_k=64, num_warps=4, num_stages=1)],
}
STATS_CONFIGS = {
    "tf32x3": [dict(block_n=32, block_k=64, num_warps=4, tiles_per_program=64,
                    moments="packed"),
               dict(block_n=64, block_k=32, num_warps=4, tiles_per_program=64,
                    moments="packed"),
               dict(block_n=32, block_k=64, num_warps=4, tiles_per_program=64, moments="full")],
    "highest": [dict(block_n=16, block_k=64, num_warps=4, tiles_per_program=128,
                     moments="packed"),
                dict(block_n=32, block_k=64, num_warps=8, tiles_per_program=128,
                     moments="packed"),
                dict(block_n=16, block_k=64, num_warps=4, tiles_per_program=128,
                     moments="full")],
}


def density_flop(n, p, k):
    """Useful FLOP of one whitened density evaluation: 2 n k p P."""
    return 2 * n * k * kernels.padded_features(p) * p


def kernel_flop(n, p, k, moments="full"):
    """The density once + the statistics products (second moments and x^T r):
    2 n k P (P + 1) for "full", 2 n k P (3P/4 + 1) for "packed"."""
    P = kernels.padded_features(p)
    rows = P if moments == "full" else 3 * P // 4
    return density_flop(n, p, k) + 2 * n * k * P * (rows + 1)


def guarded(rec, case, shape, extra, fn, dtype="float32"):
    """Run one case; a failure (compile or check) is recorded and printed, not raised."""
    try:
        return fn()
    except Exception as err:  # one failing setting must not lose the others
        message = f"{type(err).__name__}: {err}"[:400]
        print(f"FAILED {case} {extra}: {message}", flush=True)
        rec.record(case, shape=shape, dtype=dtype, backend="pallas", timing=None,
                   extra={**extra, "error": message})
        return None


def check_precision_vs_float64(rec, X, params):
    """Per-point log-likelihood of the float32 paths vs float64, on 65,536 rows."""
    rows = X[:65536]
    with x64_for(jnp.float64):
        exact = np.asarray(ref.log_prob(rows.astype(jnp.float64),
                                        jax.tree.map(lambda a: a.astype(jnp.float64), params)))

    def record(case, backend, got, **extra):
        err = np.abs(np.asarray(got, np.float64) - exact)
        rec.record(case, shape=rows.shape, dtype="float32", backend=backend, timing=None,
                   extra={"max_abs_error_vs_float64": float(np.max(err)),
                          "median_abs_error_vs_float64": float(np.median(err)),
                          "passes_1e-3": bool(np.max(err) <= 1e-3), **extra})
        return float(np.max(err))

    errors = {}
    for precision in ("highest",) if INTERPRET else ("highest", "tf32x3"):
        case = f"loglik_error_{precision}"
        errors[case] = guarded(rec, case, rows.shape, {"precision": precision},
                               lambda precision=precision, case=case: record(
                                   case, "pallas", jax.jit(functools.partial(
                                       kernels.log_prob, precision=precision,
                                       interpret=INTERPRET))(rows, params),
                                   precision=precision))
    # the f16x3 E-steps: (case, backend, whether it runs here, module with log_prob)
    for case, backend, runs, module in (
            ("loglik_error_f16x3", "triton", triton_runs, "gpustat.triton.mixture"),
            ("loglik_error_f16x3_mosaic", "mosaic", mosaic_runs,
             "gpustat.pallas._mosaic_mixture")):
        if runs():
            log_prob = importlib.import_module(module).log_prob
            errors[case] = guarded(rec, case, rows.shape, {"precision": "f16x3"},
                                   lambda case=case, backend=backend, log_prob=log_prob: record(
                                       case, backend, jax.jit(log_prob)(rows, params),
                                       precision="f16x3"))
    errors["xla_reference"] = record("loglik_error_xla_reference", "xla_reference",
                                     jax.jit(ref.log_prob)(rows, params))
    xla_lse = jax.nn.logsumexp(jnp.dot(quadratic_features(rows), quadratic_weights(params),
                                       precision=HIGHEST), axis=1)
    errors["xla_quadratic_gemm"] = record("loglik_error_xla_highest", "xla", xla_lse)
    return errors


def sweep_pieces(rec, X, params, precision):
    """Time the density pass (log p(x) alone, no logits written) over block settings, then
    the whole E-step (density pass writing the logits + statistics pass) over statistics
    settings with the fastest density setting; the statistics pass's own time is the
    difference. Returns the fastest setting of each."""
    n, p = X.shape
    best = {}

    def one(piece, cfg, fn, flop):
        t = time_fn(jax.jit(fn), [(X,)])
        rec.record("em_pieces", shape=(n, p, K), dtype="float32", backend="pallas", timing=t,
                   items=n, item_name="rows",
                   extra={"piece": piece, "precision": precision, **cfg,
                          "flop": flop, "tflops": flop / (t.median_ms * 1e-3) / 1e12,
                          **({"statistics_pass_ms": t.median_ms - best["density"][0]}
                             if piece == "e_step" else {})})
        print(f"{piece} {precision} {cfg}: {t.median_ms:.3f} ms", flush=True)
        if piece not in best or t.median_ms < best[piece][0]:
            best[piece] = (t.median_ms, cfg)

    configs = DENSITY_CONFIGS[precision]
    for cfg in configs[:1] if INTERPRET else configs:
        guarded(rec, "em_pieces", (n, p, K),
                {"piece": "density", "precision": precision, **cfg},
                lambda cfg=cfg: one("density", cfg, lambda X: kernels.log_prob(
                    X, params, precision=precision, interpret=INTERPRET, **cfg),
                    density_flop(n, p, K)))
    if "density" not in best:
        return {}
    density = best["density"][1]
    configs = STATS_CONFIGS[precision]
    for cfg in configs[:2] if INTERPRET else configs:
        guarded(rec, "em_pieces", (n, p, K),
                {"piece": "e_step", "precision": precision, **cfg},
                lambda cfg=cfg: one("e_step", cfg, lambda X: kernels.suff_stats(
                    X, params, precision=precision, interpret=INTERPRET,
                    density_blocks=density, stats_blocks=cfg),
                    kernel_flop(n, p, K, cfg["moments"])))
    return {"density": density, "statistics": best["e_step"][1]} if "e_step" in best else {}


def kernel_em_step(precision, density_cfg, stats_cfg, centred=False):
    """One EM iteration on the kernels; ``centred``: the drivers' statistics, about the
    current means (the per-component statistics pass, default settings)."""
    def step(X, params):
        pivot = params.means if centred else None
        stats = kernels.suff_stats(X, params, None, pivot, precision=precision,
                                   interpret=INTERPRET, density_blocks=density_cfg,
                                   stats_blocks=stats_cfg)
        return m_step(stats, reg_covar=1e-6, pivot=pivot), stats.loglik

    return jax.jit(step)


def _stats_em_step(suff_stats):
    """One EM iteration at precision "f16x3" through the E-step ``suff_stats(X, params)``."""
    def step(X, params):
        stats = suff_stats(X, params)
        return m_step(stats, reg_covar=1e-6), stats.loglik

    return jax.jit(step)


def triton_runs() -> bool:
    """Whether the Triton E-step's cases run: compiled, where jax-triton is installed."""
    return not INTERPRET and "triton" in available_backends()


def _time_em_iteration(rec, backend, step, X, params, xla_t, want):
    """An "f16x3" EM iteration ``step`` checked against the float64 log-likelihood
    ``want``, timed, and recorded against the same run's XLA baseline ``xla_t``."""
    n, p = X.shape
    check_close(f"loglik f16x3 {backend}", step(X, params)[1], want, rtol=1e-4)
    t = time_fn(step, [(X, params)])
    rec.record("em_iteration", shape=(n, p, K), dtype="float32", backend=backend, timing=t,
               items=n, item_name="rows", baseline="xla_quadratic_gemm",
               extra={"precision": "f16x3", "speedup_vs_xla": xla_t.median_ms / t.median_ms,
                      "flop": 2 * n * K * 2 * n_features(p)})
    print(f"em_iteration f16x3 ({backend}): {t.median_ms:.2f} ms "
          f"({xla_t.median_ms / t.median_ms:.2f}x XLA)", flush=True)


def bench_triton_em(rec, X, params, xla_t, want):
    """The Triton E-step's EM iteration ("f16x3") against the same run's XLA baseline (its
    log-likelihood error: :func:`check_precision_vs_float64`)."""
    from gpustat.triton import mixture as triton_mixture

    _time_em_iteration(rec, "triton", _stats_em_step(triton_mixture.suff_stats), X, params,
                       xla_t, want)


def mosaic_runs() -> bool:
    """Whether the Mosaic GPU E-step's cases run: compiled, on an sm_90+ GPU."""
    return not INTERPRET and not mosaic_unavailable_reason()


def bench_mosaic_em(rec, X, params, xla_t, want):
    """The Mosaic GPU E-step's EM iteration ("f16x3") against the same run's XLA baseline
    (its statistics checked against the XLA reference's first), its density pass alone
    (log p(x), no responsibilities written) and its passes timed apart."""
    from gpustat.pallas import _mosaic_mixture as mosaic_mixture

    n, p = X.shape
    stats = jax.jit(mosaic_mixture.suff_stats)(X, params)
    expected = jax.jit(ref.suff_stats)(X, params)
    for name in ("counts", "sum_x", "sum_xx"):
        exp = getattr(expected, name)
        check_close(f"{name} f16x3 mosaic", getattr(stats, name), exp, rtol=1e-4,
                    atol=1e-4 * float(jnp.max(jnp.abs(exp))))

    _time_em_iteration(rec, "mosaic", _stats_em_step(mosaic_mixture.suff_stats), X, params,
                       xla_t, want)
    density = jax.jit(mosaic_mixture.log_prob)
    t = time_fn(density, [(X, params)])
    rec.record("density_pass", shape=(n, p, K), dtype="float32", backend="mosaic", timing=t,
               items=n, item_name="rows", extra={"precision": "f16x3"})

    # the passes of one chunk timed apart: XLA's splits, the density kernel writing R
    # (with the splits), the statistics kernel
    W = quadratic_weights(params).astype(jnp.float32)
    w = jnp.ones((n,), jnp.float32)
    F_pad, Kp = mosaic_mixture._padded_sizes(p, params.n_components)

    def splits(X):
        phi_hi, phi_lo, s = split_features(X, F_pad)
        return phi_hi, phi_lo, split_weights(W, s, Kp)

    density_resp = jax.jit(lambda X: mosaic_mixture._chunk_density(X, w, W, write_resp=True))
    _, resp, phi, _ = density_resp(X)
    for piece, fn, args in (("splits_xla", jax.jit(splits), (X,)),
                            ("density_with_resp+splits", density_resp, (X,)),
                            ("statistics", mosaic_mixture._stats, (*resp[:2], *phi, resp[2]))):
        t = time_fn(fn, [args])
        rec.record("em_pieces_mosaic", shape=(n, p, K), dtype="float32", backend="mosaic",
                   timing=t, items=n, item_name="rows", extra={"piece": piece})
        print(f"mosaic E-step piece {piece}: {t.median_ms:.3f} ms", flush=True)


def mosaic_cases(rec, check_errors: bool = True):
    """The Mosaic GPU E-step beside the XLA baseline and the Triton E-step at n = 1e6
    (float32), and (``check_errors``) every float32 path's per-point log-likelihood
    error vs float64."""
    with x64_for(jnp.float32):
        X, params = make_problem(N, P, K)
        shape = (N, P, K)
        xla_t, want = bench_xla_em(rec, X, params)
        if triton_runs():
            guarded(rec, "em_iteration", shape, {"precision": "f16x3", "backend": "triton"},
                    lambda: bench_triton_em(rec, X, params, xla_t, want))
        if mosaic_runs():
            guarded(rec, "em_iteration", shape, {"precision": "f16x3", "backend": "mosaic"},
                    lambda: bench_mosaic_em(rec, X, params, xla_t, want))
        else:
            print(f"Mosaic GPU cases skipped: they need {mosaic_unavailable_reason()}")
        if check_errors:
            print("per-point log-likelihood max |error| vs float64:",
                  check_precision_vs_float64(rec, X, params), flush=True)


def bench_xla_em(rec, X, params):
    """The baseline: the plain-XLA quadratic-GEMM iteration; returns (timing, loglik)."""
    n, p = X.shape
    xla_step = jax.jit(xla_em_iteration)
    xla_t = time_fn(xla_step, [(X, params)])
    rec.record("em_iteration", shape=(n, p, K), dtype="float32", backend="xla_quadratic_gemm",
               timing=xla_t, items=n, item_name="rows",
               extra={"precision": "highest", "flop": 2 * n * K * 2 * n_features(p)})
    print(f"xla_quadratic_gemm {xla_t.median_ms:.2f} ms", flush=True)
    return xla_t, xla_step(X, params)[1]


def bench_em(rec, X, params, quick):
    n, p = X.shape
    shape = (n, p, K)
    xla_t, want = bench_xla_em(rec, X, params)
    if triton_runs():
        guarded(rec, "em_iteration", shape, {"precision": "f16x3", "backend": "triton"},
                lambda: bench_triton_em(rec, X, params, xla_t, want))
    if mosaic_runs():
        guarded(rec, "em_iteration", shape, {"precision": "f16x3", "backend": "mosaic"},
                lambda: bench_mosaic_em(rec, X, params, xla_t, want))
    best = {}

    def one(precision, density_cfg, stats_cfg, swept, centred=False):
        step = kernel_em_step(precision, density_cfg, stats_cfg, centred)
        check_close(f"loglik {precision}", step(X, params)[1], want, rtol=1e-4)
        t = time_fn(step, [(X, params)])
        # the centred pass does every second-moment product ("full")
        flop = kernel_flop(n, p, K, "full" if centred else stats_cfg["moments"])
        statistics = "about the means" if centred else "about the origin"
        rec.record("em_iteration", shape=shape, dtype="float32", backend="pallas", timing=t,
                   items=n, item_name="rows", baseline="xla_quadratic_gemm",
                   extra={"precision": precision, "density_blocks": density_cfg,
                          "stats_blocks": stats_cfg, "blocks": "swept" if swept else "default",
                          "statistics": statistics,
                          "speedup_vs_xla": xla_t.median_ms / t.median_ms, "flop": flop,
                          "tflops": flop / (t.median_ms * 1e-3) / 1e12})
        print(f"em_iteration {precision} {'swept' if swept else 'default'} {statistics}: "
              f"{t.median_ms:.2f} ms ({xla_t.median_ms / t.median_ms:.2f}x XLA)", flush=True)
        if not centred and (precision not in best
                            or t.median_ms < best[precision][0].median_ms):
            best[precision] = (t, (density_cfg, stats_cfg))

    # the headline at the default blocks, then the block sweep, per precision
    for precision in ("highest",) if INTERPRET else ("tf32x3", "highest"):
        defaults = kernels.DEFAULT_BLOCKS[precision]
        guarded(rec, "em_iteration", shape, {"precision": precision, "blocks": "default"},
                lambda precision=precision, defaults=defaults: one(
                    precision, defaults["density"], defaults["stats"], False))
        # what the EM drivers run: statistics about the previous means
        guarded(rec, "em_iteration", shape, {"precision": precision, "blocks": "default",
                                             "statistics": "about the means"},
                lambda precision=precision, defaults=defaults: one(
                    precision, defaults["density"], defaults["stats"], False, centred=True))
        chosen = sweep_pieces(rec, X, params, precision)
        print(f"fastest pieces ({precision}): {chosen}", flush=True)
        if len(chosen) == 2:
            guarded(rec, "em_iteration", shape, {"precision": precision, **chosen},
                    lambda precision=precision, chosen=chosen: one(
                        precision, chosen["density"], chosen["statistics"], True))
    return xla_t, best


def bench_reference_em(rec, X, params, xla_t):
    n, p = X.shape
    t = time_fn(jax.jit(reference_em_iteration), [(X, params)])
    rec.record("em_iteration", shape=(n, p, K), dtype="float32", backend="xla_reference",
               timing=t, items=n, item_name="rows", baseline="xla_quadratic_gemm",
               extra={"precision": "highest", "note": "what backend='auto' runs off-kernel",
                      "speedup_vs_xla": xla_t.median_ms / t.median_ms})
    return t


def bench_sklearn(rec, X, params, kernel_ms):
    from sklearn.mixture import GaussianMixture

    n_host = N_HOST
    Xh = np.asarray(X[:n_host], dtype=np.float64)
    gm = GaussianMixture(K, covariance_type="full", max_iter=1)
    gm.weights_ = np.asarray(params.weights, np.float64)
    gm.means_ = np.asarray(params.means, np.float64)
    gm.covariances_ = np.asarray(params.covariances, np.float64)
    gm.precisions_cholesky_ = np.asarray(params.precisions_cholesky, np.float64)
    times = []
    for _ in range(2):
        start = time.perf_counter()
        _, log_resp = gm._e_step(Xh)
        gm._m_step(Xh, log_resp)
        times.append(time.perf_counter() - start)
    seconds = float(np.median(times)) * (N / n_host)
    rec.record("sklearn_iteration", shape=(N, P, K), dtype="float64", backend="sklearn_cpu",
               timing=None, extra={"measured_n": n_host, "measured_s": times,
                                   "extrapolated_ms_at_1e6": seconds * 1e3,
                                   "host_cpus": os.cpu_count(),
                                   "note": f"median of 2 iterations at n={n_host}, "
                                           f"scaled x{N // n_host} (linear in n)",
                                   "speedup_kernel_vs_sklearn": seconds * 1e3 / kernel_ms})


def bench_gibbs(rec, X, params, settings):
    """``settings``: {precision: (density blocks, statistics blocks)} to time."""
    n, p = X.shape
    prior = NIWPrior(jnp.zeros(p, jnp.float32), jnp.float32(0.01), jnp.float32(p + 2.0),
                     jnp.eye(p, dtype=jnp.float32) * 0.3)
    sticks = StickBreakingPrior(jnp.float32(1.0), jnp.float32(1.0), jnp.float32(1.0))
    state = GibbsState(params, jnp.zeros(K, jnp.float32), jnp.float32(1.0))
    keys = [(jax.random.key(i),) for i in range(4)]
    xla = jax.jit(lambda key: xla_gibbs_sweep(key, X, state, prior, sticks))
    xla_t = time_fn(xla, keys)
    rec.record("gibbs_sweep", shape=(n, p, K), dtype="float32", backend="xla_quadratic_gemm",
               timing=xla_t, items=n, item_name="rows", extra={"precision": "highest"})

    def one(precision, cfg):
        density, stats = cfg
        # the draw needs the density pass's component blocks inside the statistics pass's
        density = {**density, "block_k": min(density["block_k"], stats["block_k"])}
        fn = jax.jit(lambda key: kernel_gibbs_sweep(key, X, state, prior, sticks,
                                                    precision=precision,
                                                    density_blocks=density, stats_blocks=stats))
        t = time_fn(fn, keys)
        rec.record("gibbs_sweep", shape=(n, p, K), dtype="float32", backend="pallas",
                   timing=t, items=n, item_name="rows", baseline="xla_quadratic_gemm",
                   extra={"precision": precision, "density_blocks": density,
                          "stats_blocks": stats, "label_blocks": LABEL_BLOCKS[precision],
                          "speedup_vs_xla": xla_t.median_ms / t.median_ms})
        print(f"gibbs_sweep {precision}: {t.median_ms:.2f} ms "
              f"({xla_t.median_ms / t.median_ms:.2f}x XLA)", flush=True)

    for precision, cfg in settings.items():
        guarded(rec, "gibbs_sweep", (n, p, K), {"precision": precision},
                lambda precision=precision, cfg=cfg: one(precision, cfg))


def bench_fit_1e8(rec, precision, cfg):
    from gpustat.mixture import fit_em

    n = N_HUGE
    X, params = make_problem(n, P, K)  # same means/covariances as the 1e6 problem
    jax.block_until_ready(X)
    # fit_em runs the kernels' default blocks (make_problem's X is centred, as fit_em
    # centres it)
    fit = jax.jit(functools.partial(fit_em, tol=0.0, max_iter=2,
                                    backend="interpret" if INTERPRET else "pallas",
                                    precision=precision))
    start = time.perf_counter()
    result = jax.block_until_ready(fit(X, params))
    seconds = time.perf_counter() - start
    stats = jax.devices()[0].memory_stats() or {}
    rec.record("fit_1e8", shape=(n, P, K), dtype="float32", backend="pallas", timing=None,
               extra={"precision": precision, "iterations": int(result.n_iter),
                      "status": int(result.status), "default_blocks": cfg,
                      "lower_bound": float(result.lower_bound),
                      "wall_s_including_compile": seconds,
                      "peak_bytes_in_use": stats.get("peak_bytes_in_use"),
                      "data_bytes": n * P * 4})


def bench_at_1e6(rec, quick):
    """Every n = 1e6 case, the EM iteration first; returns the best kernel setting per
    precision."""
    X, params = make_problem(N, P, K)
    xla_t, best = bench_em(rec, X, params, quick)
    for precision, (t, cfg) in best.items():
        print(f"best {precision}: {t.median_ms:.2f} ms {cfg} "
              f"({xla_t.median_ms / t.median_ms:.2f}x XLA)", flush=True)
    errors = check_precision_vs_float64(rec, X, params)
    print("per-point log-likelihood max |error| vs float64:", errors, flush=True)
    bench_gibbs(rec, X, params, {precision: cfg for precision, (_, cfg) in best.items()})
    guarded(rec, "em_iteration", (N, P, K), {"backend": "xla_reference"},
            lambda: bench_reference_em(rec, X, params, xla_t))
    if not quick:  # host CPUs, ~30 s; --quick leaves it out
        kernel_ms = min(t.median_ms for t, _ in best.values()) if best else xla_t.median_ms
        guarded(rec, "sklearn_iteration", (N, P, K), {},
                lambda: bench_sklearn(rec, X, params, kernel_ms))
    return best


def bench_float64(rec):
    """float64 kernels (default settings) against XLA's chunked reference, which is what
    ``backend="auto"`` ran for float64 before they were measured: the density pass
    (log p(x)), one EM iteration, and a Gibbs label draw with its label statistics."""
    X32, params32 = make_problem(N, P, K)
    X = X32.astype(jnp.float64)
    params = jax.tree.map(lambda a: a.astype(jnp.float64), params32)
    shape = (N, P, K)
    key = jax.random.key(7)

    def reference_labels(X, params):
        labels = ref.sample_labels(key, X, params)
        return labels, ref.suff_stats_from_labels(X, labels, K)

    def kernel_labels(X, params):
        labels, _, stats = kernels.sample_labels_with_stats(key, X, params,
                                                            interpret=INTERPRET)
        return labels, stats

    cases = {  # case: (kernel, reference, check of the kernel's output against the reference's)
        "log_prob": (functools.partial(kernels.log_prob, interpret=INTERPRET), ref.log_prob,
                     lambda got, want: check_close("log_prob float64", got, want, rtol=1e-10)),
        "em_iteration": (kernel_em_step("highest", None, None), reference_em_iteration,
                         lambda got, want: check_close("loglik float64", got[1], want[1],
                                                       rtol=1e-12)),
        "gibbs_labels": (kernel_labels, reference_labels, lambda got, want: (
            check_close("labels float64", got[0], want[0], rtol=0.0),
            check_close("label sum_xx float64", got[1].sum_xx, want[1].sum_xx, rtol=1e-12))),
    }

    def one(case, kernel_fn, reference_fn, check):
        kernel, reference = jax.jit(kernel_fn), jax.jit(reference_fn)
        check(kernel(X, params), reference(X, params))
        ref_t, t = time_fn(reference, [(X, params)]), time_fn(kernel, [(X, params)])
        rec.record(case, shape=shape, dtype="float64", backend="xla_reference", timing=ref_t,
                   items=N, item_name="rows")
        rec.record(case, shape=shape, dtype="float64", backend="pallas", timing=t, items=N,
                   item_name="rows", baseline="xla_reference",
                   extra={"blocks": kernels.default_blocks(jnp.float64, "highest"),
                          "speedup_vs_reference": ref_t.median_ms / t.median_ms})
        print(f"{case} float64: kernels {t.median_ms:.2f} ms, reference "
              f"{ref_t.median_ms:.2f} ms ({ref_t.median_ms / t.median_ms:.1f}x)", flush=True)

    for case, fns in cases.items():
        guarded(rec, case, shape, {"precision": "float64"},
                lambda case=case, fns=fns: one(case, *fns), dtype="float64")


def run(quick: bool, out=None) -> None:
    rec = Recorder("mixture", out)
    rec.measure_copy()
    with x64_for(jnp.float32):  # every timed case is float32 (see x64_for)
        _run_float32(rec, quick)
    with x64_for(jnp.float64):
        bench_float64(rec)


def _run_float32(rec, quick):
    best = bench_at_1e6(rec, quick)
    if best:
        precision = "tf32x3" if "tf32x3" in best else "highest"
        guarded(rec, "fit_1e8", (N_HUGE, P, K), {"precision": precision},
                lambda: bench_fit_1e8(rec, precision, kernels.DEFAULT_BLOCKS[precision]))


if __name__ == "__main__":
    main_from_args(run, "mixture")
