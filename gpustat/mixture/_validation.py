"""Input checks shared by the mixture ops, drivers and estimator.

Shape and dtype checks are static (they work under ``jax.jit``); value checks
(finiteness, positivity, label range) run only on concrete arrays, eagerly even while
``jax.jit`` traces a function that closes over them, and are skipped for tracers.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from gpustat._checks import as_array
from gpustat.reference.mixture import COVARIANCE_TYPES, MixtureParams

__all__ = ["PRECISION_CHOICES", "check_data", "check_labels", "check_params", "check_precision",
           "check_sample_weight", "integers_as_float", "is_concrete"]

PRECISION_CHOICES = ("highest", "tf32x3", "f16x3")


def is_concrete(x) -> bool:
    """True when ``x`` holds values (not a tracer inside jit/vmap/grad)."""
    return not isinstance(x, jax.core.Tracer)


@jax.jit
def _count_nonfinite(X):
    """NaN and infinite entries of X: one program per shape (eager ops would be three)."""
    return jnp.sum(~jnp.isfinite(X))


def check_data(X, name: str = "X") -> jax.Array:
    """X as a (n, p) float array (16-bit -> float32); finite when concrete."""
    X = as_array(X, name)
    if X.ndim != 2:
        raise ValueError(f"{name} must be 2-D (n, p), got {name}.shape={X.shape}")
    if not jnp.issubdtype(X.dtype, jnp.floating):
        raise TypeError(f"{name} must be a floating array, got {name}.dtype={X.dtype}")
    if X.shape[0] < 1 or X.shape[1] < 1:
        raise ValueError(f"{name} needs at least one row and one column, got {X.shape=}")
    if is_concrete(X):
        with jax.ensure_compile_time_eval():  # also when jit closes over a concrete X
            bad = int(_count_nonfinite(X))
        if bad:
            raise ValueError(f"{name} contains {bad} NaN or infinite values; remove or impute "
                             "them")
    return X if X.dtype == jnp.float64 else X.astype(jnp.float32)


def integers_as_float(X):
    """Integer or bool X as JAX's default float dtype (float64 under ``jax_enable_x64``,
    else float32), as scikit-learn converts it; any other X unchanged."""
    dtype = getattr(X, "dtype", None)
    if dtype is None:
        X = np.asarray(X)
        dtype = X.dtype
    if np.issubdtype(dtype, np.integer) or np.issubdtype(dtype, np.bool_):
        return jnp.asarray(X, dtype=jnp.result_type(float))
    return X


def check_params(params, n_features: int, dtype) -> MixtureParams:
    """``params`` cast to ``dtype`` after checking every array's shape against (k, p) and,
    when concrete, the weights (finite, non-negative, summing to 1)."""
    if not isinstance(params, MixtureParams):
        raise TypeError(f"params must be a MixtureParams, got {type(params).__name__}")
    kind = params.covariance_type
    if kind not in COVARIANCE_TYPES:
        raise ValueError(f"covariance_type must be one of {COVARIANCE_TYPES}, got {kind=!r}")
    means = params.means
    if means.ndim != 2 or means.shape[1] != n_features:
        raise ValueError(f"params.means must be (k, p={n_features}), got {means.shape=}")
    k, p = means.shape
    expected = {"full": (k, p, p), "tied": (p, p), "diag": (k, p), "spherical": (k,)}[kind]
    for field in ("covariances", "precisions_cholesky"):
        shape = getattr(params, field).shape
        if shape != expected:
            raise ValueError(f"params.{field} for covariance_type={kind!r} must have shape "
                             f"{expected}, got {shape}")
    if params.weights.shape != (k,):
        raise ValueError(f"params.weights must be ({k},), got {params.weights.shape=}")
    _check_weights(params.weights, dtype)
    return jax.tree.map(lambda a: jnp.asarray(a, dtype), params)


def _check_weights(weights, dtype) -> None:
    """Raise unless concrete weights are finite, non-negative and sum to 1 within the square
    root of their float epsilon (unnormalised weights would shift every log p(x))."""
    if not is_concrete(weights):
        return
    weights = np.asarray(weights)  # k values: checked on the host, running no program
    own = weights.dtype if jnp.issubdtype(weights.dtype, jnp.floating) else dtype
    weights = weights.astype(np.float64)
    valid = bool(np.all(np.isfinite(weights) & (weights >= 0)))
    total, low = float(np.sum(weights)), float(np.min(weights))
    if not (valid and abs(total - 1) <= math.sqrt(jnp.finfo(own).eps)):
        raise ValueError(f"params.weights must be finite, non-negative and sum to 1, got "
                         f"sum={total!r}, min={low!r}")


def check_reg_covar(reg_covar) -> None:
    """``ValueError`` unless a concrete ``reg_covar`` is >= 0 (NaN included); traced values
    pass."""
    if is_concrete(reg_covar) and not float(reg_covar) >= 0:
        raise ValueError(f"reg_covar must be non-negative, got {reg_covar=}")


def check_sample_weight(sample_weight, n: int, dtype):
    """None, or a (n,) non-negative finite weight vector in ``dtype``."""
    if sample_weight is None:
        return None
    w = jnp.asarray(sample_weight)
    if w.shape != (n,):
        raise ValueError(f"sample_weight must have shape ({n},), got {w.shape=}")
    if is_concrete(w):
        with jax.ensure_compile_time_eval():
            valid = bool(jnp.all(jnp.isfinite(w) & (w >= 0)))
        if not valid:
            raise ValueError("sample_weight must be finite and non-negative")
    return w.astype(dtype)


def check_labels(labels, n: int, n_components: int):
    """A (n,) integer label vector with values in [0, n_components) when concrete."""
    labels = jnp.asarray(labels)
    if labels.shape != (n,):
        raise ValueError(f"labels must have shape ({n},), got {labels.shape=}")
    if not jnp.issubdtype(labels.dtype, jnp.integer):
        raise TypeError(f"labels must be integers, got {labels.dtype=}")
    if is_concrete(labels) and n:
        with jax.ensure_compile_time_eval():
            low, high = int(labels.min()), int(labels.max())
        if not (0 <= low and high < n_components):
            raise ValueError(f"labels must lie in [0, {n_components}), got range "
                             f"[{low}, {high}]")
    return labels.astype(jnp.int32)


def check_precision(precision: str) -> str:
    """The float32 matmul precision: "highest" (IEEE fp32), "tf32x3" (3xTF32) or "f16x3"
    (three float16 products over power-of-two-scaled operands: the Triton E-step's)."""
    if precision not in PRECISION_CHOICES:
        raise ValueError(f"precision must be one of {PRECISION_CHOICES}, got {precision=!r}")
    return precision


def check_positive_definite(matrices, name: str) -> None:
    """Raise unless every (p, p) matrix in ``matrices`` is symmetric positive definite."""
    m = np.asarray(matrices, dtype=np.float64)
    if not np.allclose(m, np.swapaxes(m, -1, -2), rtol=1e-6, atol=1e-10):
        raise ValueError(f"{name} must be symmetric")
    if not np.all(np.linalg.eigvalsh(m) > 0):
        raise ValueError(f"{name} must be positive definite")
