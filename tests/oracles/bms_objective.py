"""Independent autodiff oracle for the BMS FLEX row objective.

The row objective ``-w log Φ(s η(z_obs; a(θ), θ))`` is written directly in jnp:
the bases are evaluated by their own clamped Horner evaluation, the calibration
integral ``∫ Φ(η) φ dz`` by Gauss-Legendre on intervals cut at the (moving) knots,
and a(θ) is the Newton root with an implicit-function ``custom_jvp``. ``jax.grad``
and ``jax.hessian`` of it share no code with Stage 0/1/2 (no cells, jets, moments
or closed-form derivative formulas).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import log_ndtr, ndtr

_NODES, _WEIGHTS = np.polynomial.legendre.leggauss(48)
# fixed extra cuts keep each Gauss-Legendre interval narrow around the normal's bulk
_FIXED_CUTS = np.array([-40.0, -20.0, -12.0, -8.0, -6.0, -4.0, 4.0, 6.0, 8.0, 12.0, 20.0, 40.0])


def _clamped_basis(breakpoints, coeffs, x):
    """All basis functions at x (scalar): coeffs (D+1, P, p) highest power first -> (p,)."""
    breakpoints, coeffs = jnp.asarray(breakpoints), jnp.asarray(coeffs)
    xc = jnp.clip(x, breakpoints[0], breakpoints[-1])
    i = jnp.clip(jnp.searchsorted(breakpoints, xc, side="right") - 1, 0, coeffs.shape[1] - 1)
    t = xc - breakpoints[i]
    acc = coeffs[0, i]
    for k in range(1, coeffs.shape[0]):
        acc = acc * t + coeffs[k, i]
    return acc


def make_row_objective(score, link, p_h, p_w, s_f):
    """objective(theta, z_obs, y, w) for θ = (q, b, β_h, β_w); score/link = (breakpoints,
    coeffs) numpy pairs or None."""

    def split(theta):
        return theta[0], theta[1], theta[2:2 + p_h], theta[2 + p_h:]

    def eta(z, a, theta):
        _, b, beta_h, beta_w = split(theta)
        h = _clamped_basis(*score, z) @ beta_h if score is not None else 0.0
        w = _clamped_basis(*link, a + b * z) @ beta_w if link is not None else 0.0
        return s_f * (a + b * z + b * h + w)

    def calibration(a, theta):
        q, b = theta[0], theta[1]
        cuts = [jnp.asarray(_FIXED_CUTS)]
        if score is not None:
            cuts.append(jnp.asarray(score[0]))
        if link is not None:
            cuts.append((jnp.asarray(link[0]) - a) / b)
        cuts = jnp.sort(jnp.clip(jnp.concatenate(cuts), -40.0, 40.0))
        lo, hi = cuts[:-1], cuts[1:]
        half = 0.5 * (hi - lo)
        z = (0.5 * (hi + lo))[:, None] + half[:, None] * _NODES[None, :]
        integrand = jax.vmap(jax.vmap(lambda zz: ndtr(eta(zz, a, theta))
                                      * jnp.exp(-0.5 * zz * zz) / jnp.sqrt(2 * jnp.pi)))(z)
        return jnp.sum(half[:, None] * _WEIGHTS[None, :] * integrand) - ndtr(q)

    @jax.custom_jvp
    def intercept(theta):
        q, b = theta[0], theta[1]
        a0 = q * jnp.sqrt(1.0 + (s_f * b) ** 2) / s_f
        d_calibration = jax.grad(calibration)

        def newton(_, a):
            return a - calibration(a, theta) / d_calibration(a, theta)

        return jax.lax.fori_loop(0, 12, newton, jax.lax.stop_gradient(a0))

    @intercept.defjvp
    def _intercept_jvp(primals, tangents):
        (theta,), (dtheta,) = primals, tangents
        a = intercept(theta)
        f_a = jax.grad(calibration)(a, theta)
        _, f_dot = jax.jvp(lambda t: calibration(a, t), (theta,), (dtheta,))
        return a, -f_dot / f_a

    def objective(theta, z_obs, y, w):
        a = intercept(theta)
        return -w * log_ndtr((2.0 * y - 1.0) * eta(z_obs, a, theta))

    def value_grad_hessian(theta, z_obs, y, w):
        return (objective(theta, z_obs, y, w), jax.grad(objective)(theta, z_obs, y, w),
                jax.hessian(objective)(theta, z_obs, y, w))

    return objective, intercept, value_grad_hessian
