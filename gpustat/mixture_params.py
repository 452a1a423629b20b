"""Parameters of a Gaussian mixture and the covariance <-> precision-Cholesky algebra.

A mixture of k normals in p dimensions, x ~ sum_j w_j N(mu_j, Sigma_j), is stored the
way scikit-learn stores it: ``weights`` (k,), ``means`` (k, p), ``covariances`` and
``precisions_cholesky`` whose shapes depend on ``covariance_type``:

=============  ==================  =========================================
type           covariances         precisions_cholesky (U with U U^T = Sigma^-1)
=============  ==================  =========================================
``full``       (k, p, p)           (k, p, p), upper triangular
``tied``       (p, p)              (p, p), upper triangular
``diag``       (k, p)              (k, p), 1 / sqrt(variances)
``spherical``  (k,)                (k,), 1 / sqrt(variance)
=============  ==================  =========================================

The log-density of component j is
``log N(x | mu_j, Sigma_j) = -p/2 log(2 pi) + sum log diag U_j - 1/2 ||(x - mu_j)^T U_j||^2``.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

__all__ = [
    "COVARIANCE_TYPES",
    "MixtureParams",
    "SuffStats",
    "covariances_from_precisions_cholesky",
    "full_precision_cholesky",
    "log_det_precision_cholesky",
    "precisions_cholesky_from_covariances",
    "precisions_cholesky_from_precisions",
]

COVARIANCE_TYPES = ("full", "tied", "diag", "spherical")


def _check_type(covariance_type: str) -> None:
    if covariance_type not in COVARIANCE_TYPES:
        raise ValueError(
            f"covariance_type must be one of {COVARIANCE_TYPES}, got {covariance_type=!r}")


def _check_shapes(weights, means, matrices, covariance_type: str, name: str) -> None:
    """Raise unless weights (*b, k), means (*b, k, p) and ``name`` (the covariance type's
    shape) agree on k and p."""
    if means.ndim < 2 or weights.shape != means.shape[:-1]:
        raise ValueError(f"weights must be (*b, k) and means (*b, k, p) with one k, got "
                         f"{weights.shape=} and {means.shape=}")
    *batch, k, p = means.shape
    expected = tuple(batch) + {"full": (k, p, p), "tied": (p, p), "diag": (k, p),
                               "spherical": (k,)}[covariance_type]
    if matrices.shape != expected:
        raise ValueError(f"{name} for covariance_type={covariance_type!r} must have shape "
                         f"{expected}, got {matrices.shape}")


def _upper_cholesky_of_inverse(cov: Float[Array, "p p"]) -> Float[Array, "p p"]:
    """U upper triangular with U U^T = cov^-1 (scikit-learn's convention); NaN if not PD."""
    lower = jnp.linalg.cholesky(cov)
    eye = jnp.eye(cov.shape[-1], dtype=cov.dtype)
    return jax.scipy.linalg.solve_triangular(lower, eye, lower=True).T


def _upper_cholesky(precision: Float[Array, "p p"]) -> Float[Array, "p p"]:
    """U upper triangular with U U^T = precision (Cholesky of the flipped matrix, flipped back)."""
    return jnp.flip(jnp.linalg.cholesky(jnp.flip(precision, (-2, -1))), (-2, -1))


def precisions_cholesky_from_covariances(covariances, covariance_type: str):
    """Precision Cholesky factors from covariances; NaN entries where a covariance is not PD."""
    _check_type(covariance_type)
    if covariance_type == "full":
        return jax.vmap(_upper_cholesky_of_inverse)(covariances)
    if covariance_type == "tied":
        return _upper_cholesky_of_inverse(covariances)
    return jnp.where(covariances > 0, jax.lax.rsqrt(jnp.abs(covariances)), jnp.nan)


def precisions_cholesky_from_precisions(precisions, covariance_type: str):
    """Precision Cholesky factors from precision matrices (scikit-learn's ``precisions_init``)."""
    _check_type(covariance_type)
    if covariance_type == "full":
        return jax.vmap(_upper_cholesky)(precisions)
    if covariance_type == "tied":
        return _upper_cholesky(precisions)
    return jnp.where(precisions > 0, jnp.sqrt(jnp.abs(precisions)), jnp.nan)


def covariances_from_precisions_cholesky(precisions_cholesky, covariance_type: str):
    """Covariances (U U^T)^-1 from precision Cholesky factors."""
    _check_type(covariance_type)
    if covariance_type in ("full", "tied"):
        def one(u):
            eye = jnp.eye(u.shape[-1], dtype=u.dtype)
            inv_u = jax.scipy.linalg.solve_triangular(u, eye, lower=False)
            return jnp.matmul(inv_u.T, inv_u, precision=jax.lax.Precision.HIGHEST)
        return jax.vmap(one)(precisions_cholesky) if covariance_type == "full" else one(
            precisions_cholesky)
    return 1.0 / precisions_cholesky**2


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class MixtureParams:
    """Parameters of a Gaussian mixture (a pytree; ``covariance_type`` is static).

    Attributes:
        weights: (k,) mixing weights, positive, summing to one.
        means: (k, p) component means.
        covariances: covariances in scikit-learn's shape for ``covariance_type``
            (full (k, p, p), tied (p, p), diag (k, p), spherical (k,)).
        precisions_cholesky: U with U U^T = Sigma^-1, same shape as ``covariances``.
        covariance_type: ``"full"``, ``"tied"``, ``"diag"`` or ``"spherical"``.

    All arrays share one floating dtype (float32 or float64). Build with
    :meth:`from_covariances` or :meth:`from_precisions`; leading batch axes (one per
    restart or chain) are allowed on every array.
    """

    weights: Float[Array, "*b k"]
    means: Float[Array, "*b k p"]
    covariances: Array
    precisions_cholesky: Array
    covariance_type: str = dataclasses.field(default="full", metadata=dict(static=True))

    @property
    def n_components(self) -> int:
        """Number of components k."""
        return self.means.shape[-2]

    @property
    def n_features(self) -> int:
        """Number of features p."""
        return self.means.shape[-1]

    @classmethod
    def from_covariances(cls, weights, means, covariances, covariance_type: str = "full"):
        """Parameters from weights (k,), means (k, p) and covariances (type-dependent shape).

        Raises:
            ValueError: an unknown covariance type, or shapes that disagree on k or p.
        """
        _check_type(covariance_type)
        weights, means, covariances = map(jnp.asarray, (weights, means, covariances))
        _check_shapes(weights, means, covariances, covariance_type, "covariances")
        return cls(weights, means, covariances,
                   precisions_cholesky_from_covariances(covariances, covariance_type),
                   covariance_type)

    @classmethod
    def from_precisions(cls, weights, means, precisions, covariance_type: str = "full"):
        """Parameters from weights (k,), means (k, p) and precisions (type-dependent shape).

        Raises:
            ValueError: an unknown covariance type, or shapes that disagree on k or p.
        """
        _check_type(covariance_type)
        weights, means, precisions = map(jnp.asarray, (weights, means, precisions))
        _check_shapes(weights, means, precisions, covariance_type, "precisions")
        chol = precisions_cholesky_from_precisions(precisions, covariance_type)
        return cls(weights, means,
                   covariances_from_precisions_cholesky(chol, covariance_type), chol,
                   covariance_type)


def full_precision_cholesky(params: MixtureParams) -> Float[Array, "k p p"]:
    """The precision Cholesky factor of every component as a dense (k, p, p) array."""
    k, p = params.means.shape
    chol = params.precisions_cholesky
    if params.covariance_type == "full":
        return chol
    if params.covariance_type == "tied":
        return jnp.broadcast_to(chol, (k, p, p))
    if params.covariance_type == "diag":
        return jax.vmap(jnp.diag)(chol)
    return chol[:, None, None] * jnp.eye(p, dtype=chol.dtype)


def log_det_precision_cholesky(params: MixtureParams) -> Float[Array, " k"]:
    """log det U_j = 1/2 log det Sigma_j^-1 for every component."""
    k, p = params.means.shape
    chol = params.precisions_cholesky
    if params.covariance_type == "full":
        return jnp.sum(jnp.log(jnp.diagonal(chol, axis1=-2, axis2=-1)), axis=-1)
    if params.covariance_type == "tied":
        return jnp.full((k,), jnp.sum(jnp.log(jnp.diagonal(chol))), dtype=chol.dtype)
    if params.covariance_type == "diag":
        return jnp.sum(jnp.log(chol), axis=-1)
    return p * jnp.log(chol)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SuffStats:
    """Weighted sufficient statistics of a mixture's E-step (or of hard labels).

    Attributes:
        counts: (k,) N_j = sum_i w_i r_ij.
        sum_x: (k, p) sum_i w_i r_ij x_i.
        sum_xx: (k, p, p) sum_i w_i r_ij x_i x_i^T.
        loglik: () sum_i w_i log p(x_i) under the parameters of the E-step
            (0 for statistics of hard labels, which carry no likelihood).
    """

    counts: Float[Array, "*b k"]
    sum_x: Float[Array, "*b k p"]
    sum_xx: Float[Array, "*b k p p"]
    loglik: Float[Array, "*b"]

    def __add__(self, other: SuffStats) -> SuffStats:
        return jax.tree.map(jnp.add, self, other)

    def scale(self, factor) -> SuffStats:
        """Every statistic multiplied by ``factor`` (mini-batch -> full-data scale)."""
        return jax.tree.map(lambda s: s * factor, self)
