"""Piecewise polynomials (PwPA): the object, evaluation, derivatives, converters.

A :class:`PiecewisePolynomial` has scipy ``PPoly`` semantics: breakpoints
``x_0 < ... < x_P`` and coefficients ``c`` of shape (D+1, P, *t), highest power
first, in the local coordinate u = x - x_i of piece i::

    p(x) = sum_{k=0}^{D} c[k, i] * u ** (D - k)
    i = clip(searchsorted(breakpoints, x, "right") - 1, 0, P-1)

Trailing axes ``t`` hold several polynomials on shared breakpoints (a spline
basis is one such object). Evaluation dispatches to a Pallas kernel on CUDA
GPUs (O(1) index for uniform breakpoints, branch-free Eytzinger search
otherwise) and to the pure ``jax.numpy`` reference elsewhere.

Reference: M. Sangiorgi, "CUDAification of PACE: optimization of PwPA
kernels", University of Bologna (2025); torchPACE v1.0.0. Semantics follow
``scipy.interpolate.PPoly``.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from gpustat._backend import mosaic_unavailable_reason, piecewise_shape_class, resolve_backend
from gpustat._checks import as_array, is_int
from gpustat.reference import piecewise as ref

__all__ = [
    "EXTRAPOLATE_MODES",
    "PiecewisePolynomial",
    "aos_to_soa",
    "ppoly_eval",
    "soa_to_aos",
]

EXTRAPOLATE_MODES = ref.EXTRAPOLATE_MODES

# Breakpoints within this fraction of a piece width of the uniform grid take the
# O(1) index path (its one-step correction makes the result exact up to h/2 off).
_UNIFORM_SLACK = 0.25


# float16/bfloat16 x with at least this many points is evaluated through a table of the
# polynomial at all 65,536 16-bit values (see _dispatch): the lookup reads 2 bytes a point.
_TABLE_LOOKUP_MIN_POINTS = 1 << 22


def _is_concrete(*arrays) -> bool:
    return not any(isinstance(a, jax.core.Tracer) for a in arrays)


# scipy's ``extrapolate`` values and their names here
_SCIPY_EXTRAPOLATE = {True: "extend", False: "nan", None: "extend", "periodic": "periodic"}


def _check_extrapolate(extrapolate) -> str:
    """A mode of :data:`EXTRAPOLATE_MODES`; scipy's True / False / None are accepted."""
    if isinstance(extrapolate, bool) or extrapolate is None:
        return _SCIPY_EXTRAPOLATE[extrapolate]
    if extrapolate not in EXTRAPOLATE_MODES:
        raise ValueError(f"extrapolate must be one of {EXTRAPOLATE_MODES} (or scipy's True, "
                         f"False, None), got {extrapolate=!r}")
    return extrapolate


class _FrozenArray:
    """A concrete numpy array as hashable pytree aux data (by dtype, shape and bytes)."""

    def __init__(self, array: np.ndarray):
        self.array = np.array(array)
        self.array.setflags(write=False)
        self._key = (self.array.dtype.str, self.array.shape, self.array.tobytes())

    def __hash__(self) -> int:
        return hash(self._key)

    def __eq__(self, other) -> bool:
        return isinstance(other, _FrozenArray) and self._key == other._key


def _detect_uniform(breakpoints: np.ndarray) -> bool:
    num_pieces = breakpoints.shape[0] - 1
    h = (breakpoints[-1] - breakpoints[0]) / num_pieces
    grid = breakpoints[0] + h * np.arange(num_pieces + 1)
    return bool(np.max(np.abs(breakpoints - grid)) <= _UNIFORM_SLACK * h)


@jax.tree_util.register_pytree_node_class
class PiecewisePolynomial:
    """A piecewise polynomial with scipy ``PPoly`` semantics, usable inside ``jax.jit``.

    A pytree: the leaves are ``breakpoints`` and ``coeffs`` (so it passes through
    ``jit``/``vmap``/``grad``); ``extrapolate`` and the uniform-grid flag are
    static. Gradients flow to ``coeffs`` (learnable activations) and to the
    evaluation points, never to the breakpoints. With ``static_breakpoints=True``
    the breakpoints are not a leaf at all but static data (hashed by value): inside a
    model (equinox, flax) an optimizer's weight decay or update then cannot move them,
    and ``coeffs`` is the only leaf.

    The argument order is (breakpoints, coeffs), the reverse of scipy's ``PPoly(c, x)``;
    :meth:`from_scipy` and :meth:`to_scipy` convert.

    Args:
        breakpoints: (P+1,) strictly increasing, finite floats.
        coeffs: (D+1, P, *t) floats, highest power first, local coordinate
            x - breakpoints[i]; breakpoints are stored in ``coeffs``' dtype.
        extrapolate: "extend" (end pieces continue), "nan" (NaN outside
            [x_0, x_P]), "clamp" (evaluate at clip(x, x_0, x_P)) or "periodic";
            scipy's True (or None) and False mean "extend" and "nan".
        static_breakpoints: hold the (concrete) breakpoints as static pytree data.

    Raises:
        ValueError: wrong ranks or sizes, fewer than two breakpoints, unknown
            ``extrapolate``; for concrete breakpoints also non-finite, unsorted or
            duplicate values (checks on values are skipped for tracers).
        TypeError: non-floating ``coeffs`` or ``breakpoints``; traced breakpoints
            with ``static_breakpoints=True``.

    Example:
        >>> import jax.numpy as jnp
        >>> from gpustat.piecewise import PiecewisePolynomial
        >>> pp = PiecewisePolynomial(jnp.array([0.0, 1.0, 2.0]), jnp.array([[1.0, -1.0],
        ...                                                                 [0.0, 1.0]]))
        >>> [float(v) for v in pp(jnp.array([0.5, 1.5]))]
        [0.5, 0.5]
    """

    def __init__(self, breakpoints: Float[ArrayLike, " P1"], coeffs: Float[ArrayLike, "D1 P *t"],
                 extrapolate: str | bool | None = "extend", *, static_breakpoints: bool = False):
        extrapolate = _check_extrapolate(extrapolate)
        coeffs = as_array(coeffs, "coeffs")
        breakpoints = as_array(breakpoints, "breakpoints")
        for name, arr in (("coeffs", coeffs), ("breakpoints", breakpoints)):
            if not jnp.issubdtype(arr.dtype, jnp.floating):
                raise TypeError(f"{name} must be a floating array, got {name}.dtype={arr.dtype}")
        if breakpoints.ndim != 1 or breakpoints.shape[0] < 2:
            raise ValueError(f"breakpoints must have shape (P+1,) with P >= 1, got "
                             f"{breakpoints.shape=}")
        if (coeffs.ndim < 2 or coeffs.shape[0] < 1
                or coeffs.shape[1] != breakpoints.shape[0] - 1):
            raise ValueError(f"coeffs must have shape (D+1, P, *t) with D >= 0 and P = "
                             f"len(breakpoints) - 1 = {breakpoints.shape[0] - 1}, got "
                             f"{coeffs.shape=}")
        breakpoints = breakpoints.astype(coeffs.dtype)
        uniform = False
        if _is_concrete(breakpoints):
            bp = np.asarray(breakpoints, dtype=np.float64)
            if not np.all(np.isfinite(bp)):
                raise ValueError(f"breakpoints must be finite (in {coeffs.dtype}), got "
                                 f"{int(np.sum(~np.isfinite(bp)))} non-finite value(s) in "
                                 f"{breakpoints.shape=}")
            steps = np.diff(bp)
            if np.any(steps <= 0):
                k = int(np.argmax(steps <= 0))
                raise ValueError(
                    f"breakpoints must be strictly increasing (in {coeffs.dtype}), got "
                    f"breakpoints[{k}]={bp[k]!r} >= breakpoints[{k + 1}]={bp[k + 1]!r}")
            uniform = _detect_uniform(bp)
        elif static_breakpoints:
            raise TypeError("static_breakpoints=True needs concrete breakpoints, got a tracer: "
                            "build the object outside jit, or keep the breakpoints a leaf")
        frozen = _FrozenArray(np.asarray(breakpoints)) if static_breakpoints else None
        self._set_fields(breakpoints, coeffs, extrapolate, uniform, frozen)

    def _set_fields(self, breakpoints, coeffs, extrapolate, uniform, frozen) -> None:
        for name, value in (("breakpoints", breakpoints), ("coeffs", coeffs),
                            ("extrapolate", extrapolate), ("uniform", uniform),
                            ("_frozen_breakpoints", frozen)):
            object.__setattr__(self, name, value)

    @property
    def static_breakpoints(self) -> bool:
        """Whether the breakpoints are static pytree data rather than a leaf."""
        return self._frozen_breakpoints is not None

    def __setattr__(self, name, value):
        # Immutable, as a pytree should be: evaluation caches kernel tables per object,
        # which a reassigned ``coeffs`` would leave stale.
        raise AttributeError(f"PiecewisePolynomial is immutable (cannot set {name!r}): build a "
                             "new one, e.g. PiecewisePolynomial(pp.breakpoints, new_coeffs, "
                             "pp.extrapolate), or map over it with jax.tree.map")

    # -- pytree -------------------------------------------------------------------
    def tree_flatten(self):
        aux = (self.extrapolate, self.uniform, self._frozen_breakpoints)
        if self.static_breakpoints:
            return (self.coeffs,), aux
        return (self.breakpoints, self.coeffs), aux

    @classmethod
    def tree_unflatten(cls, aux, children):
        extrapolate, uniform, frozen = aux
        obj = object.__new__(cls)
        if frozen is not None:
            (coeffs,) = children
            breakpoints = jnp.asarray(frozen.array)
        else:
            breakpoints, coeffs = children
        obj._set_fields(breakpoints, coeffs, extrapolate, uniform, frozen)
        return obj

    def _replace(self, coeffs, extrapolate=None) -> PiecewisePolynomial:
        obj = object.__new__(type(self))
        obj._set_fields(self.breakpoints, coeffs, extrapolate or self.extrapolate, self.uniform,
                        self._frozen_breakpoints)
        return obj

    # -- shape ----------------------------------------------------------------------
    @property
    def degree(self) -> int:
        """Polynomial degree D (``coeffs.shape[0] - 1``)."""
        return self.coeffs.shape[0] - 1

    @property
    def num_pieces(self) -> int:
        """Number of pieces P."""
        return self.coeffs.shape[1]

    @property
    def trailing_shape(self) -> tuple[int, ...]:
        """Shape t of the trailing axes (several polynomials on shared breakpoints)."""
        return tuple(self.coeffs.shape[2:])

    @property
    def dtype(self):
        """Dtype of the coefficients and breakpoints."""
        return self.coeffs.dtype

    def __repr__(self) -> str:
        return (f"PiecewisePolynomial(pieces={self.num_pieces}, degree={self.degree}, "
                f"trailing={self.trailing_shape}, dtype={self.dtype}, "
                f"extrapolate={self.extrapolate!r}, uniform={self.uniform}"
                f"{', static_breakpoints=True' if self.static_breakpoints else ''})")

    # -- calculus ----------------------------------------------------------------------
    def __call__(self, x: ArrayLike, nu: int = 0, *, backend: str = "auto") -> Array:
        """Evaluate at ``x`` (any shape); see :func:`ppoly_eval`."""
        return ppoly_eval(self, x, nu=nu, backend=backend)

    def derivative(self, nu: int = 1) -> PiecewisePolynomial:
        """The nu-th derivative (nu >= 0) as a new object of degree max(D - nu, 0).

        Under "clamp" (nu >= 1) it is the derivative of the clamped function, 0 outside
        [x_0, x_P]: an "extend" object with a zero piece on each side (P + 2 pieces; x_P
        itself stays in the last inner piece, as in ``pp(x, nu)``).
        """
        _check_order(nu, "nu")
        coeffs = _derivative_jit(self.coeffs, nu)
        if self.extrapolate != "clamp" or nu == 0:
            return self._replace(coeffs)
        zeros = jnp.zeros_like(coeffs[:, :1])
        return _with_end_pieces(self.breakpoints, coeffs, zeros, zeros, right_after_end=True)

    def antiderivative(self, nu: int = 1) -> PiecewisePolynomial:
        """The nu-th antiderivative, zero at x_0 and continuous (scipy's convention).

        As in scipy, a periodic polynomial's antiderivative is not periodic: its
        ``extrapolate`` becomes "nan". Under "clamp" it is the antiderivative of the
        clamped function (constant outside [x_0, x_P]), whose outer parts are polynomials
        of degree nu: an "extend" object with one such piece on each side (P + 2 pieces).
        """
        _check_order(nu, "nu")
        mode = "nan" if self.extrapolate == "periodic" and nu > 0 else self.extrapolate
        coeffs = _antiderivative_jit(self.breakpoints, self.coeffs, nu)
        if self.extrapolate != "clamp" or nu == 0:
            return self._replace(coeffs, mode)
        # Outside, every derivative above order nu vanishes: the outer pieces are the
        # end pieces' Taylor expansions at x_0 and x_P cut after degree nu.
        keep = (jnp.arange(coeffs.shape[0]) >= coeffs.shape[0] - 1 - nu).reshape(
            (-1,) + (1,) * (coeffs.ndim - 1))
        bp = self.breakpoints
        last_width = (bp[-1] - bp[-2]).astype(coeffs.dtype)
        left = jnp.where(keep, coeffs[:, :1], 0)
        right = jnp.where(keep, _taylor_shift(coeffs[:, -1:], last_width), 0)
        return _with_end_pieces(bp, coeffs, left, right, right_after_end=False)

    def integrate(self, a: ArrayLike, b: ArrayLike) -> Array:
        """Definite integral over [a, b] with scipy ``PPoly.integrate`` semantics.

        Args:
            a, b: scalar bounds (arrays broadcast); b < a flips the sign.

        Returns:
            (*t,) in ``self.dtype``: NaN under "nan" when a bound is outside
            [x_0, x_P]; "clamp" integrates the clamped function.

        Raises:
            TypeError: complex ``a`` or ``b``.
        """
        for name, bound in (("a", a), ("b", b)):
            if jnp.iscomplexobj(bound):
                raise TypeError(f"{name} must be real, got {name}.dtype={jnp.asarray(bound).dtype}")
        return _integrate_jit(self.breakpoints, self.coeffs, a, b, extrapolate=self.extrapolate)

    def solve(self, y: float = 0.0, discontinuity: bool = True,
              extrapolate: str | bool | None = None) -> np.ndarray:
        """Real x with p(x) = y, with scipy ``PPoly.solve`` semantics (float64, on the host).

        Args:
            y: the level.
            discontinuity: also report sign changes across a jump at a breakpoint.
            extrapolate: whether roots outside [x_0, x_P] count (scipy's True / False /
                "periodic", or a mode name); default: the object's mode. Under "clamp"
                the function is constant outside, so only roots inside are reported.

        Returns:
            A float64 array of the roots in increasing order; for trailing axes ``t`` an
            object array of shape ``t`` holding one such array per polynomial. An
            interval where p is identically ``y`` is reported as its left end followed
            by NaN, as scipy does.
        """
        mode = self.extrapolate if extrapolate is None else _check_extrapolate(extrapolate)
        scipy_mode = {"extend": True, "nan": False, "clamp": False, "periodic": "periodic"}[mode]
        return self._replace(self.coeffs, "nan").to_scipy().solve(
            float(y), discontinuity=discontinuity, extrapolate=scipy_mode)

    def roots(self, discontinuity: bool = True,
              extrapolate: str | bool | None = None) -> np.ndarray:
        """Real zeros: :meth:`solve` at y = 0 (scipy ``PPoly.roots``)."""
        return self.solve(0.0, discontinuity=discontinuity, extrapolate=extrapolate)

    # -- converters ---------------------------------------------------------------------
    @classmethod
    def from_scipy(cls, ppoly, dtype=None) -> PiecewisePolynomial:
        """From a scipy piecewise polynomial (extrapolate True -> "extend", False -> "nan").

        Accepts ``PPoly`` and its subclasses (``CubicSpline``, ``PchipInterpolator``,
        ``Akima1DInterpolator``, ``CubicHermiteSpline``), ``BPoly`` (converted to the power
        basis) and ``BSpline`` (through ``PPoly.from_spline``; its zero-width pieces at
        repeated knots are dropped, which changes no value). Decreasing breakpoints are
        reversed, each piece re-expanded at its new left end (float64). At an inner
        breakpoint itself a decreasing scipy object takes the piece below it, this one
        (increasing, pieces closed on the left) the piece above: the two differ there
        only where the function jumps.

        Args:
            ppoly: the scipy object.
            dtype: the result's dtype (default float64).

        Example:
            >>> import numpy as np
            >>> from scipy.interpolate import CubicSpline
            >>> from gpustat.piecewise import PiecewisePolynomial
            >>> spline = CubicSpline(np.linspace(0, 1, 5), np.sin(np.linspace(0, 1, 5)))
            >>> pp = PiecewisePolynomial.from_scipy(spline)
            >>> bool(np.allclose(pp.to_scipy()(0.3), spline(0.3)))
            True
        """
        from scipy.interpolate import BPoly, BSpline, PPoly

        if isinstance(ppoly, BPoly):
            ppoly = PPoly.from_bernstein_basis(ppoly)
        elif isinstance(ppoly, BSpline):
            ppoly = PPoly.from_spline(ppoly, extrapolate=ppoly.extrapolate)
        if not isinstance(ppoly, PPoly):
            raise TypeError(f"ppoly must be a scipy.interpolate.PPoly (or subclass), BPoly or "
                            f"BSpline, got {type(ppoly).__name__}")
        mode = _SCIPY_EXTRAPOLATE[ppoly.extrapolate]
        x, c = np.asarray(ppoly.x, np.float64), _real_float64(ppoly.c, "ppoly.c")
        if x.size > 1 and x[-1] < x[0]:
            shifts = (x[1:] - x[:-1]).reshape((-1,) + (1,) * (c.ndim - 2))
            c, x = _taylor_shift(c, shifts)[:, ::-1], x[::-1]
        wide = np.diff(x) > 0
        if x.size > 1 and not np.all(wide):  # zero-width pieces (repeated knots) hold no point
            c, x = c[:, wide], np.concatenate([x[:-1][wide], x[1:][wide][-1:]])
        coeffs = np.asarray(c, dtype=dtype or np.float64)
        return cls(np.asarray(x, dtype=coeffs.dtype), coeffs, extrapolate=mode)

    def to_scipy(self):
        """As a float64 ``scipy.interpolate.PPoly`` ("clamp" has no scipy twin: ValueError)."""
        from scipy.interpolate import PPoly

        if self.extrapolate == "clamp":
            raise ValueError("extrapolate='clamp' has no scipy.interpolate.PPoly equivalent")
        mode = {"extend": True, "nan": False, "periodic": "periodic"}[self.extrapolate]
        return PPoly(np.asarray(self.coeffs, np.float64), np.asarray(self.breakpoints, np.float64),
                     extrapolate=mode)

    @classmethod
    def from_torchpace(cls, coeffs: ArrayLike, partition_points: ArrayLike, aos: bool = True,
                       extrapolate: str = "extend", dtype=None) -> PiecewisePolynomial:
        """From torchPACE's ``pwpa`` arguments (global-coordinate coefficients).

        torchPACE evaluates each piece's polynomial at the global x; this shifts
        every piece to its local coordinate exactly (Taylor shift in float64).
        torchPACE sends x >= partition_points[P] to piece 0; here the last piece
        continues (or follows ``extrapolate``).

        Args:
            coeffs: (P, D+1) when ``aos`` else (D+1, P), highest power first.
            partition_points: (P+1,) strictly increasing.
            aos: layout of ``coeffs``.
            dtype: result dtype (default: ``coeffs``' floating dtype).
        """
        global_coeffs = _real_float64(coeffs, "coeffs")
        if global_coeffs.ndim != 2:
            raise ValueError(f"coeffs must be 2-D, got {global_coeffs.shape=}")
        soa = aos_to_soa(global_coeffs) if aos else global_coeffs
        points = _real_float64(partition_points, "partition_points")
        if points.shape != (soa.shape[1] + 1,):
            raise ValueError(f"partition_points must have shape (P+1,) = ({soa.shape[1] + 1},), "
                             f"got {points.shape=}")
        local = _taylor_shift(soa, points[:-1])
        given = np.asarray(coeffs).dtype
        return cls(points, local.astype(_result_dtype(dtype, given)), extrapolate=extrapolate)

    def to_torchpace(self, aos: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """(coeffs, partition_points) in torchPACE's global-coordinate layout (float64).

        Only for objects without trailing axes. Global coefficients lose accuracy
        far from the origin; the local form held here does not.
        """
        if self.trailing_shape:
            raise ValueError(f"to_torchpace needs coeffs (D+1, P), got {self.coeffs.shape=}")
        points = np.asarray(self.breakpoints, np.float64)
        global_coeffs = _taylor_shift(np.asarray(self.coeffs, np.float64), -points[:-1])
        return (soa_to_aos(global_coeffs) if aos else global_coeffs), points


def _real_float64(value, name: str) -> np.ndarray:
    """``value`` as a float64 numpy array; complex input is a TypeError, not a silent cast."""
    array = np.asarray(value)
    if np.iscomplexobj(array):
        raise TypeError(f"{name} must be real, got {name}.dtype={array.dtype}")
    return array.astype(np.float64)


def _result_dtype(requested, given) -> np.dtype:
    """The converters' result dtype: ``requested``, else ``given`` when floating, in JAX's
    default precision (float32 without ``jax_enable_x64``); an explicit float64 without x64
    is an error rather than a silent float32."""
    if requested is not None:
        requested = np.dtype(requested)
        if requested == np.float64 and not jax.config.jax_enable_x64:
            raise ValueError("dtype=float64 needs jax.config.update('jax_enable_x64', True)")
        return requested
    floating = jnp.issubdtype(given, jnp.floating)
    return np.dtype(jax.dtypes.canonicalize_dtype(given if floating else np.float64))


def _check_order(nu, name: str) -> None:
    if not is_int(nu) or nu < 0:
        raise ValueError(f"{name} must be a non-negative int, got {name}={nu!r}")


def _taylor_shift(coeffs, shifts):
    """Coefficients of q_i(u) = p_i(u + s_i), both highest power first: (D+1, P, *t) numpy
    (float64 on the host) or jax arrays; ``shifts`` broadcasts against one row (P, *t).

    q's coefficient of u^j is p^(j)(s_i) / j!: repeated synthetic division.
    """
    rows = list(coeffs)
    degree = len(rows) - 1
    for stop in range(degree, 0, -1):
        for k in range(1, stop + 1):
            rows[k] = rows[k] + rows[k - 1] * shifts
    return np.stack(rows) if isinstance(coeffs, np.ndarray) else jnp.stack(rows)


def _with_end_pieces(breakpoints, coeffs, left, right, *, right_after_end: bool):
    """An "extend" object with ``left`` on [x_0 - L, x_0) and ``right`` from x_P (or from
    the next float after x_P), L = x_P - x_0: the clamped calculus objects."""
    span = breakpoints[-1] - breakpoints[0]
    start = breakpoints[-1]
    if right_after_end:
        start = jnp.nextafter(start, jnp.asarray(jnp.inf, start.dtype))
    outer_bp = jnp.concatenate([breakpoints[:1] - span, breakpoints[:-1],
                                jnp.stack([start, start + span])])
    # the left piece is expanded at x_0: move its origin to x_0 - L
    left = _taylor_shift(left, -span.astype(coeffs.dtype))
    return PiecewisePolynomial(outer_bp, jnp.concatenate([left, coeffs, right], axis=1),
                               extrapolate="extend")


def aos_to_soa(coeffs: ArrayLike) -> Array:
    """torchPACE's array-of-structures (P, D+1) layout to (D+1, P)."""
    coeffs = jnp.asarray(coeffs) if not isinstance(coeffs, np.ndarray) else coeffs
    if coeffs.ndim != 2:
        raise ValueError(f"coeffs must have shape (P, D+1), got {coeffs.shape=}")
    return coeffs.T


def soa_to_aos(coeffs: ArrayLike) -> Array:
    """(D+1, P) structure-of-arrays layout to torchPACE's (P, D+1)."""
    coeffs = jnp.asarray(coeffs) if not isinstance(coeffs, np.ndarray) else coeffs
    if coeffs.ndim != 2:
        raise ValueError(f"coeffs must have shape (D+1, P), got {coeffs.shape=}")
    return coeffs.T


def _compute_dtype(x_dtype, coeff_dtype):
    """float64 x -> float64, other floats -> float32, non-floats -> the coefficients' dtype."""
    if jnp.issubdtype(x_dtype, jnp.floating):
        return jnp.dtype(jnp.float64) if x_dtype == jnp.float64 else jnp.dtype(jnp.float32)
    return jnp.dtype(coeff_dtype)


def ppoly_eval(pp: PiecewisePolynomial, x: Float[ArrayLike, " *s"], *, nu: int = 0,
               backend: str = "auto") -> Float[Array, " *s_and_t"]:
    """Evaluate a piecewise polynomial (or its nu-th derivative) at every x.

    Args:
        pp: the piecewise polynomial; coefficients (D+1, P, *t).
        x: evaluation points, any shape. float64 computes in float64; float32,
            float16 and bfloat16 compute in float32 (coefficients are cast to the
            compute dtype); integer and bool x compute in ``pp.dtype``.
        nu: derivative order >= 0 (use ``pp.antiderivative`` for integrals).
        backend: "auto" (on a CUDA GPU the kernel that ``gpustat._backend.AUTO_RULES``
            names for the call's class, the reference elsewhere), "pallas", "triton",
            "mosaic" (sm_90+: float32 compute, one polynomial, x.size a multiple of
            128, no periodic extrapolation), "interpret" or "reference".

    Returns:
        (*x.shape, *t): x's dtype for floating x, else ``pp.dtype``. NaN x gives
        NaN; x = +-inf gives the polynomial's limit under "extend", the end
        values under "clamp" (and 0 for nu >= 1: the clamped function is flat
        outside [x_0, x_P]), NaN under "nan" and "periodic".

    Raises:
        TypeError: ``pp`` is not a :class:`PiecewisePolynomial` or x is complex.
        ValueError: negative ``nu`` or an unknown ``backend``.

    Differentiable (``jax.grad``/``jax.jvp``) in x (through the derivative piece)
    and in ``pp.coeffs``; breakpoints are constants.
    """
    if not isinstance(pp, PiecewisePolynomial):
        raise TypeError(f"pp must be a PiecewisePolynomial, got {type(pp).__name__}")
    _check_order(nu, "nu")
    x = as_array(x, "x")
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        raise TypeError(f"x must be real, got {x.dtype=}")
    cdt = _compute_dtype(x.dtype, pp.dtype)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        x = x.astype(cdt)
    shape_class = piecewise_shape_class(pp.uniform, x.dtype, x.size, pp.coeffs.ndim == 2)
    unsupported = (_mosaic_unsupported(pp, x, cdt)
                   if backend in ("auto", "mosaic") and not mosaic_unavailable_reason() else None)
    path = resolve_backend(backend, op="ppoly_eval", capability="piecewise",
                           shape_class=shape_class, kernels=("pallas", "triton", "mosaic"),
                           unsupported=unsupported)
    if _is_concrete(pp.breakpoints, pp.coeffs):
        # A constant polynomial (also one closed over inside jit): derive its
        # operands now, so the kernel tables are built once on the host.
        with jax.ensure_compile_time_eval():
            breakpoints = pp.breakpoints.astype(cdt)
            coeffs = _derivative_jit(pp.coeffs.astype(cdt), nu)
    else:
        breakpoints = pp.breakpoints.astype(cdt)
        coeffs = ref.derivative_coeffs(pp.coeffs.astype(cdt), nu)
    if 0 in pp.trailing_shape:  # no polynomials to evaluate
        return jnp.zeros(x.shape + pp.trailing_shape, x.dtype)
    tables = None if path == "reference" else _cached_tables(pp, breakpoints, coeffs, nu, path)
    if (tables is not None and _looks_up_16bit(x) and _is_concrete(breakpoints, coeffs)
            and not jax.config.jax_disable_jit):  # (no ahead-of-time compile without jit)
        tables = tables._replace(values16=_cached_values16(pp, breakpoints, coeffs, tables, nu,
                                                           x.dtype, path))
    # x keeps its own dtype (a bfloat16 stream is read as bfloat16 by the kernel).
    y = _evaluate_jit(breakpoints, coeffs, x, tables, (pp.extrapolate, pp.uniform, path))
    if pp.extrapolate == "clamp" and nu > 0:  # p(clip(x)) is flat outside [x_0, x_P]
        outside = (x < breakpoints[0]) | (x > breakpoints[-1])
        y = jnp.where(outside.reshape(outside.shape + (1,) * len(pp.trailing_shape)), 0, y)
    return y


def _mosaic_unsupported(pp, x, cdt) -> dict[str, str]:
    """{"mosaic": why the Mosaic GPU kernel cannot evaluate this call}, or {}."""
    from gpustat.pallas._mosaic_piecewise import supports

    points = 1 << 16 if _looks_up_16bit(x) else x.size  # 16-bit x: its value table
    reason = supports(cdt, pp.trailing_shape, pp.coeffs.shape[1], points, pp.extrapolate)
    return {"mosaic": reason} if reason else {}


class _KernelTables(NamedTuple):
    """What the kernels read besides x (a pytree: arrays or None)."""

    keys: Array  # kernel_tables
    rows: Array
    params: Array
    guide: tuple | None  # guide_tables (concrete breakpoints only)
    sides: Array | None  # side_rows (guided float32 tables of one polynomial)
    values16: Array | None = None  # the polynomial at every 16-bit x (_cached_values16)
    packed: Array | None = None  # the Mosaic GPU kernel's table (pack_tables)


def _looks_up_16bit(x) -> bool:
    """Whether _dispatch evaluates x through its table of all 65,536 16-bit values."""
    return jnp.dtype(x.dtype).itemsize == 2 and x.size >= _TABLE_LOOKUP_MIN_POINTS


def _cached_values16(pp, breakpoints, coeffs, tables, nu, dtype, path):
    """The (concrete) polynomial at all 65,536 values of the 16-bit ``dtype``, evaluated
    by the kernel once and kept: each later call is then the lookup alone, one launch,
    not the evaluation and the lookup.

    The first call runs the kernel even when it is only traced (``jax.jit``,
    ``jax.eval_shape``): a compiled executable's call is never staged.
    """
    cache = pp.__dict__.setdefault("_value_tables", {})
    key = (nu, jnp.dtype(dtype).name, path)
    if key not in cache:
        args = (breakpoints, coeffs, _every_value(dtype), tables)
        # compiled and run now, also inside a caller's trace: a Compiled call is never
        # staged (and interpret-mode kernels have no eager evaluation rules)
        evaluate = _kernel_eval_jit.lower(*args, pp.extrapolate, pp.uniform, path).compile()
        cache[key] = evaluate(*args)
    return cache[key]


def _every_value(dtype) -> np.ndarray:
    """All 65,536 values of a 16-bit floating dtype, in bit order."""
    return np.arange(1 << 16, dtype=np.uint16).view(jnp.dtype(dtype))


def _cached_tables(pp, breakpoints, coeffs, nu, path):
    """Kernel tables and, for the Triton and Mosaic GPU kernels, the guide of their
    bucketed lookup (None unless the breakpoints are concrete) and for one float32
    polynomial its side rows (or None), packed into one array for the Mosaic GPU
    kernel; for a concrete polynomial built once on the host."""
    guided = path in ("triton", "mosaic")
    if not _is_concrete(breakpoints, coeffs):
        return _tables(breakpoints, coeffs, pp.uniform, guided and _is_concrete(breakpoints),
                       path == "mosaic")
    cache = pp.__dict__.setdefault("_kernel_tables", {})
    key = (nu, coeffs.dtype.name, guided, path == "mosaic")
    if key not in cache:
        cache[key] = _tables(np.asarray(breakpoints), np.asarray(coeffs), pp.uniform, guided,
                             path == "mosaic")
    return cache[key]


def _tables(breakpoints, coeffs, uniform: bool, guided: bool, packed: bool = False):
    """The :class:`_KernelTables` of ``_cached_tables`` (no 16-bit values; ``guided``:
    with the guide and side rows; ``packed``: with the Mosaic GPU kernel's table)."""
    from gpustat.reference.piecewise import guide_tables, kernel_tables, side_rows

    keys, rows, params = kernel_tables(breakpoints, coeffs, uniform)
    guide = guide_tables(np.asarray(breakpoints)) if guided else None
    # float32 (one polynomial) takes the knot-free lookup; float64 keeps its knots
    sides = (side_rows(guide[2], rows, coeffs.shape[0] - 1)
             if guide is not None and rows.ndim == 2 and rows.dtype == np.float32 else None)
    table = None
    if packed:
        from gpustat.pallas._mosaic_piecewise import pack_tables

        table = pack_tables(keys, rows, params, guide, sides)
    return _KernelTables(keys, rows, params, guide, sides, packed=table)


def _dispatch(breakpoints, coeffs, x, tables, config):
    extrapolate, uniform, path = config
    if path == "reference":
        return ref.ppoly_eval_reference(breakpoints, coeffs, x, extrapolate=extrapolate,
                                        uniform=uniform).astype(x.dtype)
    if _looks_up_16bit(x):
        # A 16-bit x takes at most 65,536 values: the kernel evaluates every one of
        # them once (or once per concrete polynomial, _cached_values16) and each point
        # looks its value up (elementwise: the same results).
        values = None if tables is None else tables.values16
        if values is None:
            values = _kernel_eval(breakpoints, coeffs, _every_value(x.dtype), tables,
                                  extrapolate, uniform, path)
        bits = jax.lax.bitcast_convert_type(x, jnp.uint16).astype(jnp.int32)
        return values.at[bits].get(mode="promise_in_bounds")
    return _kernel_eval(breakpoints, coeffs, x, tables, extrapolate, uniform, path)


def _kernel_eval(breakpoints, coeffs, x, tables, extrapolate, uniform, path):
    """The Pallas, interpreted, Triton or Mosaic GPU kernel at every x."""
    from gpustat.pallas.piecewise import ppoly_eval_tables
    from gpustat.reference.piecewise import kernel_tables

    if tables is None:
        tables = _KernelTables(*kernel_tables(breakpoints, coeffs, uniform), None, None)
    keys, rows, params, guide, sides, _, packed = tables
    trailing = coeffs.shape[2:]
    if path == "mosaic":  # float32, one polynomial (_mosaic_unsupported)
        from gpustat.pallas._mosaic_piecewise import pack_tables, ppoly_eval_mosaic

        if packed is None:
            packed = pack_tables(keys, rows, params, guide, sides)
        kind = "guided" if sides is not None else "uniform" if uniform else "search"
        y = ppoly_eval_mosaic(packed, x.reshape(-1).astype(jnp.float32), lookup_kind=kind,
                              num_pieces=coeffs.shape[1], degree=coeffs.shape[0] - 1,
                              buckets=guide[0].shape[0] if sides is not None else 0,
                              extrapolate=extrapolate)
        return y.astype(x.dtype).reshape(x.shape)
    if path == "triton":  # one launch; trailing polynomials share each point's search
        from gpustat.triton.piecewise import ppoly_eval_triton

        y = ppoly_eval_triton(keys, rows, params, x.reshape(-1), num_pieces=coeffs.shape[1],
                              degree=coeffs.shape[0] - 1, extrapolate=extrapolate, uniform=uniform,
                              guide=guide, side_rows=sides)
        return y.reshape(x.shape + trailing)
    kernel = functools.partial(ppoly_eval_tables, keys, params=params, x=x.reshape(-1),
                               num_pieces=coeffs.shape[1], degree=coeffs.shape[0] - 1,
                               extrapolate=extrapolate, uniform=uniform,
                               interpret=path == "interpret")
    if not trailing:
        return kernel(rows=rows).reshape(x.shape)
    # Several polynomials on shared breakpoints: vmap over the trailing entries
    # (rows (T, P, W)) adds them to the kernel's grid.
    flat_rows = rows.reshape((-1, *rows.shape[-2:]))
    y = jax.vmap(lambda r: kernel(rows=r), out_axes=1)(flat_rows)
    return y.reshape(x.shape + trailing)


@functools.partial(jax.custom_jvp, nondiff_argnums=(4,))
def _evaluate(breakpoints, coeffs, x, tables, config):
    return _dispatch(breakpoints, coeffs, x, tables, config)


@_evaluate.defjvp
def _evaluate_jvp(config, primals, tangents):
    breakpoints, coeffs, x, tables = primals
    _, coeffs_dot, x_dot, _ = tangents
    extrapolate, uniform, _ = config
    y = _evaluate(breakpoints, coeffs, x, tables, config)
    slope = _evaluate(breakpoints, ref.derivative_coeffs(coeffs, 1), x, None, config)
    if extrapolate == "clamp":  # clip(x) is flat outside [x_0, x_P]
        inside = (x >= breakpoints[0]) & (x <= breakpoints[-1])
        slope = jnp.where(inside.reshape(inside.shape + (1,) * (coeffs.ndim - 2)), slope, 0.0)
    trailing = (1,) * (coeffs.ndim - 2)
    # The coefficient tangent is linear in coeffs_dot: the reference gather keeps
    # it transposable for reverse mode.
    y_dot = ref.ppoly_eval_reference(breakpoints, coeffs_dot, x, extrapolate=extrapolate,
                                     uniform=uniform, skip_leading_zeros=False)
    y_dot = y_dot + slope * x_dot.reshape(x_dot.shape + trailing)
    return y, y_dot.astype(y.dtype)


# One executable per shape and setting for eager calls (instead of op-by-op dispatch).
_evaluate_jit = jax.jit(_evaluate, static_argnums=(4,))
_kernel_eval_jit = jax.jit(_kernel_eval, static_argnums=(4, 5, 6))
_derivative_jit = jax.jit(ref.derivative_coeffs, static_argnums=1)
_antiderivative_jit = jax.jit(ref.antiderivative_coeffs, static_argnums=2)
_integrate_jit = jax.jit(ref.integrate_reference, static_argnames=("extrapolate",))
