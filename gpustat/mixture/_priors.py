"""Conjugate priors of the (truncated Dirichlet-process) Gaussian mixture.

* :class:`DirichletPrior`: w ~ Dirichlet(alpha, ..., alpha).
* :class:`StickBreakingPrior`: V_j ~ Beta(1, alpha), w_j = V_j prod_{l<j} (1 - V_l), V_k = 1
  (the truncated Dirichlet process); alpha ~ Gamma(shape, rate) for the Gibbs sampler.
* :class:`NIWPrior`: mu_j | Sigma_j ~ N(m, Sigma_j / kappa), Sigma_j ~ IW(nu, Phi).

Posterior updates from statistics (N_j, sum x, sum x x^T), with xbar_j = S1_j / N_j and
scatter S_j = sum x x^T - N_j xbar_j xbar_j^T (Suchard et al. 2010, section 2; Gelman et
al., Bayesian Data Analysis, 3rd ed., section 3.6):

    kappa_n = kappa + N,  m_n = (kappa m + N xbar) / kappa_n,  nu_n = nu + N,
    Phi_n = Phi + S + kappa N / kappa_n (xbar - m)(xbar - m)^T.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from gpustat.mixture._validation import check_positive_definite, is_concrete
from gpustat.reference.mixture import SuffStats

__all__ = ["DirichletPrior", "NIWPrior", "StickBreakingPrior", "check_component_prior",
           "check_weight_prior", "niw_posterior", "stick_weights"]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DirichletPrior:
    """Symmetric Dirichlet(alpha) prior on the weights (MAP needs alpha >= 1)."""

    alpha: Float[Array, ""]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class StickBreakingPrior:
    """Truncated stick-breaking (Dirichlet-process) prior with concentration alpha.

    ``alpha_shape``/``alpha_rate`` give the Gamma(e, f) hyperprior the Gibbs sampler
    uses to resample alpha; BEM keeps alpha fixed.
    """

    alpha: Float[Array, ""]
    alpha_shape: Float[Array, ""] = 1.0
    alpha_rate: Float[Array, ""] = 1.0


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class NIWPrior:
    """Normal-inverse-Wishart prior: mu | Sigma ~ N(mean, Sigma / kappa), Sigma ~ IW(dof, scale).

    Attributes:
        mean: (p,) prior mean m.
        kappa: () prior pseudo-count of the mean (the spec's 1 / gamma).
        dof: () inverse-Wishart degrees of freedom nu > p - 1.
        scale: (p, p) inverse-Wishart scale Phi, positive definite.
    """

    mean: Float[Array, " p"]
    kappa: Float[Array, ""]
    dof: Float[Array, ""]
    scale: Float[Array, "p p"]

    @classmethod
    def weak(cls, X, kappa: float = 0.01, dof: float | None = None, scale: float = 0.1,
             *, var_floor: float = 1e-6):
        """A weakly informative prior centred on data X (n, p).

        m = mean(X), nu = p + 2 unless given, Phi = scale * (nu - p - 1) * diag(v) so that
        E[Sigma] = scale * diag(v), with v_a = max(var(X_a), var_floor * s): the variances
        floored relative to the data scale s = max_a var(X_a), or, when every feature is
        constant (identical points), s = max(max_a mean(X_a)^2, 1). A constant feature thus
        gets a small, positive prior variance instead of a singular Phi (whose Cholesky
        factor, and every draw after it, would be NaN).

        Args:
            X: (n, p) data.
            kappa: prior pseudo-count of the mean.
            dof: inverse-Wishart degrees of freedom; default p + 2.
            scale: E[Sigma] as a fraction of the (floored) feature variances.
            var_floor: the smallest feature variance, relative to s (> 0).
        """
        X = jnp.asarray(X)
        p = X.shape[1]
        if not var_floor > 0:
            raise ValueError(f"var_floor must be > 0, got {var_floor=}")
        nu = p + 2.0 if dof is None else dof
        mean = jnp.mean(X, axis=0)
        var = jnp.var(X, axis=0)
        largest = jnp.max(var)
        data_scale = jnp.where(largest > 0, largest,
                               jnp.maximum(jnp.max(mean * mean), jnp.ones((), X.dtype)))
        var = jnp.maximum(var, var_floor * data_scale)
        return cls(mean, jnp.asarray(kappa, X.dtype), jnp.asarray(nu, X.dtype),
                   jnp.diag(var) * scale * max(nu - p - 1, 1.0))


def _in_dtype(prior, dtype):
    return jax.tree.map(lambda a: jnp.asarray(a, dtype), prior)


def _check_above(value, bound, name: str) -> None:
    """Raise unless a concrete ``value`` is finite and > ``bound`` (tracers pass)."""
    if is_concrete(value):
        with jax.ensure_compile_time_eval():
            value = jnp.asarray(value)
            valid = bool(jnp.all(jnp.isfinite(value) & (value > bound)))
        if not valid:
            raise ValueError(f"{name} must be finite and > {bound}, got {name}={value}")


def check_weight_prior(prior, dtype):
    """None, or a Dirichlet / stick-breaking prior with positive parameters, in ``dtype``."""
    if prior is None:
        return None
    if not isinstance(prior, (DirichletPrior, StickBreakingPrior)):
        raise TypeError(f"weight_prior must be DirichletPrior, StickBreakingPrior or None, got "
                        f"{type(prior).__name__}")
    for field in dataclasses.fields(prior):
        _check_above(getattr(prior, field.name), 0, f"weight_prior.{field.name}")
    return _in_dtype(prior, dtype)


def check_component_prior(prior, n_features: int, dtype):
    """None, or a proper :class:`NIWPrior` on p = ``n_features`` features, in ``dtype``:
    mean (p,), kappa > 0, dof > p - 1, scale (p, p) positive definite."""
    if prior is None:
        return None
    if not isinstance(prior, NIWPrior):
        raise TypeError(f"component_prior must be an NIWPrior or None, got "
                        f"{type(prior).__name__}")
    p = n_features
    for name, shape in (("mean", (p,)), ("kappa", ()), ("dof", ()), ("scale", (p, p))):
        actual = jnp.shape(getattr(prior, name))
        if actual != shape:
            raise ValueError(f"component_prior.{name} must have shape {shape} for p={p} "
                             f"features, got {actual}")
    _check_above(prior.kappa, 0, "component_prior.kappa")
    _check_above(prior.dof, p - 1, "component_prior.dof")
    if is_concrete(prior.scale):
        check_positive_definite(prior.scale, "component_prior.scale")
    return _in_dtype(prior, dtype)


def niw_posterior(prior: NIWPrior, stats: SuffStats, pivot=None):
    """(kappa_n (k,), m_n (k, p), nu_n (k,), Phi_n (k, p, p)) of every component; with
    ``pivot`` (k, p), ``stats`` are about it (:func:`gpustat.mixture.m_step`)."""
    n = stats.counts
    safe_n = jnp.where(n > 0, n, 1)
    offset = stats.sum_x / safe_n[:, None]  # xbar - pivot
    scatter = stats.sum_xx - n[:, None, None] * offset[:, :, None] * offset[:, None, :]
    xbar = offset if pivot is None else pivot + offset
    kappa_n = prior.kappa + n
    m_n = (prior.kappa * prior.mean + n[:, None] * xbar) / kappa_n[:, None]
    d = xbar - prior.mean
    shrink = prior.kappa * n / kappa_n
    phi_n = prior.scale + scatter + shrink[:, None, None] * d[:, :, None] * d[:, None, :]
    return kappa_n, m_n, prior.dof + n, phi_n


def stick_weights(v: Float[Array, "*b k"]) -> Float[Array, "*b k"]:
    """w_j = V_j prod_{l<j} (1 - V_l), computed in log space.

    Raises:
        ValueError: concrete sticks outside [0, 1] (or NaN); traced ones pass.
    """
    if is_concrete(v):
        with jax.ensure_compile_time_eval():
            v = jnp.asarray(v)
            valid = bool(jnp.all((v >= 0) & (v <= 1)))
        if not valid:
            raise ValueError(f"stick_weights: v must lie in [0, 1], got range "
                             f"[{float(jnp.min(v))!r}, {float(jnp.max(v))!r}]")
    log_rest = jnp.cumsum(jnp.log1p(-v[..., :-1]), axis=-1)
    log_rest = jnp.concatenate([jnp.zeros_like(v[..., :1]), log_rest], axis=-1)
    return v * jnp.exp(log_rest)
