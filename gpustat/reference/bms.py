"""BMS FLEX row kernel, pure ``jax.numpy``: the meaning of Stage 1, Stage 2 and the joint operators.

Notation follows ``specs/bms_flex.md``. A row's conditional probit predictor on a
cell of the z-line is the cubic ``η(z) = C0 + C1 z + C2 z² + C3 z³``; every
derivative of the calibration integral ``∫ Φ(η) φ dz`` over a cell is κ = 1/(2π)
times a dot product of polynomial coefficients with the cell moments

    m_k = ∫_L^R z^k exp(-(z² + η(z)²)/2) dz,    k = 0 … K.

* Stage 1 (:func:`cell_moments`): m_k by Gauss-Legendre-384 on finite cells, by the
  closed form + integration-by-parts recurrence on semi-infinite affine tails and on
  affine cells wider than 32 standard deviations each side of their midpoint.
* Stage 2 (:func:`row_derivatives`): per-cell functionals D, Q, H summed over a
  row's cells, the implicit-function derivatives of the intercept a(θ), the
  observed-predictor jets and the probit likelihood factors give the row's
  negative log-likelihood, gradient and Hessian in θ = (q, b, β_h, β_w).
* Joint operators (:func:`joint_hvp`, :func:`joint_diagonal`, :func:`joint_dense`,
  :func:`joint_gradient`): ``Σ_i J_iᵀ H_i J_i`` and friends with
  ``J_i = blockdiag(x_iᵀ, g_iᵀ, I_{p_h}, I_{p_w})``.

Everything here is vmapped over cells or rows and is the specification the
Pallas kernels in :mod:`gpustat.pallas.bms` are tested against.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from gpustat.reference.numerics import log_ndtr_and_mills, ndtr, probit_curvature

__all__ = [
    "AFFINE_TOL",
    "CLOSED_FORM_MIN_HALF_WIDTH",
    "DEFAULT_ORDER",
    "GL_NODES",
    "KAPPA",
    "STAGE2_ORDER",
    "CellStatus",
    "RowStatus",
    "cell_functionals",
    "cell_moments",
    "finalize_row",
    "gauss_legendre",
    "hankel_entries",
    "joint_dense",
    "joint_diagonal",
    "joint_gradient",
    "joint_hvp",
    "probit_factors",
    "row_derivatives",
    "second_jet_functionals",
]

KAPPA = 1.0 / (2.0 * math.pi)
GL_NODES = 384
DEFAULT_ORDER = 9
STAGE2_ORDER = 9  # T_6 needs m_{3+6}
AFFINE_TOL = 1e-10
# a finite affine cell takes the closed form only when it reaches further than this many
# standard deviations 1/sqrt(1 + C1²) of its Gaussian each side of its midpoint: on
# narrower cells the upward recurrence's error grows like (k-1)!! while the moments fall
# off like (half-width)^k (m_9 of [-0.1, 0.1] was 0.7% off), and Gauss-Legendre-384 is
# accurate to ~1e-14 up to this width
CLOSED_FORM_MIN_HALF_WIDTH = 32.0
_SQRT_2PI = math.sqrt(2.0 * math.pi)


class CellStatus:
    """Stage-1 status codes per cell (a non-Ok cell has all-zero moments)."""

    OK = 0
    INVALID_INTERVAL = 1
    NON_AFFINE_INFINITE_INTERVAL = 2
    NON_FINITE_COEFFICIENT = 3
    NON_FINITE_EVALUATION = 4


class RowStatus:
    """Stage-2 status codes per row (a non-Ok row has NaN outputs, except code 2)."""

    OK = 0
    DEGENERATE_FA = 1
    NON_FINITE_OUTPUT = 2
    CELL_FAILED = 3


@functools.cache
def gauss_legendre(n: int = GL_NODES) -> tuple[np.ndarray, np.ndarray]:
    """Nodes and weights of the n-point Gauss-Legendre rule on [-1, 1] (float64).

    numpy's rule carries ~4e-15 relative error in its weights at n = 384; two Newton
    steps on P_n in extended precision (``np.longdouble``, where the platform has it)
    bring nodes and weights to float64 rounding. Both stay exactly mirror-symmetric.
    """
    x = np.polynomial.legendre.leggauss(n)[0].astype(np.longdouble)
    for _ in range(2):
        p_n, dp_n = _legendre_and_derivative(n, x)
        x = x - p_n / dp_n
    _, dp_n = _legendre_and_derivative(n, x)
    return x.astype(np.float64), (2.0 / ((1.0 - x * x) * dp_n * dp_n)).astype(np.float64)


def _legendre_and_derivative(n, x):
    """P_n(x) and P_n'(x) by the three-term recurrence (|x| < 1)."""
    p_prev, p = np.ones_like(x), x
    for k in range(2, n + 1):
        p_prev, p = p, ((2 * k - 1) * x * p - (k - 1) * p_prev) / k
    return p, n * (x * p - p_prev) / (x * x - 1.0)


# ----------------------------------------------------------------------------- Stage 1


def _ndtr_diff(lo, hi):
    """Φ(hi) - Φ(lo) for lo <= hi without cancellation when both sit in the upper tail."""
    upper = lo > 0
    return jnp.where(upper, ndtr(-lo) - ndtr(-hi), ndtr(hi) - ndtr(lo))


def _affine_moments(lo, hi, alpha, beta, order):
    """m_0..m_K of exp(-(z² + (α + βz)²)/2) on [lo, hi] (bounds may be ±inf).

    Completing the square: q(z) = d1 (z - μ)²/2 + α²/(2 d1), d0 = αβ, d1 = 1 + β²,
    μ = -d0/d1; m_0 from Φ, then m_{n+1} = (n m_{n-1} - d0 m_n - B_n)/d1 with
    B_n = R^n e^{-q(R)} - L^n e^{-q(L)} (an infinite end contributes 0).
    Returns (moments, finite) where ``finite`` is False if q at a finite end is not.
    """
    d0 = alpha * beta
    d1 = 1.0 + beta * beta
    mu = -d0 / d1
    s = jnp.sqrt(d1)
    m0 = _SQRT_2PI / s * jnp.exp(-alpha * alpha / (2.0 * d1)) * _ndtr_diff(s * (lo - mu),
                                                                           s * (hi - mu))
    lo_fin = jnp.isfinite(lo)
    hi_fin = jnp.isfinite(hi)
    zl = jnp.where(lo_fin, lo, 0.0)
    zh = jnp.where(hi_fin, hi, 0.0)
    q_lo = 0.5 * (zl * zl + (alpha + beta * zl) ** 2)
    q_hi = 0.5 * (zh * zh + (alpha + beta * zh) ** 2)
    finite = jnp.isfinite(q_lo) & jnp.isfinite(q_hi)
    e_lo = jnp.where(lo_fin, jnp.exp(-q_lo), 0.0)
    e_hi = jnp.where(hi_fin, jnp.exp(-q_hi), 0.0)
    moments = [m0]
    prev = jnp.zeros_like(m0)
    pow_lo = jnp.ones_like(m0)
    pow_hi = jnp.ones_like(m0)
    for n in range(order):
        boundary = pow_hi * e_hi - pow_lo * e_lo
        nxt = (n * prev - d0 * moments[-1] - boundary) / d1
        prev = moments[-1]
        moments.append(nxt)
        pow_lo = pow_lo * zl
        pow_hi = pow_hi * zh
    return jnp.stack(moments), finite


def _gauss_legendre_moments(lo, hi, c, order):
    """m_0..m_K on a finite cell by the 384-point Gauss-Legendre rule."""
    nodes, weights = gauss_legendre()
    half = 0.5 * (hi - lo)
    mid = 0.5 * (hi + lo)
    z = mid + half * jnp.asarray(nodes, dtype=c.dtype)
    eta = c[0] + z * (c[1] + z * (c[2] + z * c[3]))
    qz = 0.5 * (z * z + eta * eta)
    term = half * jnp.asarray(weights, dtype=c.dtype) * jnp.exp(-qz)
    moments = []
    for _ in range(order + 1):
        moments.append(jnp.sum(term))
        term = term * z
    return jnp.stack(moments), jnp.all(jnp.isfinite(qz))


def _one_cell_moments(lo, hi, c, order):
    finite_c = jnp.all(jnp.isfinite(c))
    infinite = jnp.isinf(lo) | jnp.isinf(hi)
    curved_coeffs = (jnp.abs(c[2]) > AFFINE_TOL) | (jnp.abs(c[3]) > AFFINE_TOL)
    invalid = jnp.isnan(lo) | jnp.isnan(hi) | ~(hi > lo) | (lo == jnp.inf) | (hi == -jnp.inf)
    # finite cells: the curvature normalised on the half-width decides the branch
    half = jnp.where(infinite, 1.0, 0.5 * (hi - lo))
    mid = jnp.where(infinite, 0.0, 0.5 * (hi + lo))
    k2 = half * half * (c[2] + 3.0 * c[3] * mid)
    k3 = c[3] * half ** 3
    affine = (jnp.abs(k2) <= AFFINE_TOL) & (jnp.abs(k3) <= AFFINE_TOL)
    wide = half * jnp.sqrt(1.0 + c[1] * c[1]) > CLOSED_FORM_MIN_HALF_WIDTH
    closed_form = infinite | (affine & wide)
    safe_lo = jnp.where(infinite, -1.0, lo)
    safe_hi = jnp.where(infinite, 1.0, hi)
    gl, gl_finite = _gauss_legendre_moments(safe_lo, safe_hi, jnp.where(finite_c, c, 0.0), order)
    af, af_finite = _affine_moments(lo, hi, jnp.where(finite_c, c[0], 0.0),
                                    jnp.where(finite_c, c[1], 0.0), order)
    status = jnp.select(
        [~finite_c, invalid, infinite & curved_coeffs,
         jnp.where(closed_form, ~af_finite, ~gl_finite)],
        [CellStatus.NON_FINITE_COEFFICIENT, CellStatus.INVALID_INTERVAL,
         CellStatus.NON_AFFINE_INFINITE_INTERVAL, CellStatus.NON_FINITE_EVALUATION],
        CellStatus.OK).astype(jnp.int32)
    moments = jnp.where(status == CellStatus.OK, jnp.where(closed_form, af, gl), 0.0)
    return moments, status


@functools.partial(jax.jit, static_argnames="order")
def cell_moments(lo, hi, c, *, order: int = DEFAULT_ORDER):
    """Stage 1: moments m_0..m_K and status per cell.

    Args:
        lo, hi: (c,) cell bounds, ``-inf``/``+inf`` allowed for affine tails.
        c: (c, 4) predictor coefficients (C0..C3, ascending powers of z).
        order: K, the highest moment.

    Returns:
        (moments (c, K+1), status (c,) int32, :class:`CellStatus` codes).
    """
    return jax.vmap(functools.partial(_one_cell_moments, order=order))(lo, hi, c)


# ----------------------------------------------------------------------------- Stage 2


def second_jet_functionals(d_a, d_b):
    """The symmetric (r, r) matrix D(U_uv) of a cell's second jets (slot 0 stands for a).

    ``d_a`` (r,): D(∂²η/∂a²), D(∂²η/∂a∂θ_u) fill row and column 0; ``d_b`` (r-1,):
    D(∂²η/∂b∂θ_u), u >= 1 (S_bb, S_{bh_j}, S_{bw_j}), fill row and column 1; every
    other entry is 0 (η is linear in β_h, β_w and q does not enter it).
    """
    r = d_a.shape[0]
    u = jnp.zeros((r, r), d_a.dtype)
    u = u.at[0, :].set(d_a).at[:, 0].set(d_a)
    return u.at[1, 1:].set(d_b).at[1:, 1].set(d_b)


def hankel_entries(c, m):
    """T_0..T_6 of a cell, T_n = κ Σ_e C_e m_{e+n}, along the last axis
    (``c`` (..., 4), ``m`` (..., K+1)): the entries of its Hankel matrix M_pq = T_{p+q}."""
    return KAPPA * sum(c[..., e, None] * m[..., e:e + 7] for e in range(4))


def probit_factors(e_obs, y, w):
    """(-w log Φ(s e), -w s λ(s e), w C(s e)) at s = 2y - 1, elementwise: a row's negative
    log-likelihood and its first and second derivatives in the observed η."""
    sign = 2.0 * y - 1.0
    margin = sign * e_obs
    log_cdf, mills = log_ndtr_and_mills(margin)
    return -w * log_cdf, -w * sign * mills, w * probit_curvature(margin)


def cell_functionals(c, m, jet, jet_a, jet_b):
    """First- and second-derivative functionals of one cell (slot 0 = a, u = θ_u).

    With E = ``jet`` = [A; R_1; …; R_{r-1}] (r, 4), the Hankel matrix M_pq = T_{p+q},
    T_n = κ Σ_e C_e m_{e+n} and the second jets U (``jet_a``: row 0, ``jet_b``: row 1):

        first[u]     = D(E_u)                  = κ Σ_k E_uk m_k
        second[u, v] = H(E_u, E_v, U_uv)       = D(U_uv) - Σ_pq E_up E_vq T_{p+q}
    """
    hankel = hankel_entries(c, m)[jnp.arange(4)[:, None] + jnp.arange(4)[None, :]]
    km = KAPPA * m[:4]
    first = jet @ km
    second = second_jet_functionals(jet_a @ km, jet_b @ km) - jet @ hankel @ jet.T
    return first, second


def finalize_row(first, second, mu_1, mu_2, e_obs, chi, xi, rho, tau, r_uv, y, w):
    """Implicit-function derivatives of a(θ), observed jets and probit factors of one row.

    Returns (neglog, grad (r,), hess (r, r), status); F_a non-finite or <= 0 gives
    NaN outputs and status 1, a non-finite output status 2.
    """
    r = first.shape[0]
    f_a = first[0]
    f_aa = second[0, 0]
    # the q-row: F depends on q only through -μ(q)
    f_u = first.at[0].set(-mu_1)
    f_au = second[0].at[0].set(0.0)
    q_row = (jnp.arange(r)[:, None] == 0) | (jnp.arange(r)[None, :] == 0)
    f_uv = jnp.where(q_row, 0.0, second).at[0, 0].set(-mu_2)
    degenerate = ~jnp.isfinite(f_a) | (f_a <= 0)
    inv = 1.0 / f_a
    a_u = -f_u * inv
    a_uv = -(f_uv + jnp.outer(f_au, a_u) + jnp.outer(a_u, f_au) + f_aa * jnp.outer(a_u, a_u)) * inv
    e_u = chi * a_u + rho
    e_uv = (chi * a_uv + xi * jnp.outer(a_u, a_u) + jnp.outer(tau, a_u) + jnp.outer(a_u, tau)
            + r_uv)
    neglog, d_e, d_ee = probit_factors(e_obs, y, w)
    grad = d_e * e_u
    hess = d_ee * jnp.outer(e_u, e_u) + d_e * e_uv
    hess = jnp.triu(hess) + jnp.triu(hess, 1).T  # bitwise symmetric
    bad_output = ~(jnp.isfinite(neglog) & jnp.all(jnp.isfinite(grad)) & jnp.all(jnp.isfinite(hess)))
    status = jnp.where(degenerate, RowStatus.DEGENERATE_FA,
                       jnp.where(bad_output, RowStatus.NON_FINITE_OUTPUT, RowStatus.OK))
    nan = jnp.asarray(jnp.nan, first.dtype)
    return (jnp.where(degenerate, nan, neglog), jnp.where(degenerate, nan, grad),
            jnp.where(degenerate, nan, hess), status.astype(jnp.int32))


@jax.jit
def row_derivatives(cell_offsets, cell_c, cell_moments, cell_status, cell_jet, cell_jet_a,
                    cell_jet_b, mu_1, mu_2, e_obs, chi, xi, rho, tau, r_uv, y, w):
    """Stage 2 for all rows: per-cell functionals, segment sums over rows, row finalisation.

    Shapes: ``cell_offsets`` (n+1,) int; ``cell_c`` (c, 4); ``cell_moments`` (c, K+1), K >= 9;
    ``cell_status`` (c,) int; ``cell_jet``, ``cell_jet_a`` (c, r, 4); ``cell_jet_b``
    (c, r-1, 4) (see :class:`gpustat.bms.BmsRows`); row arrays (n,); ``rho, tau`` (n, r);
    ``r_uv`` (n, r, r), symmetric.

    Returns (neglog (n,), grad (n, r), hess (n, r, r), status (n,) int32); a row with
    a failed cell (Stage-1 status != 0) gets NaN outputs and status 3.
    """
    n = mu_1.shape[0]
    n_cells = cell_c.shape[0]
    counts = cell_offsets[1:] - cell_offsets[:-1]
    cell_row = jnp.repeat(jnp.arange(n), counts, total_repeat_length=n_cells)
    first, second = jax.vmap(cell_functionals)(
        cell_c, cell_moments[:, :STAGE2_ORDER + 1], cell_jet, cell_jet_a, cell_jet_b)
    first = jax.ops.segment_sum(first, cell_row, num_segments=n)
    second = jax.ops.segment_sum(second, cell_row, num_segments=n)
    failed = jax.ops.segment_max(cell_status, cell_row, num_segments=n) > 0
    neglog, grad, hess, status = jax.vmap(finalize_row)(
        first, second, mu_1, mu_2, e_obs, chi, xi, rho, tau, r_uv, y, w)
    nan = jnp.asarray(jnp.nan, grad.dtype)
    return (jnp.where(failed, nan, neglog), jnp.where(failed[:, None], nan, grad),
            jnp.where(failed[:, None, None], nan, hess),
            jnp.where(failed, RowStatus.CELL_FAILED, status).astype(jnp.int32))


# ----------------------------------------------------------------------------- joint operators


def _row_jacobian(x, g, r):
    """J_i = blockdiag(x_iᵀ, g_iᵀ, I_{r-2}) as a dense (r, p_total) matrix."""
    p_m, p_g = x.shape[0], g.shape[0]
    jac = jnp.zeros((r, p_m + p_g + r - 2), x.dtype)
    jac = jac.at[0, :p_m].set(x).at[1, p_m:p_m + p_g].set(g)
    return jac.at[2:, p_m + p_g:].set(jnp.eye(r - 2, dtype=x.dtype))


@jax.jit
def joint_hvp(hess, x, g, v):
    """Σ_i J_iᵀ H_i J_i v for each direction: v (R, p_total) -> (R, p_total)."""
    r = hess.shape[-1]

    def one_row(h_i, x_i, g_i):
        jac = _row_jacobian(x_i, g_i, r)
        return jac.T @ (h_i @ (jac @ v.T))                         # (p_total, R)

    return jnp.sum(jax.vmap(one_row)(hess, x, g), axis=0).T


@jax.jit
def joint_diagonal(hess, x, g):
    """Diagonal of Σ_i J_iᵀ H_i J_i, (p_total,)."""
    r = hess.shape[-1]

    def one_row(h_i, x_i, g_i):
        jac = _row_jacobian(x_i, g_i, r)
        return jnp.einsum("up,uv,vp->p", jac, h_i, jac)

    return jnp.sum(jax.vmap(one_row)(hess, x, g), axis=0)


@jax.jit
def joint_dense(hess, x, g):
    """Σ_i J_iᵀ H_i J_i, (p_total, p_total)."""
    r = hess.shape[-1]

    def one_row(h_i, x_i, g_i):
        jac = _row_jacobian(x_i, g_i, r)
        return jac.T @ h_i @ jac

    return jnp.sum(jax.vmap(one_row)(hess, x, g), axis=0)


@jax.jit
def joint_gradient(neglog, grad, x, g):
    """[log-likelihood, score]: ``[-Σ_i neglog_i, -Σ_i J_iᵀ g_i]``, (1 + p_total,)."""
    r = grad.shape[-1]
    score = -jnp.sum(jax.vmap(lambda gr, x_i, g_i: _row_jacobian(x_i, g_i, r).T @ gr)(grad, x, g),
                     axis=0)
    return jnp.concatenate([-jnp.sum(neglog, keepdims=True), score])
