"""BMS FLEX Stage 0 (host): per-row intercept calibration, cell partition, coefficient jets.

From model parameters (q, b, β_h, β_w, the two spline bases, z_obs, y, w, S_f) to the
Stage-1/Stage-2 inputs of ``specs/bms_flex.md`` A.2, in float64 numpy vectorised
over rows:

1. a_i solves ``F(a) = ∫ Φ(η(z; a)) φ(z) dz - Φ(q_i) = 0`` by Newton from the rigid
   solution ``q √(1 + S_f² b²)/S_f`` (for q > 0 as ``Φ(-q) - ∫ Φ(-η) φ dz``, which does
   not cancel when Φ(q) is close to 1). F is integrated per cell by Gauss-Legendre-384
   on two panels, cut where an affine η crosses 0 (else at the midpoint), of the cells
   clipped to |z| <= 40 (the normal mass beyond is below 1e-348, zero in float64); F_a
   by the same rule.
2. The z-line is cut at the score knots and at ``(τ - a)/b`` for the link knots τ
   (|b| > 1e-12), and at z = ±40 where a cut lies beyond; windows of width <= 1e-12 are
   dropped; the two outer cells are semi-infinite affine tails (the bases are constant
   beyond their knots).
3. On each cell the active pieces are re-expanded as cubics in the global z, giving
   C and the jets (:class:`BmsRows` fields); the observed point gives e_obs, χ, ξ,
   ρ, τ, r_uv.

A row whose Newton iteration fails gets a = NaN: its cells carry NaN coefficients,
Stage 1 flags them (status 3) and Stage 2 reports the row (status 3), never the batch.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np
from jaxtyping import ArrayLike, Float
from scipy.special import ndtr

from gpustat.piecewise import PiecewisePolynomial
from gpustat.reference.bms import AFFINE_TOL, GL_NODES, gauss_legendre

__all__ = ["BmsRows", "build_row_arrays", "flat_cubic_basis"]

SPLIT_TOL = 1e-12
QUAD_HALF_WIDTH = 40.0
NEWTON_MAX_ITER = 60
NEWTON_TOL = 1e-12
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class BmsRows:
    """Stage-1/Stage-2 inputs of n rows whose c cells are stored in CSR order.

    Coordinates of a row: θ = (q, b, β_h (p_h), β_w (p_w)), r = 2 + p_h + p_w. Jets are
    cubic polynomials in the global z, ascending powers, already multiplied by S_f;
    in the packed jets slot 0 stands for the intercept a and slot u >= 1 for θ_u.

    Attributes:
        q, b, a, z_obs, y, w: (n,) marginal index, slope, calibrated intercept,
            observed score, response in {0, 1}, weight.
        mu_1, mu_2: (n,) φ(q) and -q φ(q).
        e_obs, chi, xi: (n,) η, ∂η/∂a, ∂²η/∂a² at z_obs.
        rho, tau: (n, r) explicit ∂η/∂θ_u and ∂²η/∂a∂θ_u at z_obs (slot 0 = 0).
        r_uv: (n, r, r) explicit ∂²η/∂θ_u∂θ_v at z_obs (symmetric).
        cell_offsets: (n+1,) int32, row i owns cells ``[off_i, off_{i+1})``.
        cell_lo, cell_hi: (c,) cell bounds (±inf for the tails).
        cell_c: (c, 4) η on the cell, C0..C3.
        cell_jet: (c, r, 4) [∂η/∂a, ∂η/∂θ_1, …] (A, R_u).
        cell_jet_a: (c, r, 4) [∂²η/∂a², ∂²η/∂a∂θ_1, …] (AA, AR_u).
        cell_jet_b: (c, r-1, 4) ∂²η/∂b∂θ_u for u = 1..r-1 (S_bb, S_{bh_j}, S_{bw_j}).
        cell_moments: (c, K+1) Stage-1 moments; cell_status: (c,) int32 Stage-1 status.
        s_f: () frailty scale S_f (already inside every coefficient).
        p_h, p_w: static basis sizes.
    """

    q: np.ndarray
    b: np.ndarray
    a: np.ndarray
    z_obs: np.ndarray
    y: np.ndarray
    w: np.ndarray
    mu_1: np.ndarray
    mu_2: np.ndarray
    e_obs: np.ndarray
    chi: np.ndarray
    xi: np.ndarray
    rho: np.ndarray
    tau: np.ndarray
    r_uv: np.ndarray
    cell_offsets: np.ndarray
    cell_lo: np.ndarray
    cell_hi: np.ndarray
    cell_c: np.ndarray
    cell_jet: np.ndarray
    cell_jet_a: np.ndarray
    cell_jet_b: np.ndarray
    cell_moments: np.ndarray
    cell_status: np.ndarray
    s_f: np.ndarray
    p_h: int = dataclasses.field(metadata={"static": True})
    p_w: int = dataclasses.field(metadata={"static": True})

    @property
    def n(self) -> int:
        """Number of rows."""
        return self.q.shape[0]

    @property
    def r(self) -> int:
        """Row coordinates, 2 + p_h + p_w."""
        return 2 + self.p_h + self.p_w

    @property
    def n_cells(self) -> int:
        """Total number of cells."""
        return self.cell_c.shape[0]


# ----------------------------------------------------------------------------- bases


def flat_cubic_basis(breakpoints: Float[ArrayLike, " P1"]) -> PiecewisePolynomial:
    """P - 1 cubic B-spline combinations on P pieces that are C² on the whole line.

    The clamped cubic B-splines B_0..B_{P+2} on ``breakpoints`` are regrouped as
    (B_0+B_1+B_2, B_3, …, B_{P-1}, B_P+B_{P+1}+B_{P+2}): every function is flat (zero
    first and second derivative) at both ends, so its constant extension is C² and the
    Stage-2 formulas (no boundary terms) are exact. Needs P >= 4.

    Args:
        breakpoints: (P+1,) strictly increasing knots.

    Returns:
        :class:`gpustat.PiecewisePolynomial` with coeffs (4, P, P-1), extrapolate="clamp".
    """
    from scipy.interpolate import BSpline, PPoly

    x = np.asarray(breakpoints, dtype=np.float64)
    if x.ndim != 1 or x.shape[0] < 5:
        raise ValueError(f"flat_cubic_basis needs breakpoints of shape (P+1,) with P >= 4, got "
                         f"breakpoints.shape={x.shape}")
    if not (np.all(np.isfinite(x)) and np.all(np.diff(x) > 0)):
        raise ValueError(f"breakpoints must be finite and strictly increasing, got {x}")
    pieces = x.shape[0] - 1
    knots = np.concatenate([[x[0]] * 3, x, [x[-1]] * 3])
    n_bsplines = pieces + 3
    groups = [[0, 1, 2], *[[j] for j in range(3, pieces)], [pieces, pieces + 1, pieces + 2]]
    coeffs = np.zeros((4, pieces, len(groups)))
    for col, group in enumerate(groups):
        weights = np.zeros(n_bsplines)
        weights[group] = 1.0
        pp = PPoly.from_spline(BSpline(knots, weights, 3, extrapolate=False))
        # PPoly.from_spline keeps the repeated end knots as zero-width pieces
        keep = np.diff(pp.x) > 0
        coeffs[:, :, col] = pp.c[:, keep]
    return PiecewisePolynomial(x, coeffs, extrapolate="clamp")


def _extended_pieces(basis):
    """Ascending local cubic coefficients of a clamped basis with two constant end pieces.

    Returns (breakpoints (P+1,), left ends (P+2,), coefficients (P+2, p, 4)); piece 0 is
    the constant continuation left of x_0, piece P+1 the one right of x_P, so the piece
    of a point x is ``searchsorted(breakpoints, x, "right")``.
    """
    bp = np.asarray(basis.breakpoints, dtype=np.float64)
    c = np.asarray(basis.coeffs, dtype=np.float64)
    c = np.concatenate([np.zeros((4 - c.shape[0], *c.shape[1:])), c])[::-1]     # ascending
    local = np.moveaxis(c, 0, -1)                                                # (P, p, 4)
    width = bp[-1] - bp[-2]
    last_value = local[-1] @ (width ** np.arange(4))
    first = np.zeros_like(local[:1])
    first[..., 0] = local[0, :, 0]
    last = np.zeros_like(local[:1])
    last[..., 0] = last_value
    return bp, np.concatenate([bp[:1], bp[:-1], bp[-1:]]), np.concatenate([first, local, last])


def _derivative(coeffs):
    """Ascending cubic coefficients of the derivative (still length 4)."""
    d = np.zeros_like(coeffs)
    d[..., :3] = coeffs[..., 1:] * np.arange(1, 4)
    return d


def _compose_affine(coeffs, shift, scale):
    """Coefficients in z of p(shift + scale z) for ascending cubic p; shift/scale broadcast."""
    shift = np.asarray(shift)[..., None]
    scale = np.asarray(scale)[..., None]
    out = np.zeros(np.broadcast_shapes(coeffs.shape, shift.shape))
    binom = [[1], [1, 1], [1, 2, 1], [1, 3, 3, 1]]
    for m in range(4):
        for k in range(m + 1):
            out[..., k] = out[..., k] + (coeffs[..., m] * binom[m][k]
                                         * shift[..., 0] ** (m - k) * scale[..., 0] ** k)
    return out


def _times_z(coeffs):
    """z · p(z) for p of degree <= 2 (ascending, length 4)."""
    return np.concatenate([np.zeros_like(coeffs[..., :1]), coeffs[..., :3]], axis=-1)


def _poly_value(coeffs, z):
    """Horner evaluation of ascending cubics (…, 4) at z (broadcast)."""
    z = np.asarray(z)
    return coeffs[..., 0] + z * (coeffs[..., 1] + z * (coeffs[..., 2] + z * coeffs[..., 3]))


@dataclasses.dataclass(frozen=True)
class _Model:
    """Model pieces shared by all rows (numpy, float64)."""

    beta_h: np.ndarray
    beta_w: np.ndarray
    score: tuple | None
    link: tuple | None
    s_f: float

    @property
    def p_h(self) -> int:
        return self.beta_h.shape[0]

    @property
    def p_w(self) -> int:
        return self.beta_w.shape[0]


def _score_terms(model, z):
    """Per-basis score pieces at z as cubics in z: (…, p_h, 4)."""
    bp, left, pieces = model.score
    idx = np.searchsorted(bp, z, side="right")
    return _compose_affine(pieces[idx], -left[idx][..., None], 1.0)


def _link_terms(model, z, a, b):
    """Per-basis link pieces w_j(a + b z) at the piece active at u = a + b z: (…, p_w, 4) × 3
    (value, first and second derivative in u), each as a cubic in z."""
    bp, left, pieces = model.link
    u = a + b * z
    idx = np.searchsorted(bp, u, side="right")
    local = pieces[idx]
    shift = (a - left[idx])[..., None]
    scale = np.asarray(b)[..., None]
    d1 = _derivative(local)
    return (_compose_affine(local, shift, scale), _compose_affine(d1, shift, scale),
            _compose_affine(_derivative(d1), shift, scale))


def _jets(model, z_probe, a, b):
    """All jets of the pieces active at ``z_probe`` (…), as cubics in z (× S_f).

    Returns C (…, 4), jet (…, r, 4), jet_a (…, r, 4), jet_b (…, r-1, 4).
    """
    shape = np.broadcast_shapes(np.shape(z_probe), np.shape(a))
    a = np.broadcast_to(a, shape)
    b = np.broadcast_to(b, shape)
    zero = np.zeros((*shape, 4))
    z_poly = zero.copy()
    z_poly[..., 1] = 1.0
    one = zero.copy()
    one[..., 0] = 1.0
    if model.score is not None:
        h_j = _score_terms(model, z_probe)
        h = np.einsum("...jk,j->...k", h_j, model.beta_h)
    else:
        h_j = np.zeros((*shape, 0, 4))
        h = zero
    if model.link is not None:
        w_j, dw_j, d2w_j = _link_terms(model, z_probe, a, b)
        w, dw, d2w = (np.einsum("...jk,j->...k", t, model.beta_w) for t in (w_j, dw_j, d2w_j))
    else:
        w_j = dw_j = np.zeros((*shape, 0, 4))
        w = dw = d2w = zero
    bb = b[..., None]
    c = a[..., None] * one + bb * z_poly + bb * h + w
    jet = np.concatenate([(one + dw)[..., None, :], (z_poly + h + _times_z(dw))[..., None, :],
                          bb[..., None] * h_j, w_j], axis=-2)
    jet_a = np.concatenate([d2w[..., None, :], _times_z(d2w)[..., None, :],
                            np.zeros_like(h_j), dw_j], axis=-2)
    jet_b = np.concatenate([_times_z(_times_z(d2w))[..., None, :], h_j, _times_z(dw_j)], axis=-2)
    s = model.s_f
    return s * c, s * jet, s * jet_a, s * jet_b


def _partition(model, a, b):
    """Padded cells per row: (lo, hi, probe, valid), each (n, k_max)."""
    n = a.shape[0]
    splits = [np.broadcast_to(model.score[0], (n, model.score[0].shape[0]))] if model.score else []
    if model.link is not None:
        tau = model.link[0]
        moving = np.abs(b) > SPLIT_TOL
        safe_b = np.where(moving, b, 1.0)
        splits.append(np.where(moving[:, None], (tau[None, :] - a[:, None]) / safe_b[:, None],
                               np.nan))
    pts = np.concatenate(splits, axis=1) if splits else np.zeros((n, 0))
    # a finite cell reaching past |z| = 40 (link knots (τ - a)/b at small |b|) is cut there:
    # Gauss-Legendre-384 on [2.5, 9e5] (b = 1e-6) missed the cell's whole mass, and beyond
    # 40 the integrand is 0 in float64
    for side in (-1.0, 1.0):
        beyond = np.any(side * pts > QUAD_HALF_WIDTH, axis=1)
        if np.any(beyond):
            cut = np.where(beyond, side * QUAD_HALF_WIDTH, np.nan)
            pts = np.concatenate([pts, cut[:, None]], axis=1)
    pts = np.sort(pts, axis=1)
    inf = np.full((n, 1), np.inf)
    # NaN splits (b ~ 0, or a = NaN) sort last; a NaN bound invalidates its window
    lo = np.concatenate([-inf, pts], axis=1)
    hi = np.concatenate([pts, inf], axis=1)
    last = np.sum(~np.isnan(pts), axis=1)               # index of the right tail
    col = np.arange(lo.shape[1])[None, :]
    hi = np.where(col == last[:, None], np.inf, hi)
    lo_fin = np.isfinite(lo)
    hi_fin = np.isfinite(hi)
    valid = (col <= last[:, None]) & ~np.isnan(lo) & ~np.isnan(hi)
    with np.errstate(invalid="ignore"):
        valid &= ~(lo_fin & hi_fin) | (hi - lo > SPLIT_TOL)
    with np.errstate(invalid="ignore"):
        probe = np.where(lo_fin & hi_fin, 0.5 * (lo + hi),
                         np.where(lo_fin, lo + 1.0, np.where(hi_fin, hi - 1.0, 0.0)))
    probe = np.where(valid, probe, 0.0)
    return lo, hi, probe, valid


def _panels(lo, hi, c):
    """Each cell [lo, hi] as two quadrature panels: split where an affine η crosses 0,
    else at the midpoint. Returns (lo, hi), each (..., 2).

    Φ(η) steps at the root over a width 1/|C1| (the integrand's mass sits there when Φ(q)
    is small): Gauss-Legendre resolves that at a panel end, where its nodes cluster, but
    not inside a wide panel (one panel on a whole-line cell with slope 8 put a 2e-2 off).
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        root = -c[..., 0] / c[..., 1]
    affine = np.all(np.abs(c[..., 2:]) <= AFFINE_TOL, axis=-1) & np.isfinite(root)
    cut = np.where(affine, np.clip(root, lo, hi), 0.5 * (lo + hi))
    return np.stack([lo, cut], axis=-1), np.stack([cut, hi], axis=-1)


def _calibration(model, a, b, q):
    """F(a) - Φ(q) and F_a per row by Gauss-Legendre on two panels per cell (the cell
    clipped to |z| <= 40)."""
    lo, hi, probe, valid = _partition(model, a, b)
    c, jet, _, _ = _jets(model, probe, a[:, None], b[:, None])
    nodes, weights = gauss_legendre(GL_NODES)
    lo_q = np.where(valid, np.clip(lo, -QUAD_HALF_WIDTH, QUAD_HALF_WIDTH), 0.0)
    hi_q = np.where(valid, np.clip(hi, -QUAD_HALF_WIDTH, QUAD_HALF_WIDTH), 0.0)
    lo_p, hi_p = _panels(lo_q, hi_q, c)                                    # (n, k, 2)
    half = 0.5 * (hi_p - lo_p)[..., None]
    z = 0.5 * (hi_p + lo_p)[..., None] + half * nodes                      # (n, k, 2, nodes)
    eta = _poly_value(c[..., None, None, :], z)
    dens = half * weights * _INV_SQRT_2PI * np.exp(-0.5 * z * z)
    # for q > 0, F = Φ(-q) - ∫ Φ(-η) φ dz (∫ φ dz = 1): both terms keep their relative
    # precision where ∫ Φ(η) φ dz - Φ(q) would cancel two numbers close to 1
    sign = np.where(q > 0, -1.0, 1.0)
    f = sign * (np.sum(ndtr(sign[:, None, None, None] * eta) * dens, axis=(1, 2, 3))
                - ndtr(sign * q))
    f_a = np.sum(_INV_SQRT_2PI * np.exp(-0.5 * eta * eta)
                 * _poly_value(jet[..., 0, None, None, :], z) * dens, axis=(1, 2, 3))
    return f, f_a


def _combined(model):
    """The model with each basis folded into its fitted spline (β = 1): C and A only."""
    def fold(table, beta):
        if table is None:
            return None
        bp, left, pieces = table
        return bp, left, np.einsum("kjc,j->kc", pieces, beta)[:, None, :]

    return _Model(np.ones(1), np.ones(1), fold(model.score, model.beta_h),
                  fold(model.link, model.beta_w), model.s_f)


def _solve_intercepts(model, q, b, chunk=256):
    """Newton on F(a) = 0 per row (in chunks of rows); rows that do not converge get NaN.

    Converged when the Newton step is below 1e-12 (1 + |a|): the step taken then leaves
    an error of order its square, below the quadrature's rounding.
    """
    if q.shape[0] > chunk:
        return np.concatenate([_solve_intercepts(model, q[i:i + chunk], b[i:i + chunk], chunk)
                               for i in range(0, q.shape[0], chunk)])
    a = q * np.sqrt(1.0 + (model.s_f * b) ** 2) / model.s_f
    done = np.zeros(q.shape, bool)
    with np.errstate(all="ignore"):
        for _ in range(NEWTON_MAX_ITER):
            f, f_a = _calibration(model, a, b, q)
            step = np.where(done, 0.0, f / f_a)
            ok = np.isfinite(step) & (f_a > 0)
            a = np.where(ok, a - step, np.nan)
            done |= ~ok | (np.abs(step) <= NEWTON_TOL * (1.0 + np.abs(a)))
            if np.all(done):
                break
    return np.where(done, a, np.nan)


def build_row_arrays(q, b, beta_h, beta_w, score_basis, link_basis, z_obs, y, w, s_f):
    """Stage 0 as numpy arrays (inputs already validated): every BmsRows field but moments."""
    score = _extended_pieces(score_basis) if score_basis is not None else None
    link = _extended_pieces(link_basis) if link_basis is not None else None
    model = _Model(np.asarray(beta_h, np.float64), np.asarray(beta_w, np.float64), score, link,
                   float(s_f))
    q, b, z_obs, y, w = (np.asarray(v, np.float64) for v in (q, b, z_obs, y, w))
    a = _solve_intercepts(_combined(model), q, b)
    lo, hi, probe, valid = _partition(model, a, b)
    c, jet, jet_a, jet_b = _jets(model, probe, a[:, None], b[:, None])
    # the tails are affine by construction (constant bases); exact zeros as the spec asks
    tail = ~(np.isfinite(lo) & np.isfinite(hi))
    flat = tail[..., None] & (np.abs(c[..., 2:]) <= AFFINE_TOL)
    c[..., 2:] = np.where(flat, 0.0, c[..., 2:])
    counts = valid.sum(axis=1)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    obs_c, obs_jet, obs_jet_a, obs_jet_b = _jets(model, z_obs, a, b)
    r = 2 + model.p_h + model.p_w
    rho = _poly_value(obs_jet, z_obs[:, None])
    rho[:, 0] = 0.0
    tau = _poly_value(obs_jet_a, z_obs[:, None])
    tau[:, 0] = 0.0
    second_b = _poly_value(obs_jet_b, z_obs[:, None])                # (n, r-1)
    r_uv = np.zeros((q.shape[0], r, r))
    r_uv[:, 1, 1:] = second_b
    r_uv[:, 1:, 1] = second_b
    phi_q = _INV_SQRT_2PI * np.exp(-0.5 * q * q)
    return dict(
        q=q, b=b, a=a, z_obs=z_obs, y=y, w=w, mu_1=phi_q, mu_2=-q * phi_q,
        e_obs=_poly_value(obs_c, z_obs), chi=_poly_value(obs_jet[:, 0], z_obs),
        xi=_poly_value(obs_jet_a[:, 0], z_obs), rho=rho, tau=tau, r_uv=r_uv,
        cell_offsets=offsets, cell_lo=lo[valid], cell_hi=hi[valid], cell_c=c[valid],
        cell_jet=jet[valid], cell_jet_a=jet_a[valid], cell_jet_b=jet_b[valid],
        s_f=np.float64(s_f), p_h=model.p_h, p_w=model.p_w)
