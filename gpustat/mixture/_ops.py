"""Public Gaussian-mixture E-step ops: validate, dispatch to the reference or the Pallas kernels.

Every op takes keyword-only ``backend`` ("auto" | "pallas" | "reference" | "interpret")
and, for float32 inputs on a kernel backend, ``precision`` ("highest" = IEEE fp32 FMA,
"tf32x3" = three TF32 tensor-core products; plain TF32 is never used). The E-step ops
(``suff_stats`` and the EM drivers) also take ``precision="f16x3"``: the Triton E-step of
:mod:`gpustat.triton.mixture` (``backend="triton"`` or ``"auto"``) or its Mosaic GPU twin
(``backend="mosaic"``, sm_90+), three float16 products over power-of-two-scaled
operands, float32 only. float64 stays
float64 on every backend; 16-bit inputs compute in float32. The kernels handle
p <= 32 features. On a GPU "auto" runs the kernels for every dtype (faster than XLA's
reference per EM iteration in float32 and float64: ``bench_mixture``). On
kernel paths the public ops shift X by sum_j w_j mu_j (by the data mean for labels)
before the whitened products x^T U_j and shift the moments back, so uncentred float32
data keep their accuracy; the drivers, which centre X themselves, call the kernels
directly. The ops are differentiable (``jax.grad``, ``jax.jvp``) on every backend in X,
the parameters and the sample weights: on kernel paths a ``custom_jvp`` runs the kernel
forward and takes the derivatives of the reference (the kernels have no backward pass).
Labels are integers and have no derivative.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from gpustat._backend import mosaic_unavailable_reason, resolve_backend
from gpustat.mixture._validation import (
    check_data,
    check_labels,
    check_params,
    check_precision,
    check_sample_weight,
)
from gpustat.pallas import mixture as _kernels
from gpustat.reference import mixture as _reference
from gpustat.reference.mixture import MixtureParams, SuffStats

__all__ = [
    "log_prob",
    "mvn_logpdf",
    "responsibilities",
    "sample_labels",
    "suff_stats",
    "suff_stats_from_labels",
]


# the ops whose work is the E-step statistics: they have the Triton path ("f16x3")
TRITON_OPS = ("suff_stats", "fit_em", "online_em_step")


def resolve_mixture_backend(backend: str, n_features: int, op: str,
                            precision: str = "highest", *, dtype=jnp.float32,
                            n_components: int = 1) -> str:
    """The concrete path ("pallas" | "interpret" | "reference" | "triton" | "mosaic") for
    an op on p features. precision="f16x3" is the Triton and Mosaic GPU E-steps':
    ``"auto"`` then takes the one ``AUTO_RULES`` names where it can run, else "triton"
    where jax-triton is installed, else the reference."""
    if precision == "f16x3":
        if op not in TRITON_OPS:
            raise ValueError(f"mixture.{op}: precision='f16x3' is the Triton E-step's (and its "
                             f"Mosaic GPU twin's; ops {TRITON_OPS}); use 'highest' or 'tf32x3'")
        if backend in ("pallas", "interpret"):
            raise ValueError(f"mixture.{op}: precision='f16x3' runs on backend='triton' or "
                             f"'mosaic' (or 'auto', 'reference'), got {backend=!r}")
    elif backend in ("triton", "mosaic") and op in TRITON_OPS:
        raise ValueError(f"mixture.{op}: backend={backend!r} computes the E-step at "
                         f"precision='f16x3'; pass it explicitly, got {precision=!r}")
    kernels = ("triton", "mosaic") if precision == "f16x3" else ("pallas",)
    unsupported = None
    if precision == "f16x3" and backend in ("auto", "mosaic") and not mosaic_unavailable_reason():
        from gpustat.pallas._mosaic_mixture import supports

        reason = supports(dtype, n_features, n_components)
        unsupported = {"mosaic": reason} if reason else None
    return resolve_backend(
        backend, op=f"mixture.{op}", capability="mixture", shape_class=f"{precision}/p{n_features}",
        kernels=kernels, kernel_supports=n_features <= _kernels.MAX_FEATURES,
        unsupported_reason=f"the kernels take p <= {_kernels.MAX_FEATURES} features, got "
                           f"p={n_features}", unsupported=unsupported)


def _prepare(X, params, op, backend, precision):
    X = check_data(X)
    params = check_params(params, X.shape[1], X.dtype)
    check_precision(precision)
    return X, params, resolve_mixture_backend(backend, X.shape[1], op, precision,
                                              dtype=X.dtype, n_components=params.n_components)


def _centred(X, params: MixtureParams):
    """X - s and the means - s, s = sum_j w_j mu_j: the kernels' products x^T U_j - mu_j^T U_j
    cancel like |x - s| |U_j| eps, so a common shift near the data keeps float32 accurate."""
    shift = jnp.matmul(params.weights, params.means, precision=jax.lax.Precision.HIGHEST)
    return X - shift, dataclasses.replace(params, means=params.means - shift), shift


def _unshift_stats(stats: SuffStats, shift) -> SuffStats:
    """Raw moments of x from those of x - s: S1 + N s, S2 + S1 s^T + s S1^T + N s s^T."""
    n = stats.counts[:, None]
    sum_x = stats.sum_x + n * shift
    cross = stats.sum_x[:, :, None] * shift[None, None, :]
    sum_xx = (stats.sum_xx + cross + jnp.swapaxes(cross, 1, 2)
              + n[:, :, None] * shift[:, None] * shift[None, :])
    return SuffStats(stats.counts, sum_x, sum_xx, stats.loglik)


def _kernel_kwargs(path, precision):
    return {"interpret": path == "interpret", "precision": precision}


# compiled programs by (op, path, precision, static settings): an eager call of an op
# with shapes seen before runs its program without tracing or compiling anything
_PROGRAMS: dict[tuple, Callable] = {}


def _run(key: tuple, build: Callable, *args):
    """Run the program of ``key`` on ``args``, built once from ``build() -> (kernel_fn,
    reference_fn)`` (``kernel_fn`` None on the reference path). A kernel is differentiated
    as the reference (same arguments and outputs) through a ``custom_jvp`` outside the
    dispatch, since ``pallas_call`` has no derivative rule for these kernels; reverse mode
    transposes the reference's linearisation."""
    program = _PROGRAMS.get(key)
    if program is None:
        kernel_fn, reference_fn = build()
        if kernel_fn is None:
            program = jax.jit(reference_fn)
        else:
            op = jax.custom_jvp(kernel_fn)

            @op.defjvp
            def _jvp(primals, tangents):
                return op(*primals), jax.jvp(reference_fn, primals, tangents)[1]

            program = jax.jit(op)
        _PROGRAMS[key] = program
    return program(*args)


def _row_density_op(op: str, X, params, backend, precision):
    """Validate and dispatch ``mvn_logpdf`` or ``log_prob`` (kernels on centred data)."""
    X, params, path = _prepare(X, params, op, backend, precision)

    def build():
        def kernel(X, params):
            Xs, params_s, _ = _centred(X, params)
            return getattr(_kernels, op)(Xs, params_s, **_kernel_kwargs(path, precision))

        return (None if path == "reference" else kernel), getattr(_reference, op)

    return _run((op, path, precision), build, X, params)


def mvn_logpdf(X: Float[Array, "n p"], params: MixtureParams, *, backend: str = "auto",
               precision: str = "highest") -> Float[Array, "n m"]:
    """Component log-densities log N(x_i | mu_j, Sigma_j).

    Args:
        X: (n, p) data, float32 or float64 (16-bit computes in float32).
        params: :class:`MixtureParams` with k = m components.
        backend: "auto", "pallas", "reference" or "interpret".
        precision: float32 matmul precision on kernel backends, "highest" or "tf32x3".

    Returns:
        (n, m) log-densities in X's compute dtype. The reference computes them in row
        chunks; the kernel writes one (block_n, block_k) tile per program.
    """
    return _row_density_op("mvn_logpdf", X, params, backend, precision)


def log_prob(X: Float[Array, "n p"], params: MixtureParams, *, backend: str = "auto",
             precision: str = "highest") -> Float[Array, " n"]:
    """Per-row mixture log-likelihood log p(x_i) = logsumexp_j (log w_j + log N_ij).

    Args:
        X: (n, p) data, float32 or float64.
        params: :class:`MixtureParams` (m components).
        backend: "auto", "pallas", "reference" or "interpret".
        precision: float32 matmul precision on kernel backends.

    Returns:
        (n,) log-likelihoods; memory O(n p + m p^2) (the n x m matrix is never formed).
    """
    return _row_density_op("log_prob", X, params, backend, precision)


def responsibilities(X: Float[Array, "n p"], params: MixtureParams, *, backend: str = "auto",
                     precision: str = "highest") -> Float[Array, "n m"]:
    """Posterior component probabilities r_ij = w_j N_ij / p(x_i).

    Args:
        X: (n, p) data, float32 or float64.
        params: :class:`MixtureParams` (m components).
        backend: "auto", "pallas", "reference" or "interpret".
        precision: float32 matmul precision on kernel backends.

    Returns:
        (n, m) responsibilities, rows summing to one.
    """
    X, params, path = _prepare(X, params, "responsibilities", backend, precision)

    def build():
        def kernel(X, params):
            Xs, params_s, _ = _centred(X, params)
            log_dens = _kernels.mvn_logpdf(Xs, params_s, **_kernel_kwargs(path, precision))
            # normalise these logits: a log p(x) from another pass rounds differently
            # (float32 rows 1000 sd from every component, |log N| ~ 1e6, summed to 1.06)
            return jax.nn.softmax(log_dens + jnp.log(params.weights), axis=1)

        return (None if path == "reference" else kernel), _reference.responsibilities

    return _run(("responsibilities", path, precision), build, X, params)


def suff_stats(X: Float[Array, "n p"], params: MixtureParams,
               sample_weight: Float[Array, " n"] | None = None,
               pivot: Float[Array, "m p"] | None = None, *, backend: str = "auto",
               precision: str = "highest") -> SuffStats:
    """Fused E-step: N_j, sum_i r_ij x_i, sum_i r_ij x_i x_i^T and the log-likelihood.

    The kernel path works per chunk of 2^20 rows (memory O(chunk x m), never n x m): a
    density pass writes the chunk's logits and a log-sum-exp per component block
    (combined over blocks into log p(x_i)); a statistics pass reads each component
    block's logits back, forms the responsibilities and accumulates the statistics in
    registers.

    Args:
        X: (n, p) data, float32 or float64. Without ``pivot`` the moments returned are
            raw (about the origin): centre X first when covariances will be formed from
            them, so that S2 / N - mu mu^T does not cancel.
        params: :class:`MixtureParams` (m components).
        sample_weight: optional (n,) non-negative row weights w_i (default 1).
        pivot: optional (m, p) pivots c_j (e.g. ``params.means``): the moments are then
            sum_i r_ij (x_i - c_j) and sum_i r_ij (x_i - c_j)(x_i - c_j)^T, each
            deviation formed before its product, for ``m_step(..., pivot=pivot)``: the
            covariances keep their small eigenvalues wherever the components sit. The
            Triton E-step ("f16x3") takes no pivot.
        backend: "auto", "pallas", "reference", "interpret", "triton" or "mosaic".
        precision: float32 matmul precision on kernel backends: "highest", "tf32x3" or
            "f16x3" (the Triton or Mosaic GPU E-step, float32 X and m <= 256 only).

    Returns:
        :class:`SuffStats` with counts (m,), sum_x (m, p), sum_xx (m, p, p) and
        loglik = sum_i w_i log p(x_i).
    """
    X, params, path = _prepare(X, params, "suff_stats", backend, precision)
    w = check_sample_weight(sample_weight, X.shape[0], X.dtype)
    if pivot is not None:
        if path in ("triton", "mosaic"):
            raise ValueError(f"pivot: the {path} E-step (precision='f16x3') accumulates "
                             "moments about the origin only; use precision='highest'")
        pivot = jnp.asarray(pivot, X.dtype)
        if pivot.shape != params.means.shape:
            raise ValueError(f"pivot must have the means' shape {params.means.shape}, got "
                             f"{pivot.shape=}")

    def build():
        def kernel(X, params, w, pivot):
            Xs, params_s, shift = _centred(X, params)
            if pivot is not None:  # moments about the pivots do not move with the shift
                return dispatch_suff_stats(Xs, params_s, w, path=path, precision=precision,
                                           pivot=pivot - shift)
            return _unshift_stats(
                dispatch_suff_stats(Xs, params_s, w, path=path, precision=precision), shift)

        return (None if path == "reference" else kernel), _reference.suff_stats

    return _run(("suff_stats", path, precision), build, X, params, w, pivot)


def dispatch_suff_stats(X, params, w, *, path: str, precision: str,
                        pivot=None) -> SuffStats:
    """:func:`suff_stats` on validated input and a resolved path (for the drivers' loops);
    with ``pivot`` (m, p) the moments of x - c_j per component (the drivers' M-step
    statistics, :func:`gpustat.mixture.m_step`)."""
    if path == "reference":
        return _reference.suff_stats(X, params, w, pivot)
    if path == "triton":
        from gpustat.triton.mixture import suff_stats as triton_suff_stats

        if pivot is not None:  # its quadratic-feature GEMM sums moments about the origin
            raise ValueError("the Triton E-step (precision='f16x3') takes no pivot")
        return triton_suff_stats(X, params, w)
    if path == "mosaic":
        from gpustat.pallas._mosaic_mixture import suff_stats as mosaic_suff_stats

        if pivot is not None:
            raise ValueError("the Mosaic GPU E-step (precision='f16x3') takes no pivot")
        return mosaic_suff_stats(X, params, w)
    return _kernels.suff_stats(X, params, w, pivot=pivot, **_kernel_kwargs(path, precision))


def sample_labels(key, X: Float[Array, "n p"], params: MixtureParams, *,
                  backend: str = "auto", precision: str = "highest",
                  return_log_prob: bool = False):
    """Draw z_i ~ Categorical(r_i.) for every row, fused with the densities.

    Row i uses the single uniform u_i = ``jax.random.uniform(key, (n,))[i]`` and takes
    the first component whose cumulative responsibility exceeds it (inverse CDF), so
    every backend draws the same labels from the same key.

    Args:
        key: a JAX PRNG key.
        X: (n, p) data, float32 or float64.
        params: :class:`MixtureParams` (m components).
        backend: "auto", "pallas", "reference" or "interpret".
        precision: float32 matmul precision on kernel backends.
        return_log_prob: also return log p(x_i) (n,), computed in the same pass.

    Returns:
        (n,) int32 labels in [0, m) (and the (n,) log-likelihoods when asked: these are
            differentiable like :func:`log_prob`, the labels are not).
    """
    X, params, path = _prepare(X, params, "sample_labels", backend, precision)
    return_log_prob = bool(return_log_prob)

    def build():
        def kernel(key, X, params):
            Xs, params_s, _ = _centred(X, params)
            return dispatch_sample_labels(key, Xs, params_s, path=path, precision=precision,
                                          return_log_prob=return_log_prob)

        draw = functools.partial(_reference.sample_labels, return_log_prob=return_log_prob)
        return (None if path == "reference" else kernel), draw

    return _run(("sample_labels", path, precision, return_log_prob), build, key, X, params)


def dispatch_sample_labels(key, X, params, *, path: str, precision: str,
                           return_log_prob: bool = False):
    """:func:`sample_labels` on validated input and a resolved path."""
    if path == "reference":
        return _reference.sample_labels(key, X, params, return_log_prob=return_log_prob)
    return _kernels.sample_labels(key, X, params, return_log_prob=return_log_prob,
                                  **_kernel_kwargs(path, precision))


def dispatch_sample_labels_with_stats(key, X, params, *, path: str, precision: str):
    """Labels, log p(x) and the labels' :class:`SuffStats` in one pass on kernel paths.

    The kernel draws each row's label inside the component block where its uniform
    lands and accumulates that block's one-hot statistics in the same program; the
    reference draws, then counts. Same labels as :func:`sample_labels` from the same key.
    """
    if path == "reference":
        labels, lp = _reference.sample_labels(key, X, params, return_log_prob=True)
        stats = _reference.suff_stats_from_labels(X, labels, params.n_components)
        return labels, lp, stats
    return _kernels.sample_labels_with_stats(key, X, params, **_kernel_kwargs(path, precision))


def suff_stats_from_labels(X: Float[Array, "n p"], labels: Int[Array, " n"], n_components: int,
                           sample_weight: Float[Array, " n"] | None = None, *,
                           backend: str = "auto", precision: str = "highest") -> SuffStats:
    """Statistics of hard labels: N_j, sum_{z_i=j} w_i x_i, sum_{z_i=j} w_i x_i x_i^T.

    Args:
        X: (n, p) data, float32 or float64.
        labels: (n,) integer labels in [0, m) (range checked on concrete input).
        n_components: m.
        sample_weight: optional (n,) non-negative row weights.
        backend: "auto", "pallas", "reference" or "interpret".
        precision: float32 matmul precision on kernel backends.

    Returns:
        :class:`SuffStats` (loglik = 0: hard labels carry no likelihood).
    """
    X = check_data(X)
    check_precision(precision)
    if int(n_components) < 1:
        raise ValueError(f"n_components must be >= 1, got {n_components=}")
    labels = check_labels(labels, X.shape[0], n_components)
    w = check_sample_weight(sample_weight, X.shape[0], X.dtype)
    path = resolve_mixture_backend(backend, X.shape[1], "suff_stats_from_labels", precision)
    n_components = int(n_components)

    def build():
        def reference(X, labels, w):
            return _reference.suff_stats_from_labels(X, labels, n_components, w)

        def kernel(X, labels, w):
            shift = jnp.mean(X, axis=0)
            stats = dispatch_suff_stats_from_labels(X - shift, labels, n_components, w,
                                                    path=path, precision=precision)
            return _unshift_stats(stats, shift)

        return (None if path == "reference" else kernel), reference

    return _run(("suff_stats_from_labels", path, precision, n_components), build, X, labels, w)


def dispatch_suff_stats_from_labels(X, labels, n_components, w, *, path: str,
                                    precision: str) -> SuffStats:
    """:func:`suff_stats_from_labels` on validated input and a resolved path."""
    if path == "reference":
        return _reference.suff_stats_from_labels(X, labels, n_components, w)
    return _kernels.suff_stats_from_labels(X, labels, n_components, w,
                                           **_kernel_kwargs(path, precision))

