"""M-step: mixture parameters from sufficient statistics (MLE, or MAP under conjugate priors).

Maximum likelihood, exactly as scikit-learn's ``GaussianMixture`` (Dempster, Laird and
Rubin 1977), with N_j = counts_j + 10 eps:

    w_j = N_j / sum_l N_l,   mu_j = S1_j / N_j,
    full:      Sigma_j = S2_j / N_j - mu_j mu_j^T + reg I
    tied:      Sigma   = (sum_j S2_j - sum_j N_j mu_j mu_j^T) / sum_j N_j + reg I
    diag:      sigma2_j = diag(S2_j) / N_j - mu_j^2 + reg
    spherical: mean over features of the diag variances.

MAP (posterior mode, "BEM" of Suchard et al. 2010) for full covariances under a
normal-inverse-Wishart prior: mu_j = m_n, Sigma_j = Phi_n / (nu_n + p + 2) (+ reg I);
weights under Dirichlet(alpha): w_j propto max(N_j + alpha - 1, 0); under stick-breaking:
V_j = N_j / (alpha - 1 + sum_{l>=j} N_l) clipped into (0, 1), V_k = 1.
Statistics about the origin (``pivot=None``) should be of centred data so that
S2 / N - mu mu^T does not cancel catastrophically; the drivers go further and take them
about a pivot per component (``pivot``, the previous iteration's means):
S1'_j = sum r (x - c_j), S2'_j = sum r (x - c_j)(x - c_j)^T, mu_j = c_j + d_j with
d_j = S1'_j / N_j, and the formulas above with d_j in place of mu_j, which then keep the
small eigenvalues of a component far from the data's mean.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from gpustat.mixture._priors import (
    DirichletPrior,
    NIWPrior,
    StickBreakingPrior,
    check_component_prior,
    check_weight_prior,
    niw_posterior,
)
from gpustat.mixture._priors import stick_weights as _stick_weights
from gpustat.mixture._validation import check_reg_covar
from gpustat.reference.mixture import MixtureParams, SuffStats

__all__ = ["m_step"]


def _mle_covariances(stats: SuffStats, nk, means, covariance_type: str, reg_covar,
                     diagonal=None):
    """Covariances from the statistics and the means about their origin (the pivot);
    ``diagonal`` (full only): off-diagonal entries 0 where it is true."""
    p = means.shape[-1]
    # sum_i r (x - mu)(x - mu)^T / N = S2 / N - mu mu^T (2 - counts / N), N = counts + 10 eps
    second = stats.sum_xx / nk[:, None, None]
    centred = second - means[:, :, None] * means[:, None, :] * (2 - stats.counts / nk)[:, None,
                                                                                        None]
    eye = jnp.eye(p, dtype=means.dtype)
    if covariance_type == "full":
        if diagonal is not None:
            centred = jnp.where(~jnp.asarray(diagonal) | jnp.eye(p, dtype=bool), centred, 0)
        return centred + reg_covar * eye
    if covariance_type == "tied":
        outer = jnp.einsum("k,ka,kb->ab", nk, means, means, precision=jax.lax.Precision.HIGHEST)
        return (jnp.sum(stats.sum_xx, axis=0) - outer) / jnp.sum(nk) + reg_covar * eye
    diag = jnp.diagonal(centred, axis1=-2, axis2=-1) + reg_covar
    return diag if covariance_type == "diag" else jnp.mean(diag, axis=-1)


def _mark_unresolved(covariances, stats: SuffStats, nk, covariance_type: str):
    """NaN for covariances below what raw moments resolve (singular or collapsed components).

    S2 / N - mu mu^T cancels to about eps * E[x_a^2] in feature a; a variance (Cholesky
    pivot^2) of feature a below 10 p eps E[x_a^2] is indistinguishable from zero, as for
    a component sitting on one repeated point, and is reported instead of silently
    inverted. The floor is per feature, so rescaling a feature rescales its pivot and
    its floor alike (features of very different scales are not flagged); the spherical
    variance, a mean over features, gets the mean of their floors. The tied covariance
    cancels in the pooled moments sum_j S2_j / sum_j N_j, so its floor is theirs (a small
    far component leaves it resolved).
    """
    dtype = nk.dtype
    p = stats.sum_x.shape[-1]
    second_sums = jnp.diagonal(stats.sum_xx, axis1=-2, axis2=-1)  # (k, p)
    if covariance_type == "tied":
        second = jnp.sum(second_sums, axis=0) / jnp.sum(nk)
    else:
        second = second_sums / nk[:, None]
    floor = 10 * p * jnp.finfo(dtype).eps * second
    if covariance_type in ("full", "tied"):
        pivots = jnp.diagonal(jnp.linalg.cholesky(covariances), axis1=-2, axis2=-1) ** 2
        bad = ~jnp.all(pivots > floor, axis=-1)
        return jnp.where(bad[..., None, None], jnp.nan, covariances)
    if covariance_type == "diag":
        return jnp.where(covariances > floor, covariances, jnp.nan)
    return jnp.where(covariances > jnp.mean(floor, axis=-1), covariances, jnp.nan)


def _map_weights(nk, prior):
    if prior is None:
        return nk / jnp.sum(nk)
    if isinstance(prior, DirichletPrior):
        w = jnp.maximum(nk + prior.alpha - 1, 0)
        return w / jnp.sum(w)
    tail = jnp.cumsum(nk[::-1])[::-1]  # stick-breaking: sum_{l >= j} N_l
    tiny = jnp.finfo(nk.dtype).eps
    v = jnp.clip(nk / (prior.alpha - 1 + tail), tiny, 1 - tiny)
    v = v.at[-1].set(1.0)
    return _stick_weights(v)


def _check_stats(stats) -> None:
    """Raise unless ``stats`` is one set of :class:`SuffStats`: (k,), (k, p), (k, p, p)."""
    if not isinstance(stats, SuffStats):
        raise TypeError(f"stats must be a SuffStats, got {type(stats).__name__}")
    shapes = [stats.counts.shape, stats.sum_x.shape, stats.sum_xx.shape]
    k, p = shapes[0][:1], shapes[1][-1:]
    if len(shapes[0]) != 1 or shapes != [k, k + p, k + p + p]:
        raise ValueError("stats must hold counts (k,), sum_x (k, p) and sum_xx (k, p, p) "
                         f"(jax.vmap m_step over batched statistics), got shapes {shapes}")


def m_step(stats: SuffStats, *, covariance_type: str = "full", reg_covar: float = 1e-6,
           weight_prior: DirichletPrior | StickBreakingPrior | None = None,
           component_prior: NIWPrior | None = None, pivot=None,
           diagonal=None) -> MixtureParams:
    """Mixture parameters from E-step statistics (MLE, or MAP under the given priors).

    Args:
        stats: :class:`SuffStats` with counts (k,), sum_x (k, p), sum_xx (k, p, p).
        covariance_type: ``"full"``, ``"tied"``, ``"diag"`` or ``"spherical"``.
        reg_covar: non-negative value added to every covariance diagonal.
        weight_prior: optional Dirichlet or stick-breaking prior on the weights (MAP).
        component_prior: optional normal-inverse-Wishart prior (MAP; full covariance only).
            Priors are checked as :func:`fit_em` checks them and compute in the dtype of
            ``stats``.
        pivot: optional (k, p) pivots c_j about which ``stats`` were accumulated
            (``suff_stats(..., pivot=...)``); None: about the origin.
        diagonal: optional bool () with ``covariance_type="full"`` and no
            ``component_prior``, traced or not: where true, the covariances keep only their
            diagonals (the "diag" model held as dense (k, p, p) matrices, its values those
            of ``covariance_type="diag"`` up to rounding), so that one compiled program
            fits both models.

    Returns:
        :class:`MixtureParams` in the dtype of ``stats``. A component whose covariance is
        not positive definite has NaN covariance and precision factors (the drivers report
        it); with ``pivot=None`` so has one below the resolution of raw moments (a
        collapsed component: S2 / N - mu mu^T cancels to about eps E[x^2]).

    Raises:
        TypeError: ``stats`` is not a :class:`SuffStats`, or a prior of the wrong type.
        ValueError: batched or inconsistent statistics' shapes, a negative ``reg_covar``,
            an improper prior, a prior's shapes not matching p, or ``diagonal`` with
            another covariance type or a ``component_prior``.
    """
    _check_stats(stats)
    check_reg_covar(reg_covar)
    dtype = stats.counts.dtype
    weight_prior = check_weight_prior(weight_prior, dtype)
    component_prior = check_component_prior(component_prior, stats.sum_x.shape[-1], dtype)
    if diagonal is not None and (covariance_type != "full" or component_prior is not None):
        raise ValueError(f"diagonal needs covariance_type='full' and no component_prior, got "
                         f"{covariance_type=!r}")
    if pivot is not None and jnp.shape(pivot) != stats.sum_x.shape:
        raise ValueError(f"pivot must have the shape of stats.sum_x {stats.sum_x.shape}, got "
                         f"{jnp.shape(pivot)}")
    eps = jnp.finfo(dtype).eps
    nk = stats.counts + 10 * eps
    weights = _map_weights(nk, weight_prior)
    if component_prior is None:
        offsets = stats.sum_x / nk[:, None]
        covariances = _mle_covariances(stats, nk, offsets, covariance_type, reg_covar,
                                       diagonal)
        means = offsets if pivot is None else pivot + offsets
    else:
        if covariance_type != "full":
            raise ValueError(f"component_prior needs covariance_type='full', got "
                             f"{covariance_type=!r}")
        _, means, nu_n, phi_n = niw_posterior(component_prior, stats, pivot)
        p = means.shape[-1]
        covariances = (phi_n / (nu_n + p + 2)[:, None, None]
                       + reg_covar * jnp.eye(p, dtype=means.dtype))
    if pivot is None:
        covariances = _mark_unresolved(covariances, stats, nk, covariance_type)
    return MixtureParams.from_covariances(weights, means, covariances, covariance_type)
