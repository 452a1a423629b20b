"""``GaussianMixture``: scikit-learn's estimator (same constructor, attributes and methods) on JAX.

Fitting runs :func:`gpustat.mixture.fit_em` (fused E-step kernel on a CUDA GPU, the
reference elsewhere), restarts batched on the device. Extra constructor arguments:
``backend`` ("auto" | "pallas" | "reference" | "interpret") and ``precision`` ("highest"
= IEEE float32 matmuls, "tf32x3" = error-compensated TF32; plain TF32 is never used).
float32 input is fitted in float32, float64 in float64 (needs ``jax_enable_x64``; without
it float64 input computes in float32 with a ``UserWarning``); integer
and bool input is converted to float64 (float32 when ``jax_enable_x64`` is off), as
scikit-learn converts it; a narrower X given to a fitted estimator (``predict``, ``score``,
...) is cast up to the fitted parameters' dtype. ``partial_fit`` adds streaming
(mini-batch) EM, which scikit-learn lacks.
"""

from __future__ import annotations

import functools
import math
import numbers
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from sklearn.base import BaseEstimator, DensityMixin
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils import check_random_state
from sklearn.utils.validation import _check_feature_names, check_array, check_is_fitted

from gpustat._arrays import next_pow2, pad_rows, row_bucket
from gpustat._checks import is_int
from gpustat._compile_ahead import compile_ahead_once, run_program
from gpustat.mixture._em import (
    STATUS_OK,
    fit_em_rows_jit,
    fit_em_rows_quick_jit,
    online_em_init,
    online_em_step,
    online_params,
)
from gpustat.mixture._initialize import INIT_METHODS, initialize_rows, initialize_rows_quick
from gpustat.mixture._mstep import m_step
from gpustat.mixture._ops import log_prob, mvn_logpdf, resolve_mixture_backend, suff_stats
from gpustat.mixture._validation import (
    PRECISION_CHOICES,
    check_data,
    check_positive_definite,
    integers_as_float,
)
from gpustat.reference.mixture import COVARIANCE_TYPES, MixtureParams

__all__ = ["ConvergenceWarning", "GaussianMixture"]

# padded rows x p^2 x components up to which a CPU fit compiles its programs quickly
_QUICK_COMPILE_SIZE = 1 << 22
# rows x p^2 of data small enough to compute in microseconds: fewer rows are padded up to
# it (a power of two), so that small data of any size shares one set of programs
_SMALL_DATA_SIZE = 1 << 11


def _padded_rows(n: int, p: int) -> int:
    """Rows that n rows of p features are padded to (with weight 0): :func:`row_bucket`,
    and at least the largest power of two r with r p^2 <= ``_SMALL_DATA_SIZE``."""
    return max(row_bucket(n), 1 << max((_SMALL_DATA_SIZE // (p * p)).bit_length() - 1, 0))


_COLLAPSE_MESSAGE = (
    "Fitting the mixture model failed because some components have ill-defined empirical "
    "covariance (for instance caused by singleton or collapsed samples). Try to decrease "
    "the number of components, increase reg_covar, or scale the input data.")


def _collapse_message(X, params: MixtureParams, reg_covar: float, settings: dict) -> str:
    """Which component's covariance is not positive definite after the E-step at
    ``params`` (the last good iteration), and why: its scatter about its own mean, the
    smallest eigenvalue (or variance) of that scatter and reg_covar. ``settings``: the
    backend and precision of a density op (:meth:`GaussianMixture._density_settings`)."""
    kind = params.covariance_type
    factors = np.asarray(params.precisions_cholesky)
    factors = factors.reshape(1 if kind == "tied" else params.n_components, -1)
    bad = np.flatnonzero(~np.all(np.isfinite(factors), axis=1))
    if bad.size:  # the iterations never started
        what = "the tied covariance" if kind == "tied" else f"component {int(bad[0])}"
        return (f"Fitting the mixture model failed: the initial {kind} covariance of {what} "
                f"is not positive definite (an initial cluster on a lower-dimensional set, "
                f"e.g. one repeated point, with reg_covar={reg_covar!r}). Increase "
                f"reg_covar, pass precisions_init, or decrease n_components.")
    stats = suff_stats(X, params, pivot=params.means, **settings)
    scatter = np.asarray(m_step(stats, covariance_type=kind, reg_covar=0.0,
                                pivot=params.means).covariances, dtype=np.float64)
    if kind in ("full", "tied"):
        smallest = np.linalg.eigvalsh(scatter)[..., 0]
    else:
        smallest = scatter.min(axis=-1) if kind == "diag" else scatter
    what = "the tied covariance" if kind == "tied" else None
    if what is None:
        j = int(np.argmin(smallest))
        smallest = smallest[j]
        what = (f"component {j} (responsibility {float(stats.counts[j]):.4g} of "
                f"{X.shape[0]} rows)")
    return (f"Fitting the mixture model failed: the {kind} covariance of {what} is not "
            f"positive definite: the smallest eigenvalue of its scatter about its mean is "
            f"{float(smallest):.3g}, and reg_covar={reg_covar!r} does not lift it above 0 "
            f"in {X.dtype} (its rows lie on a lower-dimensional set, e.g. one repeated "
            f"point). Increase reg_covar or decrease n_components.")


def _first_components(params: MixtureParams, k: int) -> MixtureParams:
    """The first k components of ``params`` (the others have weight 0), cut on the host
    (an eager slice would compile a program per k)."""
    if params.n_components == k:
        return params
    tied = params.covariance_type == "tied"
    cut = lambda a: jax.device_put(np.asarray(a)[:k])  # noqa: E731
    return MixtureParams(cut(params.weights), cut(params.means),
                         params.covariances if tied else cut(params.covariances),
                         params.precisions_cholesky if tied else cut(params.precisions_cholesky),
                         params.covariance_type)


def _as_dtype(params: MixtureParams, dtype) -> MixtureParams:
    return jax.tree.map(lambda a: jnp.asarray(a, dtype), params)


def _in_form(params: MixtureParams, kind: str) -> MixtureParams:
    """``params`` with covariance type ``kind``: diag parameters as dense "full" ones (their
    diagonals embedded in (..., p, p) zeros) or back, on the host (no program); any other
    pair unchanged. Leading (restart) axes are kept."""
    if {params.covariance_type, kind} != {"full", "diag"}:
        return params
    if kind == "full":
        convert = lambda a: a[..., None] * np.eye(a.shape[-1], dtype=a.dtype)  # noqa: E731
    else:
        convert = lambda a: np.diagonal(a, axis1=-2, axis2=-1)  # noqa: E731
    return MixtureParams(params.weights, params.means,
                         jax.device_put(convert(np.asarray(params.covariances))),
                         jax.device_put(convert(np.asarray(params.precisions_cholesky))), kind)


@jax.jit
def _most_probable(log_dens, weights):
    return jnp.argmax(log_dens + jnp.log(weights), axis=1)


@jax.jit
def _posterior_probabilities(log_dens, weights):
    return jax.nn.softmax(log_dens + jnp.log(weights), axis=1)


def _is_real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _check_finite(values: np.ndarray, name: str) -> None:
    if not np.all(np.isfinite(values)):
        bad = int(np.sum(~np.isfinite(values)))
        raise ValueError(f"{name} contains {bad} NaN or infinite values")


def sample_mixture(rng: np.random.RandomState, weights, means, covariances,
                   covariance_type: str, n_samples: int):
    """scikit-learn's ``sample``: (X (n_samples, p) float64, labels (n_samples,)) drawn with
    ``rng`` from weights (m,), means (m, p) and covariances (full (m, p, p), tied (p, p), diag
    (m, p), spherical (m,)): counts per component from one multinomial draw, then full and
    tied components by ``multivariate_normal``, diag and spherical ones as
    mean + z sqrt(variance) with z standard normal."""
    pvals = np.asarray(weights, np.float64)
    counts = rng.multinomial(n_samples, pvals / pvals.sum())
    p = means.shape[1]
    pieces = []
    for j, count in enumerate(counts):
        if covariance_type == "full":
            pieces.append(rng.multivariate_normal(means[j], covariances[j], int(count)))
        elif covariance_type == "tied":
            pieces.append(rng.multivariate_normal(means[j], covariances, int(count)))
        else:  # diag (p,) or spherical () variances, broadcast over the features
            z = rng.standard_normal(size=(int(count), p))
            pieces.append(means[j] + z * np.sqrt(covariances[j]))
    labels = np.repeat(np.arange(len(counts)), counts)
    return np.vstack(pieces), labels


def mixture_settings(est) -> list[tuple[bool, str, str]]:
    """(ok, name, expected) of the settings both mixture estimators share."""
    return [
        (is_int(est.n_components) and est.n_components >= 1, "n_components", "an int >= 1"),
        (est.covariance_type in COVARIANCE_TYPES, "covariance_type",
         f"one of {COVARIANCE_TYPES}"),
        (_is_real(est.tol) and est.tol >= 0, "tol", "a real number >= 0"),
        (_is_real(est.reg_covar) and est.reg_covar >= 0, "reg_covar", "a real number >= 0"),
        (is_int(est.max_iter) and est.max_iter >= 0, "max_iter", "an int >= 0"),
        (is_int(est.n_init) and est.n_init >= 1, "n_init", "an int >= 1"),
        (is_int(est.verbose_interval) and est.verbose_interval >= 1, "verbose_interval",
         "an int >= 1"),
        (est.init_params in INIT_METHODS, "init_params", f"one of {INIT_METHODS}"),
    ]


def check_settings(est, checks) -> None:
    """``ValueError`` naming the first setting of ``checks`` that is not ``ok``."""
    for ok, name, expected in checks:
        if not ok:
            raise ValueError(f"{name} must be {expected}, got {name}={getattr(est, name)!r}")


class GaussianMixture(DensityMixin, BaseEstimator):
    """Gaussian mixture fitted by EM; scikit-learn's ``GaussianMixture`` API on JAX.

    Integer settings (``n_components``, ``max_iter``, ``n_init``) take Python or numpy
    integers, not bools.

    Args:
        n_components: number of mixture components m.
        covariance_type: "full", "tied", "diag" or "spherical".
        tol: convergence threshold on the change of the mean log-likelihood.
        reg_covar: non-negative value added to covariance diagonals.
        max_iter: EM iterations per restart.
        n_init: number of restarts (run batched on the device); the best is kept.
        init_params: "kmeans", "k-means++", "random" or "random_from_data".
        weights_init: optional (m,) initial weights.
        means_init: optional (m, p) initial means.
        precisions_init: optional initial precisions (shape by covariance type:
            full (m, p, p), tied (p, p), diag (m, p), spherical (m,)).
        random_state: None, an int seed in [0, 2**32 - 1] or a ``np.random.RandomState``,
            for initialisation and ``sample``, as in scikit-learn: an int gives the same
            draws every call, None fresh ones (numpy's global generator), a RandomState
            the next ones of its stream (the JAX key of the initialisation is seeded
            from it).
        warm_start: start the next ``fit`` from the current solution.
        verbose: 0 silent; >= 1 prints every restart's iteration, lower bound and its
            change every ``verbose_interval`` iterations (as scikit-learn's verbose >= 2,
            with the restarts run side by side), and a line of the restarts' final lower
            bounds after fitting.
        verbose_interval: iterations between those lines.
        backend: E-step backend, "auto", "pallas", "reference", "interpret", "triton" or
            "mosaic".
        precision: float32 matmul precision of the kernels, "highest", "tf32x3" or "f16x3"
            (the Triton E-step during ``fit``; densities then run at "highest").

    Attributes (after ``fit``): ``weights_`` (m,), ``means_`` (m, p), ``covariances_``,
    ``precisions_``, ``precisions_cholesky_``, ``converged_``, ``n_iter_``,
    ``lower_bound_``, ``lower_bounds_``, ``n_features_in_``, ``params_``
    (:class:`MixtureParams`).
    """

    def __init__(self, n_components: int = 1, *, covariance_type: str = "full",
                 tol: float = 1e-3, reg_covar: float = 1e-6, max_iter: int = 100,
                 n_init: int = 1, init_params: str = "kmeans", weights_init=None,
                 means_init=None, precisions_init=None, random_state=None,
                 warm_start: bool = False, verbose: int = 0, verbose_interval: int = 10,
                 backend: str = "auto", precision: str = "highest"):
        self.n_components = n_components
        self.covariance_type = covariance_type
        self.tol = tol
        self.reg_covar = reg_covar
        self.max_iter = max_iter
        self.n_init = n_init
        self.init_params = init_params
        self.weights_init = weights_init
        self.means_init = means_init
        self.precisions_init = precisions_init
        self.random_state = random_state
        self.warm_start = warm_start
        self.verbose = verbose
        self.verbose_interval = verbose_interval
        self.backend = backend
        self.precision = precision

    # ------------------------------------------------------------------ validation

    def _check_settings(self) -> None:
        check_settings(self, [
            *mixture_settings(self),
            (self.precision in PRECISION_CHOICES, "precision", f"one of {PRECISION_CHOICES}"),
            # numpy's RandomState (used by ``sample``) takes seeds in [0, 2**32 - 1]
            (self.random_state is None
             or isinstance(self.random_state, np.random.RandomState)
             or (is_int(self.random_state) and 0 <= self.random_state < 2**32),
             "random_state", "None or an int in [0, 2**32 - 1] or a np.random.RandomState"),
        ])

    def _key(self):
        """The JAX key of an initialisation: from the int seed, else a seed drawn from
        ``check_random_state(random_state)`` (fresh for None, the stream's next for a
        RandomState)."""
        if is_int(self.random_state):
            return jax.random.key(int(self.random_state))
        return jax.random.key(int(check_random_state(self.random_state).randint(2**31 - 1)))

    def _check_X(self, X, *, fitting: bool, pad: bool = True) -> tuple[jax.Array, int]:
        """(X checked, with its rows padded by zero rows to :func:`row_bucket` when ``pad``,
        the number of rows given): rows of nearby counts (cross-validation folds) share
        the compiled programs; the padding rows get weight 0 in a fit and are cut from
        every per-row result."""
        # scikit-learn's feature names (set by a fit, checked after it), its checks and
        # messages (sparse, complex, object, 1-D, empty input), then gpustat's dtype rules
        # and finiteness check
        _check_feature_names(self, X, reset=fitting)
        X = check_array(X, dtype="numeric", accept_sparse=False, ensure_all_finite=False,
                        ensure_min_samples=2 if fitting else 1, estimator=self)
        if X.dtype == np.float64 and jax.dtypes.canonicalize_dtype(np.float64) != np.float64:
            warnings.warn("X is float64 but jax_enable_x64 is off: GaussianMixture computes "
                          "in float32. Enable it (jax.config.update('jax_enable_x64', True)) "
                          "to compute in float64, or pass float32 X to silence this.",
                          UserWarning, stacklevel=3)
        n = X.shape[0]
        X = check_data(integers_as_float(
            pad_rows(X, _padded_rows(n, X.shape[1]) if pad else n)))
        if fitting:
            if n < self.n_components:
                raise ValueError(f"Expected n_samples >= n_components but got n_components = "
                                 f"{self.n_components}, n_samples = {n}")
        else:
            if X.shape[1] != self.n_features_in_:
                raise ValueError(f"X has {X.shape[1]} features, but GaussianMixture is "
                                 f"expecting {self.n_features_in_} features as input")
            # a narrower X is cast up to the fitted parameters' dtype, never the reverse
            X = X.astype(jnp.promote_types(X.dtype, self.params_.means.dtype))
        return X, n

    def _user_inits(self, p: int, dtype):
        k = int(self.n_components)
        weights = means = precisions = None
        if self.weights_init is not None:
            weights = np.asarray(self.weights_init, dtype=np.float64)
            if weights.shape != (k,):
                raise ValueError(f"weights_init must have shape ({k},), got {weights.shape}")
            _check_finite(weights, "weights_init")
            # the drivers' tolerance: sqrt of the fitting dtype's epsilon
            if (np.any(weights < 0) or np.any(weights > 1)
                    or abs(weights.sum() - 1) > math.sqrt(jnp.finfo(dtype).eps)):
                raise ValueError("weights_init must lie in [0, 1] and sum to 1, got "
                                 f"sum={weights.sum()!r}")
            weights = jnp.asarray(weights, dtype)
        if self.means_init is not None:
            means = np.asarray(self.means_init, dtype=np.float64)
            if means.shape != (k, p):
                raise ValueError(f"means_init must have shape ({k}, {p}), got {means.shape}")
            _check_finite(means, "means_init")
            means = jnp.asarray(means, dtype)
        if self.precisions_init is not None:
            precisions = np.asarray(self.precisions_init, dtype=np.float64)
            expected = {"full": (k, p, p), "tied": (p, p), "diag": (k, p),
                        "spherical": (k,)}[self.covariance_type]
            if precisions.shape != expected:
                raise ValueError(f"precisions_init for covariance_type="
                                 f"{self.covariance_type!r} must have shape {expected}, got "
                                 f"{precisions.shape}")
            _check_finite(precisions, "precisions_init")
            if self.covariance_type in ("full", "tied"):
                check_positive_definite(precisions, "precisions_init")
            elif np.any(precisions <= 0):
                raise ValueError("precisions_init must be positive")
            precisions = jnp.asarray(precisions, dtype)
        return weights, means, precisions

    # ------------------------------------------------------------------ fitting

    def _initial_params(self, X, w, key, n_init: int, n_slots: int | None = None,
                        quick: bool = False, kind: str | None = None,
                        run=run_program) -> MixtureParams:
        """Initial parameters (leading (n_init,) axis) from the rows X with weights w;
        with ``n_slots`` > m (no user inits) the components m..n_slots-1 are absent
        (weight 0), so that every m up to n_slots runs one program. ``kind``: the
        covariance type of the initialisation program ("full" runs "diag" in dense form,
        :meth:`_fit_kind`); the parameters returned may be of either form."""
        p = X.shape[1]
        weights, means, precisions = self._user_inits(p, X.dtype)
        batch = lambda a: jnp.broadcast_to(a, (n_init, *a.shape))  # noqa: E731
        if weights is not None and means is not None and precisions is not None:
            user = MixtureParams.from_precisions(weights, means, precisions,
                                                 self.covariance_type)
            return jax.tree.map(batch, user)
        program = initialize_rows_quick if quick else functools.partial(initialize_rows,
                                                                        run=run)
        kind = kind or self.covariance_type
        init = program(key, X, w, n_slots or int(self.n_components),
                       np.asarray(int(self.n_components), np.int32),
                       self._dense_diag(kind),
                       covariance_type=kind, reg_covar=float(self.reg_covar),
                       method=self.init_params, n_init=n_init)
        if weights is None and means is None and precisions is None:
            return init
        weights = init.weights if weights is None else batch(weights)
        means = init.means if means is None else batch(means)
        if precisions is None:
            return MixtureParams(weights, means, init.covariances, init.precisions_cholesky,
                                 init.covariance_type)
        user = MixtureParams.from_precisions(weights[0], means[0], precisions,
                                             self.covariance_type)
        return MixtureParams(weights, means, batch(user.covariances),
                             batch(user.precisions_cholesky), self.covariance_type)

    def _fit_kind(self, path: str) -> str:
        """The covariance type of the fitting programs: "full" for "diag" too on the
        reference path (whose E-step forms dense factors anyway), with the M-step keeping
        the diagonals, so that both models share their programs; else the model's."""
        return "full" if path == "reference" and self.covariance_type == "diag" else (
            self.covariance_type)

    def _dense_diag(self, kind: str):
        """The programs' ``diagonal`` flag: with "full" programs, whether they fit the diag
        model in dense form (a traced bool, so both share them); None otherwise."""
        return np.asarray(self.covariance_type == "diag") if kind == "full" else None

    def _programs_key(self, X, path: str, kind: str, slots: int | None) -> tuple:
        """What decides the programs of a fit without user inits: the rows' shape, dtype
        and placement, the 64-bit mode, the resolved path and the settings."""
        settings = (self.n_components, self.covariance_type, self.tol, self.reg_covar,
                    self.max_iter, self.n_init, self.init_params, self.precision,
                    self.verbose, self.verbose_interval)
        return (type(self).__name__, X.shape, X.dtype, X.sharding,
                jax.dtypes.canonicalize_dtype(np.float64), path, kind, slots, settings)

    def _has_user_inits(self) -> bool:
        return any(v is not None for v in (self.weights_init, self.means_init,
                                           self.precisions_init))

    def _slots(self, path: str, n_rows: int) -> int | None:
        """Components to fit with on the reference path (CPU, where compilation dominates
        small fits): m padded up to 4, 8, or a size of :func:`row_bucket`, at most the
        rows (padded), with no user inits; None elsewhere (the kernels fit m)."""
        k = int(self.n_components)
        if path != "reference" or self._has_user_inits():
            return None
        return min(max(4, next_pow2(k)) if k <= 8 else row_bucket(k), n_rows)

    def _set_fitted(self, params: MixtureParams, slots: MixtureParams | None = None) -> None:
        """Set the attributes from ``params``; ``slots``: the same fit with absent
        components (weight 0) after them, which the density methods run on (one program
        for every m up to its size)."""
        self.params_ = params
        self._slot_params = params if slots is None else slots
        self.weights_ = np.asarray(params.weights)
        self.means_ = np.asarray(params.means)
        self.covariances_ = np.asarray(params.covariances)
        chol = np.asarray(params.precisions_cholesky)
        self.precisions_cholesky_ = chol
        if self.covariance_type == "full":
            self.precisions_ = chol @ np.swapaxes(chol, -1, -2)
        elif self.covariance_type == "tied":
            self.precisions_ = chol @ chol.T
        else:
            self.precisions_ = chol**2

    def fit(self, X, y=None) -> GaussianMixture:
        """Estimate the parameters with EM (``n_init`` batched restarts).

        A fit discards any streaming state of :meth:`partial_fit`: a later
        ``partial_fit`` continues from the parameters fitted here.

        Args:
            X: (n, p) data, finite, n >= max(2, m); float32 or float64 (integer and bool
                become float64, or float32 when ``jax_enable_x64`` is off).
            y: ignored.

        Returns:
            self.

        Raises:
            ValueError: bad input or settings, or a component collapsing (ill-defined
                covariance): the message suggests increasing ``reg_covar``.
        """
        del y
        self._fit(X)
        return self

    def fit_predict(self, X, y=None) -> np.ndarray:
        """Fit, then return the (n,) most probable component of every row."""
        del y
        X, n = self._fit(X)
        return self._labels(X)[:n]

    def _fit(self, X) -> tuple[jax.Array, int]:
        """:meth:`fit`; returns the checked, padded rows and the number of rows given."""
        self._check_settings()
        X, n = self._check_X(X, fitting=True)
        # padding rows: weight 0; sent once, for the initialisation's programs and EM's
        w = jax.device_put(np.asarray(np.arange(X.shape[0]) < n, X.dtype))
        path = resolve_mixture_backend(self.backend, X.shape[1], "fit_em", self.precision)
        slots = self._slots(path, X.shape[0])
        kind = self._fit_kind(path)
        # small data on a CPU: compiling dominates, so the programs skip LLVM's passes
        quick = (X.devices().pop().platform == "cpu"
                 and X.shape[0] * X.shape[1] ** 2 * (slots or int(self.n_components))
                 <= _QUICK_COMPILE_SIZE)
        do_init = not (self.warm_start and hasattr(self, "converged_"))
        key = self._key() if do_init else None

        def fit_programs(run):
            if do_init:
                init = self._initial_params(X, w, key, int(self.n_init), slots, quick, kind,
                                            run)
                start_bound = -math.inf
            else:
                init, start_bound = self._slot_params, self.lower_bound_
            init = run(_as_dtype, _in_form(init, kind), dtype=X.dtype)
            # the settings were checked by _check_settings, the inits by _user_inits
            return run(
                fit_em_rows_quick_jit if quick else fit_em_rows_jit,
                X, w, init, np.asarray(start_bound, X.dtype),
                self._dense_diag(kind),
                tol=float(self.tol), max_iter=int(self.max_iter),
                reg_covar=float(self.reg_covar), weight_prior=None, component_prior=None,
                precision=self.precision, path=path,
                report_every=int(self.verbose_interval) if self.verbose else 0)

        if do_init and not quick and not self._has_user_inits():
            # the initialisation's programs and EM's compile side by side, not in turn
            compile_ahead_once(self._programs_key(X, path, kind, slots), fit_programs)
        result = fit_programs(run_program)
        fitted = _in_form(result.params, self.covariance_type)
        if int(result.status) != STATUS_OK:
            raise ValueError(_collapse_message(X[:n], fitted, self.reg_covar,
                                               self._density_settings()))
        self.n_features_in_ = X.shape[1]
        self._set_fitted(_first_components(fitted, int(self.n_components)), result.params)
        self.__dict__.pop("_online_state", None)  # partial_fit restarts from these params
        self.converged_ = bool(result.converged)
        self.n_iter_ = int(result.n_iter)
        self.lower_bound_ = float(result.lower_bound)
        self.lower_bounds_ = [float(v) for v in np.asarray(result.lower_bounds)[:self.n_iter_]]
        if self.verbose:
            print(f"GaussianMixture: restarts' lower bounds "
                  f"{np.asarray(result.restart_lower_bounds)}, best {self.lower_bound_:.6g}")
        if not self.converged_ and self.max_iter > 0:
            warnings.warn("Best performing initialization did not converge. Try different "
                          "init parameters, or increase max_iter, tol, or check for "
                          "degenerate data.", ConvergenceWarning, stacklevel=3)
        return X, n

    def partial_fit(self, X, y=None) -> GaussianMixture:
        """One step of streaming (mini-batch) EM on the batch X (b, p).

        The first call starts the stream: from the parameters of the last :meth:`fit`
        when the estimator was fitted by ``fit`` (the stream is reset by every ``fit``),
        otherwise from an initialisation on the batch (``init_params``/user inits). Call
        t = 0, 1, ... of the stream averages the batch's per-row statistics into the
        running ones with step rho_t = (t + 1)^-0.6 (rho_0 = 1: the first batch replaces
        them) and redoes the M-step. Attributes are updated after every call
        (``lower_bound_`` and ``lower_bounds_`` = [``lower_bound_``]: the batch's mean
        log-likelihood before the step; ``n_iter_`` the steps of the stream); returns
        self. X follows :meth:`fit`'s dtype rules (the stream computes in the dtype of the
        batch that started it; a wider batch later raises) and needs b >= max(2, m) rows
        when it starts the stream from an initialisation.
        """
        del y
        self._check_settings()
        starting = not hasattr(self, "_online_state")
        X, _ = self._check_X(X, fitting=starting and not hasattr(self, "params_"), pad=False)
        if starting:
            self._online_state = self._start_stream(X)
        stream_dtype = self._online_state.params.means.dtype
        if jnp.finfo(X.dtype).bits > jnp.finfo(stream_dtype).bits:
            raise ValueError(f"X is {X.dtype} but the stream computes in {stream_dtype} (the "
                             f"dtype it started from); pass X.astype({stream_dtype.name!r})")
        self._online_state, batch_bound = online_em_step(
            self._online_state, X, reg_covar=self.reg_covar, backend=self.backend,
            precision=self.precision)
        params = online_params(self._online_state)
        if not bool(jnp.all(jnp.isfinite(params.precisions_cholesky))):
            raise ValueError(_COLLAPSE_MESSAGE)
        self._set_fitted(params)
        self.lower_bound_ = float(batch_bound)
        self.lower_bounds_ = [self.lower_bound_]  # this call's one step, not a past fit's
        self.n_iter_ = int(self._online_state.step)
        self.converged_ = False
        return self

    def _start_stream(self, X):
        """Streaming-EM state from the fitted parameters, else from an init on the checked
        batch X."""
        if hasattr(self, "params_"):
            return online_em_init(X, self.params_)
        init = jax.tree.map(lambda a: a[0], self._initial_params(
            X, jnp.ones(X.shape[0], X.dtype), self._key(), 1))
        self.n_features_in_ = X.shape[1]
        return online_em_init(X, init)

    # ------------------------------------------------------------------ inference

    def _check_fitted(self) -> None:
        check_is_fitted(self, "params_")  # NotFittedError, a ValueError and AttributeError

    def _density_settings(self) -> dict:
        """backend and precision of the density ops: "f16x3" is the E-step's only (the
        Triton path); densities then run at "highest" on the default path."""
        if self.precision != "f16x3":
            return {"backend": self.backend, "precision": self.precision}
        return {"backend": "auto" if self.backend in ("triton", "mosaic") else self.backend,
                "precision": "highest"}

    def _labels(self, X) -> np.ndarray:
        log_dens = mvn_logpdf(X, self._slot_params, **self._density_settings())
        return np.asarray(_most_probable(log_dens, self._slot_params.weights))

    def score_samples(self, X) -> np.ndarray:
        """(n,) log-likelihood log p(x_i) of every row."""
        self._check_fitted()
        X, n = self._check_X(X, fitting=False)
        return np.asarray(log_prob(X, self._slot_params, **self._density_settings()))[:n]

    def score(self, X, y=None) -> float:
        """Mean log-likelihood of the rows of X (n, p)."""
        del y
        return float(np.mean(self.score_samples(X)))

    def predict(self, X) -> np.ndarray:
        """(n,) index of the most probable component of every row."""
        self._check_fitted()
        X, n = self._check_X(X, fitting=False)
        return self._labels(X)[:n]

    def predict_proba(self, X) -> np.ndarray:
        """(n, m) responsibilities of every row."""
        self._check_fitted()
        X, n = self._check_X(X, fitting=False)
        log_dens = mvn_logpdf(X, self._slot_params, **self._density_settings())
        proba = _posterior_probabilities(log_dens, self._slot_params.weights)
        return np.asarray(proba)[:n, :int(self.params_.n_components)]

    def sample(self, n_samples: int = 1):
        """Draw (X (n_samples, p) float64, labels (n_samples,)) from the fitted mixture.

        The draws are scikit-learn's from the same parameters and ``random_state``:
        counts per component from one multinomial draw, then full and tied components by
        ``multivariate_normal``, diag and spherical ones as mean + z sqrt(variance) with
        z standard normal.
        """
        self._check_fitted()
        if not is_int(n_samples) or n_samples < 1:
            raise ValueError(f"n_samples must be an int >= 1, got {n_samples=}")
        return sample_mixture(check_random_state(self.random_state), self.weights_,
                              self.means_, self.covariances_, self.covariance_type,
                              int(n_samples))

    def _n_parameters(self) -> int:
        k, p = self.means_.shape
        cov = {"full": k * p * (p + 1) / 2, "diag": k * p, "tied": p * (p + 1) / 2,
               "spherical": k}[self.covariance_type]
        return int(cov + p * k + k - 1)

    def bic(self, X) -> float:
        """Bayesian information criterion -2 n score + n_parameters log n (lower is better)."""
        n = np.shape(X)[0]
        return -2 * self.score(X) * n + self._n_parameters() * math.log(n)

    def aic(self, X) -> float:
        """Akaike information criterion -2 n score + 2 n_parameters (lower is better)."""
        return -2 * self.score(X) * np.shape(X)[0] + 2 * self._n_parameters()
