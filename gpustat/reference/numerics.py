"""Probit numerics from operations the Pallas-Triton lowering accepts.

``lax.erf``/``lax.erfc`` (and so ``jax.scipy.special.ndtr``/``log_ndtr``) do not
lower inside Triton kernels, so these are written from ``exp``, ``log``,
``log1p``, ``floor``, ``where`` and rational functions only. The same functions
are the reference (applied to arrays) and the kernel bodies (applied to loaded
blocks). No clamps: every finite input gives the correctly rounded-ish result
or the true limit (0, ±inf), never a saturated constant.

Sources:
* W. J. Cody, "Rational Chebyshev approximations for the error function",
  Math. Comp. 23 (1969) 631-637, coefficients of CALERF (three intervals). The
  erfc interval ``x > 0.46875`` is evaluated as ``exp(-x^2) * erfcx(x)`` with
  ``x^2`` split exactly (Cody's device), so erfc keeps full relative accuracy
  down to the subnormal range.
* Mills ratio and curvature: ``λ(x) = φ(x)/Φ(x)``, ``C(x) = λ(x)(x + λ(x))``,
  with the Laplace continued fraction for ``x <= -3`` (the spec, ``bms_flex.md`` A.6,
  starts it at -4; see ``_CF_SWITCH``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

__all__ = [
    "erfc",
    "erfc_derivative",
    "erfcx",
    "erfcx_derivative",
    "log_ndtr",
    "log_ndtr_and_mills",
    "ndtr",
    "ndtr_and_pdf",
    "ndtr_derivative",
    "probit_curvature",
    "probit_curvature_derivative",
]

_SQRT2 = 1.4142135623730951
_INV_SQRT2 = 0.7071067811865476
_INV_SQRT_PI = 0.5641895835477563
_SQRT_PI = 1.7724538509055159
_TWO_OVER_SQRT_PI = 1.1283791670955126
_SQRT_2_OVER_PI = 0.7978845608028654
_INV_SQRT_2PI = 0.3989422804014327
_LN2 = 0.6931471805599453

# Cody's intervals: |x| <= 0.46875 (erf), 0.46875 < x <= 4, x > 4.
_SMALL = 0.46875
_MEDIUM = 4.0
_ERF_P = (1.85777706184603153e-1, 3.16112374387056560e00, 1.13864154151050156e02,
          3.77485237685302021e02, 3.20937758913846947e03)
_ERF_Q = (1.0, 2.36012909523441209e01, 2.44024637934444173e02, 1.28261652607737228e03,
          2.84423683343917062e03)
_MID_P = (2.15311535474403846e-8, 5.64188496988670089e-1, 8.88314979438837594e00,
          6.61191906371416295e01, 2.98635138197400131e02, 8.81952221241769090e02,
          1.71204761263407058e03, 2.05107837782607147e03, 1.23033935479799725e03)
_MID_Q = (1.0, 1.57449261107098347e01, 1.17693950891312499e02, 5.37181101862009858e02,
          1.62138957456669019e03, 3.29079923573345963e03, 4.36261909014324716e03,
          3.43936767414372164e03, 1.23033935480374942e03)
_TAIL_P = (1.63153871373020978e-2, 3.05326634961232344e-1, 3.60344899949804439e-1,
           1.25781726111229246e-1, 1.60837851487422766e-2, 6.58749161529837803e-4)
_TAIL_Q = (1.0, 2.56852019228982242e00, 1.87295284992346047e00, 5.27905102951428412e-1,
           6.05183413124413191e-2, 2.33520497626869185e-3)

# Laplace continued fraction for the curvature at x <= -3. The spec's kernel uses
# 32 terms from x <= -4 (truncation 3.5e-15 at x = -4, and the direct formula
# loses ~1e-14 to cancellation just above -4); 64 terms from -3 truncate below
# 6e-17 and keep the direct branch's cancellation factor λ/(x+λ) under 12.
_CF_TERMS = 64
_CF_SWITCH = -3.0


def _poly(coeffs, x):
    """Horner, highest power first."""
    acc = jnp.full_like(x, coeffs[0])
    for c in coeffs[1:]:
        acc = acc * x + c
    return acc


def _erf_small(x):
    """erf(x) for |x| <= 0.46875."""
    z = x * x
    return x * _poly(_ERF_P, z) / _poly(_ERF_Q, z)


def _erfcx_tail(y):
    """(tail, y_t, c): for y > 4 (``tail``), erfcx(y) = (1/√π - c) / y_t with
    c = z P(z) / Q(z), z = 1/y^2 (Cody's tail rational part); y_t = 1 off the tail.

    z is squared from 1/y, not 1/(y*y): its derivative then neither underflows (1/y^4,
    from y ~ 1e77) nor is inf/inf at y = inf, for erfcx'' from erfcx_derivative.
    """
    tail = y > _MEDIUM
    yt = jnp.where(tail, y, 1.0)
    w = 1.0 / yt
    z = w * w
    return tail, yt, z * _poly(_TAIL_P, z) / _poly(_TAIL_Q, z)


def _erfcx_pos(y):
    """erfcx(y) = exp(y^2) erfc(y) for y >= 0 (inf -> 0), no exponential overflow."""
    small = y <= _SMALL
    tail, yt, correction = _erfcx_tail(y)
    ys = jnp.where(small, y, 0.0)
    from_erf = jnp.exp(ys * ys) * (1.0 - _erf_small(ys))
    ym = jnp.where(small | tail, 1.0, y)
    mid = _poly(_MID_P, ym) / _poly(_MID_Q, ym)
    far = (_INV_SQRT_PI - correction) / yt
    return jnp.where(small, from_erf, jnp.where(tail, far, mid))


# exp(-y^2) is exactly 0 in float64 beyond y = 27.3; capping y there keeps the
# split below finite (16 y overflows near 1e307) without changing any result.
_EXP_SQ_CAP = 64.0


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def _exp_scaled_sq(y, scale):
    """exp(scale * y^2) for y >= 0 with y^2 split exactly: y = h + l, h = floor(16 y)/16.

    Cody's device: h^2 is exact, so the rounding of y^2 never reaches the exponent
    (plain exp(-y^2) loses y^2 ulps of relative accuracy).
    """
    y = jnp.minimum(y, _EXP_SQ_CAP)
    h = jnp.floor(y * 16.0) / 16.0
    return jnp.exp(scale * h * h) * jnp.exp(scale * (y - h) * (y + h))


@_exp_scaled_sq.defjvp
def _exp_scaled_sq_jvp(scale, primals, tangents):
    # 2 scale y e as one product. Differentiating the split instead adds (y - h) e and
    # (y + h) e, and the first is subnormal (flushed) where e is small but the derivative
    # is not: float32 erfc'' lost up to 3e-3 near x = 9. 0 past the cap, also at y = inf.
    (y,), (dy,) = primals, tangents
    value = _exp_scaled_sq(y, scale)
    return value, 2.0 * scale * jnp.minimum(y, _EXP_SQ_CAP) * value * dy


def _exp_neg_sq(y):
    """exp(-y^2) for y >= 0, see :func:`_exp_scaled_sq`."""
    return _exp_scaled_sq(y, -1.0)


def _gauss_pdf(x):
    """φ(x) = exp(-x^2/2)/√(2π) with the exponent split exactly."""
    return _INV_SQRT_2PI * _exp_scaled_sq(jnp.abs(x), -0.5)


def _erfc_pos(y):
    """erfc(y) for y >= 0, full relative accuracy until it underflows."""
    small = y <= _SMALL
    ys = jnp.where(small, y, 0.0)
    yl = jnp.where(small, 1.0, y)
    return jnp.where(small, 1.0 - _erf_small(ys), _exp_neg_sq(yl) * _erfcx_pos(yl))


def erfc(x):
    """Complementary error function, all real x (NaN -> NaN, ±inf -> 0 / 2)."""
    tail = _erfc_pos(jnp.abs(x))
    return jnp.where(x < 0, 2.0 - tail, tail)


def erfcx(x):
    """Scaled complementary error function ``exp(x^2) erfc(x)``, all real x.

    Negative x use ``2 exp(x^2) - erfcx(-x)``, which overflows to +inf below about
    -26.6 (float64), as scipy's ``erfcx`` does.
    """
    y = jnp.abs(x)
    pos = _erfcx_pos(y)
    yn = jnp.where(x < 0, y, 0.0)
    neg = 2.0 * _exp_scaled_sq(yn, 1.0) - pos
    return jnp.where(x < 0, neg, pos)


def erfc_derivative(x, value):
    """d/dx erfc(x) = -2/√π exp(-x^2) (``value`` unused), the square split as in erfc."""
    return -_TWO_OVER_SQRT_PI * _exp_neg_sq(jnp.abs(x))


def erfcx_derivative(x, value):
    """d/dx erfcx(x) = 2 x erfcx(x) - 2/√π, given ``value`` = erfcx(x).

    In the tail (x > 4) the two terms cancel to about -1/(√π x^2): there it is taken from
    the tail's rational part instead (:func:`_erfcx_tail`), erfcx(x) - 1/(x√π) = -c / x,
    so the derivative is -2 c (0 at +inf).
    """
    tail, _, correction = _erfcx_tail(x)
    near = 2.0 * jnp.where(tail, 0.0, x) * value - 2.0 * _INV_SQRT_PI
    return jnp.where(tail, -2.0 * correction, near)


def _ndtr_upper(t):
    """Q(t) = Φ(-t) = erfc(t/√2)/2 for t >= 0, accurate into the far tail.

    The Gaussian factor exp(-t^2/2) is taken from t itself (split square), not
    from the rounded t/√2.
    """
    u = t * _INV_SQRT2
    small = u <= _SMALL
    us = jnp.where(small, u, 0.0)
    tl = jnp.where(small, 1.0, t)
    far = 0.5 * _exp_scaled_sq(tl, -0.5) * _erfcx_pos(tl * _INV_SQRT2)
    return jnp.where(small, 0.5 * (1.0 - _erf_small(us)), far)


def ndtr(x):
    """Standard normal CDF Φ(x)."""
    q = _ndtr_upper(jnp.abs(x))
    return jnp.where(x < 0, q, 1.0 - q)


def ndtr_and_pdf(x):
    """(Φ(x), φ(x)) sharing one plain exp(-x²/2) and one division: about a third of the
    work of ``ndtr`` and ``_gauss_pdf`` apart, for integrands that need both. Each of
    Cody's three rationals is formed as a numerator and a denominator (the tail's in
    s = (x/√2)² instead of 1/s, its coefficients reversed), and the one that applies is
    divided. The unsplit square costs relative accuracy growing like x²/2 ulps (below
    1e-13 while Φ(-|x|) is a normal float64; Φ and φ underflow together)."""
    t = jnp.abs(x)
    # past 1e6 the Gaussian factor is 0 whatever erfcx is; the cap keeps s^6 u finite
    u = jnp.minimum(t * _INV_SQRT2, 1e6)
    s = u * u
    gauss = jnp.exp(-0.5 * t * t)
    small, tail = u <= _SMALL, u > _MEDIUM
    # Φ(-t) = N / D
    erf_p, erf_q = _poly(_ERF_P, s), _poly(_ERF_Q, s)
    tail_p, tail_q = _poly(_TAIL_P[::-1], s), s * _poly(_TAIL_Q[::-1], s)
    numerator = jnp.where(small, erf_q - u * erf_p,
                          gauss * jnp.where(tail, _INV_SQRT_PI * tail_q - tail_p,
                                            _poly(_MID_P, u)))
    denominator = jnp.where(small, erf_q, jnp.where(tail, tail_q * u, _poly(_MID_Q, u)))
    upper = 0.5 * numerator / denominator
    return jnp.where(x < 0, upper, 1.0 - upper), _INV_SQRT_2PI * gauss


def ndtr_derivative(x, value):
    """d/dx Φ(x) = φ(x) (``value`` unused), the square split as in ndtr."""
    return _gauss_pdf(x)


def _log_ndtr_parts(x):
    """(log Φ(x), erfcx(-x/√2) for x < 0) shared by log_ndtr and the Mills ratio."""
    neg = x < 0
    u = jnp.where(neg, -x * _INV_SQRT2, 0.0)
    ex = _erfcx_pos(u)
    left = -0.5 * x * x + jnp.log(ex) - _LN2
    right = jnp.log1p(-_ndtr_upper(jnp.where(neg, 0.0, x)))
    return jnp.where(neg, left, right), ex


def log_ndtr(x):
    """log Φ(x) without underflow for very negative x (−inf -> −inf, +inf -> 0)."""
    return _log_ndtr_parts(x)[0]


def log_ndtr_and_mills(x):
    """(log Φ(x), λ(x) = φ(x)/Φ(x)); the first output equals :func:`log_ndtr` bitwise.

    λ stays finite where Φ underflows: λ(x) ≈ -x for x -> -inf; (−inf -> +inf,
    +inf -> 0). In erfcx's tail (u = -x/√2 > 4) λ = √(2/π)/erfcx(u) = -x/(1 - √π c) with
    Cody's u erfcx(u) = 1/√π - c: erfcx(u) itself is subnormal (flushed to 0) below
    x = -3.6e307 in float64 and -6.7e37 in float32.
    """
    log_cdf, ex = _log_ndtr_parts(x)
    neg = x < 0
    xp = jnp.where(neg, 0.0, x)
    tail, _, correction = _erfcx_tail(jnp.where(neg, -x * _INV_SQRT2, 0.0))
    left = jnp.where(tail, -x / (1.0 - _SQRT_PI * correction), _SQRT_2_OVER_PI / ex)
    mills = jnp.where(neg, left, _gauss_pdf(xp) / (1.0 - _ndtr_upper(xp)))
    return log_cdf, mills


def _laplace_fraction(t, second, tail_start=False):
    """(q'(t), q''(t)) of λ(-t) = t + q(t), q from the Laplace continued fraction
    q_n = n / (t + q_{n+1}) evaluated bottom-up; q'' only when ``second``.

    ``tail_start`` starts from the root of q = N / (t + q) at N = terms + 1 (and its
    derivatives) instead of 0, which cuts the truncation error by 2-3 orders at t ~ 2.
    """
    if tail_start:
        n1 = _CF_TERMS + 1.0
        s = jnp.sqrt(t * t + 4.0 * n1)
        q = 2.0 * n1 / (t + s)  # (s - t) / 2 without cancellation; 0 at t = inf
        dq, d2q = -q / s, 2.0 * n1 / (s * s * s)
    else:
        q = dq = d2q = jnp.zeros_like(t)
    for n in range(_CF_TERMS, 0, -1):
        inv = 1.0 / (t + q)
        val = n * inv
        if second:  # d/dt of -n u'/u^2 with u = t + q_{n+1}
            d2q = val * inv * (2.0 * inv * (1.0 + dq) ** 2 - d2q)
        dq = -val * inv * (1.0 + dq)
        q = val
    return dq, d2q


def probit_curvature(x):
    """C(x) = -d² log Φ(x)/dx² = λ(x)(x + λ(x)), in (0, 1); (−inf -> 1, +inf -> 0).

    For x <= -3 the Laplace continued fraction avoids the cancellation in x + λ:
    with t = -x, λ = t + q(t) and C = 1 + q'(t), evaluated bottom-up.
    """
    far = x <= _CF_SWITCH
    dq, _ = _laplace_fraction(jnp.where(far, -x, 3.0), second=False)
    _, mills = log_ndtr_and_mills(jnp.where(far, 0.0, x))
    near = jnp.where(x == jnp.inf, 0.0, mills * (x + mills))
    return jnp.where(far, 1.0 + dq, near)


def probit_curvature_derivative(x, value):
    """C'(x) given ``value`` = C(x): λ(1 - C) - C(x + λ) near the centre.

    For x << 0 the two terms cancel (each about 1/|x|, C' about -2/|x|^3; 100-fold
    already at x = -2.5). Below a switch (-2.5 in float64, -1 in float32, where
    the fraction's truncation sits below the dtype's rounding) C' = -q''(t) from the
    continued fraction started at its tail root; 0 at ±inf.

    t is capped at √max/8, where C' ~ -2/t^3 has long underflowed (t > 1e108 in float64,
    1.4e15 in float32) and t^2 still fits: the tail root's s^3 overflowed beyond, and C''
    (differentiating this) was NaN down there and at -inf.
    """
    switch = -2.5 if x.dtype == jnp.float64 else -1.0
    cap = float(jnp.finfo(x.dtype).max) ** 0.5 / 8.0
    far = x <= switch
    t = jnp.where(far, jnp.minimum(-x, cap), 3.0)
    _, d2q = _laplace_fraction(t, second=True, tail_start=True)
    xn = jnp.where(far | (x == jnp.inf), 0.0, x)
    _, mills = log_ndtr_and_mills(xn)
    near = mills * (1.0 - value) - value * (xn + mills)
    return jnp.where(far, -d2q, jnp.where(x == jnp.inf, 0.0, near))
