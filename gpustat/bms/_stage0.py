"""BMS FLEX Stage 0 in ``jax.numpy``: intercept calibration, cell partition and jets per row.

The same quantities as the host builder :mod:`gpustat.bms._rows` (``specs/bms_flex.md``
A.2), written per row and vmapped, so that model parameters -> rows is traceable
(``jax.jit``, ``jax.grad``) and runs where the later stages run:

1. a_i solves ``F(a) = ∫ Φ(η(z; a)) φ(z) dz - Φ(q_i) = 0`` by Newton from the rigid
   solution ``q √(1 + S_f² b²)/S_f`` (or a given start), as a ``lax.while_loop`` per
   row (vmapped: every row stops on its own test). F and F_a are integrated per cell by
   Gauss-Legendre on four panels of the cell clipped to |z| <= L = min(40,
   √(q² + TAIL_EXPONENT)): where η is affine with its zero inside and steep, two of
   width ``STEP_WIDTHS / |C1|`` on either side of the zero (the step of Φ(η), however
   steep, between them) and the rest outside; else four equal panels. For q > 0 as
   ``Φ(-q) - ∫ Φ(-η) φ dz``. The clip drops at most 2 Φ(-L) <= 2 e^(-TAIL_EXPONENT/2)
   Φ(-|q|) (the integrand is at most φ(z) whatever η is), below 1e-19 Φ(-|q|), so
   the panels sit where the mass is and few nodes resolve them: the iteration first
   runs on ``COARSE_NODES`` nodes per panel until the step is below ``COARSE_TOL``,
   then on ``FINE_NODES`` until the step is below ``FINE_TOL``. After a Newton step of
   size δ the error is of order δ², below float64 rounding at δ = 1e-8: the coarse
   phase ends within ~1e-10 of the coarse root. On smooth rows that root is the fine
   one to ~1e-14 relative (one fine step ends the iteration); where the step of Φ(η)
   is steep or |q| large it lies up to ~1e-6 away (1e-7 with 12 nodes) and the fine
   phase takes two steps. The fine rule
   agrees with the host builder's (Gauss-Legendre-384 on |z| <= 40) to float64
   rounding of F: over 720 rows (q in [-8, 8], slopes from 1e-8 to 63, three
   coefficient scales) the intercepts differ from the host's by at most 2.9e-13
   relative (two panels of 192 nodes: 5.9e-13), at a third of Stage 0's cost.
   Each row reports a :class:`CalibrationStatus`; a failed row gets a = NaN, which
   Stage 1 flags per cell and Stage 2 per row. The derivative of a(θ) is the implicit
   one, ``-F_θ/F_a`` (a ``custom_jvp``), so ``jax.grad`` crosses the loop.
2. Each row has ``k = (#score knots) + (#link knots) + 3`` cell slots: the z-line is cut
   at the score knots, at ``(τ - a)/b`` for the link knots τ (|b| > 1e-12) and at
   z = ±40 where a cut lies beyond; windows of width <= 1e-12 and unused slots are
   padding (mask ``valid``). The two outer cells are semi-infinite affine tails.
3. On each cell the active pieces (those at a probe point) are re-expanded as cubics in
   the global z: C, the jets, and at z_obs e_obs, χ, ξ, ρ, τ, r_uv.

Padding cells are stored as the finite cell [-1, 1] with η = 0 and all-zero jets: their
Stage-1 moments are finite and their Stage-2 contributions exactly zero, so a row's
cells sit at a fixed stride ``k`` (``cell_offsets = k · arange(n + 1)``).
"""

from __future__ import annotations

import enum
import functools

import jax
import jax.numpy as jnp
import numpy as np

from gpustat.bms._rows import NEWTON_MAX_ITER, QUAD_HALF_WIDTH, SPLIT_TOL, _extended_pieces
from gpustat.reference.bms import AFFINE_TOL, gauss_legendre, probit_factors
from gpustat.reference.numerics import ndtr, ndtr_and_pdf

__all__ = ["CalibrationStatus", "basis_table", "build_row_fields", "calibrate_intercepts",
           "cells_per_row", "fields_at_intercepts", "observed_neglog"]

COARSE_NODES = 10
COARSE_TOL = 1e-5
FINE_NODES = 32
FINE_TOL = 1e-8
TAIL_EXPONENT = 90.0
# half-widths, in units of 1/|C1|, of the panels around an affine η's zero: past 8 the
# step of Φ(η) is within Φ(-8) = 6e-16 of its limit
STEP_WIDTHS = 8.0
_INV_SQRT_2PI = 0.3989422804014327


class CalibrationStatus(enum.IntEnum):
    """Per-row outcome of the intercept Newton iteration (a = NaN unless OK)."""

    OK = 0
    NON_FINITE_STEP = 1       # F or F_a non-finite, or F_a <= 0
    NOT_CONVERGED = 2         # NEWTON_MAX_ITER steps without meeting the tolerance


def basis_table(basis):
    """A clamped basis as (breakpoints (P+1,), left ends (P+2,), pieces (P+2, p, 4)), the
    pieces as ascending local cubics with the constant continuations at both ends; None
    for None. Built on the host from a concrete basis (model structure, not a parameter)."""
    return None if basis is None else tuple(jnp.asarray(t) for t in _extended_pieces(basis))


def cells_per_row(score, link) -> int:
    """Cell slots per row, k = (#score knots) + (#link knots) + 3, for tables or None."""
    return sum(t[0].shape[0] for t in (score, link) if t is not None) + 3


# ----------------------------------------------------------------------------- cubics


def _compose_affine(coeffs, shift, scale):
    """Ascending coefficients in z of p(shift + scale z), p ascending cubic (..., 4)."""
    c0, c1, c2, c3 = (coeffs[..., m] for m in range(4))
    return jnp.stack([c0 + shift * (c1 + shift * (c2 + shift * c3)),
                      scale * (c1 + shift * (2.0 * c2 + 3.0 * shift * c3)),
                      scale * scale * (c2 + 3.0 * shift * c3),
                      scale * scale * scale * c3 * jnp.ones_like(shift)], axis=-1)


def _derivative(coeffs):
    """Ascending cubic coefficients of the derivative (still length 4)."""
    return jnp.concatenate([coeffs[..., 1:] * jnp.arange(1.0, 4.0),
                            jnp.zeros_like(coeffs[..., :1])], axis=-1)


def _times_z(coeffs):
    """z · p(z) for p of degree <= 2."""
    return jnp.concatenate([jnp.zeros_like(coeffs[..., :1]), coeffs[..., :3]], axis=-1)


def _poly(coeffs, z):
    return coeffs[..., 0] + z * (coeffs[..., 1] + z * (coeffs[..., 2] + z * coeffs[..., 3]))


def _piece(table, x):
    bp, left, pieces = table
    idx = jnp.searchsorted(bp, x, side="right", method="compare_all")  # a dozen breakpoints
    return left[idx], pieces[idx]


def _unit(k):
    return jnp.zeros(4).at[k].set(1.0)


def _eta_and_slope(score, link, z, a, b, s_f):
    """η and ∂η/∂a on the pieces active at z, as cubics in z (4,), for bases folded into
    one function each (tables with pieces (P+2, 4))."""
    c = a * _unit(0) + b * _unit(1)
    slope = _unit(0)
    if score is not None:
        left, piece = _piece(score, z)
        c = c + b * _compose_affine(piece, -left, 1.0)
    if link is not None:
        left, piece = _piece(link, a + b * z)
        c = c + _compose_affine(piece, a - left, b)
        slope = slope + _compose_affine(_derivative(piece), a - left, b)
    return s_f * c, s_f * slope


def _jets(score, link, beta_h, beta_w, z, a, b, s_f):
    """C (4,), jet (r, 4), jet_a (r, 4), jet_b (r-1, 4) on the pieces active at z (× S_f);
    the layouts of :class:`gpustat.bms.BmsRows`."""
    one, z_poly = _unit(0), _unit(1)
    h_j = jnp.zeros((0, 4))
    w_j = dw_j = jnp.zeros((0, 4))
    if score is not None:
        left, piece = _piece(score, z)
        h_j = _compose_affine(piece, -left, 1.0)
    if link is not None:
        left, piece = _piece(link, a + b * z)
        d1 = _derivative(piece)
        w_j = _compose_affine(piece, a - left, b)
        dw_j = _compose_affine(d1, a - left, b)
        d2w_j = _compose_affine(_derivative(d1), a - left, b)
    h = beta_h @ h_j
    w, dw = beta_w @ w_j, beta_w @ dw_j
    d2w = beta_w @ d2w_j if link is not None else jnp.zeros(4)
    c = a * one + b * z_poly + b * h + w
    jet = jnp.concatenate([(one + dw)[None], (z_poly + h + _times_z(dw))[None], b * h_j, w_j])
    jet_a = jnp.concatenate([d2w[None], _times_z(d2w)[None], jnp.zeros_like(h_j), dw_j])
    jet_b = jnp.concatenate([_times_z(_times_z(d2w))[None], h_j, _times_z(dw_j)])
    return s_f * c, s_f * jet, s_f * jet_a, s_f * jet_b


# ----------------------------------------------------------------------------- one row


def _sort_nan_last(v):
    """``jnp.sort`` of a short vector (NaN last): each entry placed at its rank (the entries
    before it in value, ties by position), comparisons a fused kernel does where a sort is
    a kernel of its own."""
    nan = jnp.isnan(v)
    key = jnp.where(nan, 0.0, v)
    pos = jnp.arange(v.shape[0])
    # entry j sorts before entry i: (isnan, value, position)_j < (...)_i
    first = lambda x: x[None, :] < x[:, None]   # noqa: E731
    same = lambda x: x[None, :] == x[:, None]   # noqa: E731
    before = first(nan) | (same(nan) & (first(key) | (same(key) & first(pos))))
    rank = jnp.sum(before, axis=1)
    return jnp.sum(jnp.where(rank[None, :] == pos[:, None], v[None, :], 0.0), axis=1)


def _partition(score_bp, link_bp, a, b, far_cuts=True):
    """Cell slots of one row: (lo, hi, probe, valid), each (k,), or (k - 2,) without the
    cuts at |z| = 40 (``far_cuts=False``, for integrals clipped inside |z| <= 40: a cut
    there would only split a cell whose pieces are the same on both sides)."""
    pts = []
    if score_bp is not None:
        pts.append(score_bp)
    if link_bp is not None:
        moving = jnp.abs(b) > SPLIT_TOL
        pts.append(jnp.where(moving, (link_bp - a) / jnp.where(moving, b, 1.0), jnp.nan))
    pts = jnp.concatenate(pts) if pts else jnp.zeros(0)
    # a finite cell reaching past |z| = 40 is cut there (the integrand is 0 in float64)
    if far_cuts:
        cuts = jnp.stack([jnp.where(jnp.any(pts < -QUAD_HALF_WIDTH), -QUAD_HALF_WIDTH, jnp.nan),
                          jnp.where(jnp.any(pts > QUAD_HALF_WIDTH), QUAD_HALF_WIDTH, jnp.nan)])
        pts = jnp.concatenate([pts, cuts])
    pts = _sort_nan_last(pts)                             # NaN (unused) slots last
    lo = jnp.concatenate([jnp.array([-jnp.inf]), pts])
    hi = jnp.concatenate([pts, jnp.array([jnp.inf])])
    last = jnp.sum(~jnp.isnan(pts))                       # slot of the right tail
    col = jnp.arange(lo.shape[0])
    hi = jnp.where(col == last, jnp.inf, hi)
    lo_fin, hi_fin = jnp.isfinite(lo), jnp.isfinite(hi)
    both = lo_fin & hi_fin
    valid = (col <= last) & ~jnp.isnan(lo) & ~jnp.isnan(hi)
    valid &= ~both | (jnp.where(both, hi - lo, 1.0) > SPLIT_TOL)
    probe = jnp.where(both, 0.5 * (jnp.where(both, lo, 0.0) + jnp.where(both, hi, 0.0)),
                      jnp.where(lo_fin, lo + 1.0, jnp.where(hi_fin, hi - 1.0, 0.0)))
    return lo, hi, jnp.where(valid, probe, 0.0), valid


def _calibration(score, link, a, b, q, s_f, nodes):
    """F(a) - Φ(q) and F_a of one row by Gauss-Legendre with ``nodes`` per panel."""
    lo, hi, probe, valid = _partition(None if score is None else score[0],
                                      None if link is None else link[0], a, b, far_cuts=False)
    c, slope = jax.vmap(lambda z: _eta_and_slope(score, link, z, a, b, s_f))(probe)
    half_width = jnp.minimum(QUAD_HALF_WIDTH, jnp.sqrt(q * q + TAIL_EXPONENT))
    lo = jnp.where(valid, jnp.clip(lo, -half_width, half_width), 0.0)
    hi = jnp.where(valid, jnp.clip(hi, -half_width, half_width), 0.0)
    # four panels a cell: where η is affine with its zero inside and a step of Φ(η)
    # (width 1/|C1|) narrower than a quarter of the cell, the step lies between two
    # panels of STEP_WIDTHS / |C1| on either side of the zero (the nodes cluster at
    # panel ends) and the smooth rest in the outer two; else four equal panels
    affine = jnp.all(jnp.abs(c[:, 2:]) <= AFFINE_TOL, axis=-1) & (c[:, 1] != 0)
    root = -c[:, 0] / jnp.where(affine, c[:, 1], 1.0)
    step = STEP_WIDTHS / jnp.abs(jnp.where(affine, c[:, 1], 1.0))
    quarter = 0.25 * (hi - lo)
    graded = affine & (root > lo) & (root < hi) & (step < quarter)
    cut = jnp.where(graded, root, 0.5 * (lo + hi))
    reach = jnp.where(graded, step, quarter)
    inner_lo, inner_hi = jnp.maximum(lo, cut - reach), jnp.minimum(hi, cut + reach)
    lo_p = jnp.stack([lo, inner_lo, cut, inner_hi], axis=-1)[..., None]  # (k, 4, 1)
    hi_p = jnp.stack([inner_lo, cut, inner_hi, hi], axis=-1)[..., None]
    x, wts = gauss_legendre(nodes)
    half = 0.5 * (hi_p - lo_p)
    z = 0.5 * (hi_p + lo_p) + half * x                                    # (k, 4, nodes)
    eta = _poly(c[:, None, None, :], z)
    dens = half * wts * _INV_SQRT_2PI * jnp.exp(-0.5 * z * z)
    sign = jnp.where(q > 0, -1.0, 1.0)
    cdf, pdf = ndtr_and_pdf(sign * eta)
    # F and F_a as one sum of complex numbers: one reduction reads the integrand's exp
    # where it is computed (two sums store it to memory for the second)
    both = jnp.sum(dens * jax.lax.complex(cdf, pdf * _poly(slope[:, None, None, :], z)))
    return sign * (both.real - ndtr(sign * q)), both.imag


def _newton(score, link, q, b, s_f, a, nodes, tol):
    """Newton steps on one row's F until |step| <= tol (1 + |a|); (a, status, iterations)."""
    def cond(state):
        _, _, it, done = state
        return ~done & (it < NEWTON_MAX_ITER)

    def body(state):
        a, _, it, _ = state
        f, f_a = _calibration(score, link, a, b, q, s_f, nodes)
        step = f / f_a
        ok = jnp.isfinite(step) & (f_a > 0)
        a = jnp.where(ok, a - step, jnp.nan)
        converged = ok & (jnp.abs(step) <= tol * (1.0 + jnp.abs(a)))
        status = jnp.where(ok, CalibrationStatus.OK, CalibrationStatus.NON_FINITE_STEP)
        return a, status.astype(jnp.int32), it + 1, ~ok | converged

    a, status, it, done = jax.lax.while_loop(
        cond, body, (a, jnp.int32(CalibrationStatus.OK), jnp.int32(0), jnp.bool_(False)))
    status = jnp.where(done, status, CalibrationStatus.NOT_CONVERGED).astype(jnp.int32)
    return jnp.where(status == CalibrationStatus.OK, a, jnp.nan), status, it


def _fold(table, beta):
    """A basis table with its functions summed with weights beta: pieces (P+2, 4)."""
    if table is None:
        return None
    bp, left, pieces = table
    return bp, left, jnp.einsum("kjc,j->kc", pieces, beta)


def _solve_row(score, link, q, b, s_f, a_start, coarse_nodes, fine_nodes):
    rigid = q * jnp.sqrt(1.0 + (s_f * b) ** 2) / s_f
    a0 = jnp.where(jnp.isfinite(a_start), a_start, rigid)
    a, status, it = _newton(score, link, q, b, s_f, a0, coarse_nodes, COARSE_TOL)
    # a coarse failure restarts from the rigid solution on the fine rule
    a = jnp.where(status == CalibrationStatus.OK, a, rigid)
    a, status, it_fine = _newton(score, link, q, b, s_f, a, fine_nodes, FINE_TOL)
    return a, status, it + it_fine


@functools.partial(jax.custom_jvp, nondiff_argnums=(8, 9))
def _intercepts(score, link, beta_h, beta_w, q, b, s_f, a_start, coarse_nodes, fine_nodes):
    folded = _fold(score, beta_h), _fold(link, beta_w)
    return jax.vmap(lambda qq, bb, aa: _solve_row(*folded, qq, bb, s_f, aa, coarse_nodes,
                                                  fine_nodes))(q, b, a_start)


@_intercepts.defjvp
def _intercepts_jvp(coarse_nodes, fine_nodes, primals, tangents):
    a, status, it = _intercepts(*primals, coarse_nodes, fine_nodes)

    # the root does not depend on where the iteration starts: a_start has no tangent
    def residual(score, link, beta_h, beta_w, q, b, s_f, a_start, a):
        folded = _fold(score, beta_h), _fold(link, beta_w)
        return jax.vmap(lambda qq, bb, aa: _calibration(*folded, aa, bb, qq, s_f, fine_nodes))(
            q, b, a)

    (_, f_a), (f_dot, _) = jax.jvp(lambda *args: residual(*args, jax.lax.stop_gradient(a)),
                                   primals, tangents)
    zero = np.zeros((), jax.dtypes.float0)
    return (a, status, it), (-f_dot / f_a, jnp.broadcast_to(zero, status.shape),
                             jnp.broadcast_to(zero, it.shape))


def calibrate_intercepts(score, link, beta_h, beta_w, q, b, s_f, *, a_start=None,
                         coarse_nodes: int = COARSE_NODES, fine_nodes: int = FINE_NODES):
    """Intercepts a (n,), :class:`CalibrationStatus` (n,) int32 and Newton steps (n,).

    ``score``/``link`` are :func:`basis_table` tables or None; the rest (traceable):
    beta_h (p_h,), beta_w (p_w,), q, b (n,), s_f (). ``a_start`` (n,): where each row's
    iteration starts (a fitting loop passes the intercepts of its last iterate); NaN
    entries and the default None start from the rigid solution. Differentiable in every
    floating argument but ``a_start`` (implicit function theorem).
    """
    a_start = jnp.full(jnp.shape(q), jnp.nan) if a_start is None else jnp.asarray(a_start)
    return _intercepts(score, link, beta_h, beta_w, q, b, s_f, a_start, coarse_nodes,
                       fine_nodes)


def observed_neglog(score, link, beta_h, beta_w, a, b, z_obs, y, w, s_f):
    """-w log Φ(s η(z_obs)) per row given the intercepts a (n,): the row objective alone,
    without cells (a line search's trial value)."""
    def one(a, b, z):
        c, _ = _eta_and_slope(_fold(score, beta_h), _fold(link, beta_w), z, a, b, s_f)
        return _poly(c, z)

    e_obs = jax.vmap(one)(a, b, z_obs)
    return probit_factors(e_obs, y, w)[0]


def build_row_fields(score, link, beta_h, beta_w, q, b, z_obs, y, w, s_f, *, a_start=None,
                     coarse_nodes: int = COARSE_NODES, fine_nodes: int = FINE_NODES):
    """Stage 0 of n rows: every :class:`gpustat.bms.BmsRows` field but the moments.

    Args:
        score, link: :func:`basis_table` tables (host numpy) or None.
        beta_h (p_h,), beta_w (p_w,), q, b, z_obs, y, w (n,), s_f (): float64, traceable.
        a_start: (n,) or None, where the intercept iterations start
            (:func:`calibrate_intercepts`).

    Returns:
        (fields, valid, calibration status): ``fields`` holds the cells of row i in slots
        ``[k i, k (i + 1))`` (k = :func:`cells_per_row`), ``valid`` (n, k) marks the
        cells that are not padding; status (n,) int32 :class:`CalibrationStatus`.
    """
    a, status, _ = calibrate_intercepts(score, link, beta_h, beta_w, q, b, s_f, a_start=a_start,
                                        coarse_nodes=coarse_nodes, fine_nodes=fine_nodes)
    fields, valid = fields_at_intercepts(score, link, beta_h, beta_w, a, q, b, z_obs, y, w, s_f)
    return fields, valid, status


def fields_at_intercepts(score, link, beta_h, beta_w, a, q, b, z_obs, y, w, s_f):
    """:func:`build_row_fields` at intercepts ``a`` (n,) already calibrated (NaN for a
    failed row): (fields, valid), without the calibration."""
    score_bp = None if score is None else score[0]
    link_bp = None if link is None else link[0]
    jets = functools.partial(_jets, score, link, beta_h, beta_w, s_f=s_f)

    def cells(a, b):
        lo, hi, probe, valid = _partition(score_bp, link_bp, a, b)
        c, jet, jet_a, jet_b = jax.vmap(lambda z: jets(z, a, b))(probe)
        # the tails are affine by construction (constant bases): exact zeros
        tail = ~(jnp.isfinite(lo) & jnp.isfinite(hi))
        flat = tail[:, None] & (jnp.abs(c[:, 2:]) <= AFFINE_TOL)
        c = c.at[:, 2:].set(jnp.where(flat, 0.0, c[:, 2:]))
        pad = ~valid
        return (jnp.where(pad, -1.0, lo), jnp.where(pad, 1.0, hi),
                jnp.where(pad[:, None], 0.0, c), jnp.where(pad[:, None, None], 0.0, jet),
                jnp.where(pad[:, None, None], 0.0, jet_a),
                jnp.where(pad[:, None, None], 0.0, jet_b), valid)

    def observed(a, b, z):
        c, jet, jet_a, jet_b = jets(z, a, b)
        rho = _poly(jet, z).at[0].set(0.0)
        tau = _poly(jet_a, z).at[0].set(0.0)
        second_b = _poly(jet_b, z)
        r_uv = jnp.zeros((rho.shape[0],) * 2).at[1, 1:].set(second_b).at[1:, 1].set(second_b)
        return _poly(c, z), _poly(jet[0], z), _poly(jet_a[0], z), rho, tau, r_uv

    lo, hi, c, jet, jet_a, jet_b, valid = jax.vmap(cells)(a, b)
    e_obs, chi, xi, rho, tau, r_uv = jax.vmap(observed)(a, b, z_obs)
    n, k = valid.shape
    phi_q = _INV_SQRT_2PI * jnp.exp(-0.5 * q * q)
    fields = dict(
        q=q, b=b, a=a, z_obs=z_obs, y=y, w=w, mu_1=phi_q, mu_2=-q * phi_q, e_obs=e_obs,
        chi=chi, xi=xi, rho=rho, tau=tau, r_uv=r_uv,
        cell_offsets=(k * jnp.arange(n + 1)).astype(jnp.int32),
        cell_lo=lo.reshape(n * k), cell_hi=hi.reshape(n * k), cell_c=c.reshape(n * k, 4),
        cell_jet=jet.reshape(n * k, *jet.shape[2:]),
        cell_jet_a=jet_a.reshape(n * k, *jet_a.shape[2:]),
        cell_jet_b=jet_b.reshape(n * k, *jet_b.shape[2:]), s_f=jnp.asarray(s_f))
    return fields, valid
