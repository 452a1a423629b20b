"""Bernoulli marginal-slope (BMS) FLEX: from model parameters to row and joint derivatives.

Each row i has a latent score z ~ N(0, 1) observed at ``z_obs``, a binary response y,
a marginal probit index q (population success probability Φ(q)), a slope b and
shared spline coefficients β_h (score warp h) and β_w (link deviation w). The
conditional probit predictor is

    η(z; a, θ) = S_f [a + b z + b h(z) + w(a + b z)],

and the intercept a(θ) is fixed by the marginalisation constraint
``∫ Φ(η(z)) φ(z) dz = Φ(q)``. The row objective is ``ℓ_i = -w_i log Φ(s_i η(z_obs))``
(s = 2y - 1) in θ = (q, b, β_h, β_w) (r = 2 + p_h + p_w coordinates); its gradient
and Hessian include the implicit dependence of a on θ.

Pipeline (``specs/bms_flex.md``, after the Rust crate ``SauersML/gam``,
``families/bernoulli_marginal_slope.rs`` and its ``gpu/cubic_cell`` kernels):

* :func:`build_rows` (Stage 0, jnp, traceable): calibrates a, cuts the z-line into cells where η
  is a cubic, builds the coefficient jets and observed-point quantities, then runs
  Stage 1. Returns a :class:`BmsRows` pytree.
* :func:`cell_moments` (Stage 1): m_k = ∫ z^k exp(-(z² + η²)/2) dz per cell.
* :func:`row_derivatives` (Stage 2): neglog, g_i, H_i (bitwise symmetric) and a
  status per row.
* :func:`joint_hvp`, :func:`joint_diagonal`, :func:`joint_dense`,
  :func:`joint_gradient`, :class:`JointOperator`: operators of
  ``Σ_i J_iᵀ H_i J_i`` with J_i = blockdiag(x_iᵀ, g_iᵀ, I_{p_h}, I_{p_w}) for the
  joint coefficients [β_m | β_g | β_h | β_w] (p_total = p_m + p_g + p_h + p_w).

Status codes. Stage 1 per cell (:class:`CellStatus`): 0 ok, 1 invalid interval,
2 non-affine infinite interval, 3 non-finite coefficient, 4 non-finite evaluation
(all-zero moments). Stage 2 per row (:class:`RowStatus`): 0 ok, 1 F_a non-finite or
<= 0 (NaN outputs), 2 a non-finite output, 3 a cell of the row failed in Stage 1
(NaN outputs). A bad row never fails the batch.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, Int

from gpustat._backend import resolve_backend
from gpustat._checks import check_float64_enabled, is_int
from gpustat.bms._rows import BmsRows, flat_cubic_basis
from gpustat.bms._stage0 import basis_table, build_row_fields
from gpustat.pallas import bms as kernels
from gpustat.piecewise import PiecewisePolynomial
from gpustat.reference import bms as reference
from gpustat.reference.bms import CellStatus, RowStatus

__all__ = [
    "BmsRows",
    "CellStatus",
    "JointOperator",
    "RowDerivatives",
    "RowStatus",
    "build_rows",
    "cell_moments",
    "flat_cubic_basis",
    "joint_dense",
    "joint_diagonal",
    "joint_gradient",
    "joint_hvp",
    "row_derivatives",
]

MAX_ORDER = 24
# register tiles of the kernels: (rows, r, r) in Stage 2 and the joint operators
KERNEL_MAX_R = 64
KERNEL_MAX_DESIGN = 64


class RowDerivatives(NamedTuple):
    """Stage-2 output: neglog (n,), grad (n, r), hess (n, r, r), status (n,) int32."""

    neglog: Array
    grad: Array
    hess: Array
    status: Array


def _is_concrete(*arrays) -> bool:
    return not any(isinstance(a, jax.core.Tracer) for a in arrays)


def _float_array(name, x, ndim=None):
    """``x`` as an array (no copy of jax/numpy arrays); floating dtype and ``ndim`` checked."""
    check_float64_enabled(name, x)
    x = jnp.asarray(x) if not isinstance(x, jax.Array | np.ndarray) else x
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"{name} must be a floating array, got {name}.dtype={x.dtype}")
    if ndim is not None and x.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimension(s), got {name}.shape={x.shape}")
    return x


def _common_float(*arrays):
    """The arrays cast to their promoted floating dtype, at least float32, so that no input
    is down-cast (the kernels compute in one dtype) and 16-bit inputs compute in float32."""
    dtype = jnp.promote_types(jnp.result_type(*arrays), jnp.float32)
    return [a.astype(dtype) for a in arrays]


def _check_basis(name, basis, beta_name, beta):
    if basis is None:
        if beta is not None and np.size(beta) != 0:
            raise ValueError(f"{beta_name} must be empty when {name} is None, got "
                             f"{beta_name}.shape={np.shape(beta)}")
        return np.zeros(0)
    if not isinstance(basis, PiecewisePolynomial):
        raise TypeError(f"{name} must be a gpustat.PiecewisePolynomial or None, got "
                        f"{type(basis).__name__}")
    if basis.degree > 3:
        raise ValueError(f"{name} must have degree <= 3, got {name}.degree={basis.degree}")
    if len(basis.trailing_shape) != 1:
        raise ValueError(f"{name}.coeffs must have shape (D+1, P, p), got "
                         f"{name}.coeffs.shape={basis.coeffs.shape}")
    if basis.extrapolate != "clamp":
        raise ValueError(f"{name} must be constant beyond its breakpoints "
                         f"(extrapolate='clamp'), got {name}.extrapolate={basis.extrapolate!r}")
    beta = _float64(beta)
    if beta.shape != basis.trailing_shape:
        raise ValueError(f"{beta_name} must have shape {basis.trailing_shape} (one coefficient "
                         f"per basis function of {name}), got {beta_name}.shape={beta.shape}")
    if _is_concrete(beta) and not np.all(np.isfinite(beta)):
        raise ValueError(f"{beta_name} must be finite")
    return beta


def _float64(x):
    """x as float64: a numpy array when concrete, a jax array when traced."""
    return np.asarray(x, dtype=np.float64) if _is_concrete(x) else jnp.asarray(x, jnp.float64)


def _check_s_f(s_f):
    if _is_concrete(s_f):
        value = np.asarray(s_f, dtype=np.float64)
        if value.shape != () or not np.isfinite(value) or value <= 0:
            raise ValueError(f"s_f must be a finite scalar > 0, got {s_f=!r}")


def build_rows(q: Float[ArrayLike, " n"], b: Float[ArrayLike, " n"],
               beta_h: Float[ArrayLike, " p_h"] | None, beta_w: Float[ArrayLike, " p_w"] | None,
               score_basis: PiecewisePolynomial | None, link_basis: PiecewisePolynomial | None,
               z_obs: Float[ArrayLike, " n"],
               y: Float[ArrayLike, " n"], w: Float[ArrayLike, " n"], s_f: float = 1.0, *,
               order: int = reference.DEFAULT_ORDER, backend: str = "auto") -> BmsRows:
    """Stage 0 + Stage 1: the cells, jets and moments of n rows, traceable in the parameters.

    Stage 0 (:mod:`gpustat.bms._stage0`) is ``jax.numpy`` vmapped over rows: a
    ``lax.while_loop`` Newton calibration of the intercept per row, a fixed number of
    cell slots per row (k = #score knots + #link knots + 3; padding cells are [-1, 1]
    with η = 0 and zero jets, so they add exactly 0 in Stage 2) and the coefficient jets.
    It runs under ``jax.jit``, ``jax.grad`` and ``jax.jvp`` with traced q, b, beta_h,
    beta_w, z_obs, y, w and s_f (the implicit derivative of the intercept), so
    parameters -> :func:`row_derivatives` is one compiled function. The bases are model
    structure and must be concrete. Value checks (finiteness, y, w, s_f) run only on
    concrete inputs.

    Args:
        q: (n,) marginal probit index per row.
        b: (n,) slope per row (the coefficient of z, no exp).
        beta_h: (p_h,) score-warp coefficients, or None/empty with ``score_basis=None``.
        beta_w: (p_w,) link-deviation coefficients, or None/empty with ``link_basis=None``.
        score_basis: :class:`gpustat.PiecewisePolynomial`, coeffs (D+1, P, p_h), D <= 3,
            ``extrapolate="clamp"``, functions of z; or None (no score warp).
        link_basis: same, coeffs (D+1, P, p_w), functions of u = a + b z; or None.
        z_obs: (n,) observed latent score.
        y: (n,) response in {0, 1}.
        w: (n,) positive finite weights.
        s_f: probit frailty scale S_f = 1/sqrt(1 + σ²), finite and > 0.
        order: K, highest cell moment (>= 9 for :func:`row_derivatives`).
        backend: for Stage 1, see :func:`cell_moments`.

    Returns:
        :class:`BmsRows` with float64 jax arrays, n k cells (row i owns slots
        ``[k i, k (i + 1))``). A row whose calibration fails has a = NaN and NaN cell
        coefficients (Stage-1 status 3, Stage-2 row status 3). Bases must be C¹
        (including their constant continuation) for the Stage-2 derivatives to be exact;
        see :func:`flat_cubic_basis`.

    Raises:
        ValueError: shape mismatch, degree > 3, non-clamped basis, s_f <= 0, y not in
            {0, 1}, w <= 0, non-finite inputs.
        TypeError: a basis that is not a PiecewisePolynomial, or ``jax_enable_x64`` off
            (the rows are float64).
    """
    if not jax.config.jax_enable_x64:
        raise TypeError("build_rows returns float64 rows but jax_enable_x64 is off (JAX would "
                        "round them to float32): call jax.config.update('jax_enable_x64', True) "
                        "first")
    _check_s_f(s_f)
    beta_h = _check_basis("score_basis", score_basis, "beta_h", beta_h)
    beta_w = _check_basis("link_basis", link_basis, "beta_w", beta_w)
    arrays = _check_row_inputs(q=q, b=b, z_obs=z_obs, y=y, w=w)
    if not is_int(order) or not 9 <= order <= MAX_ORDER:
        raise ValueError(f"order must be an integer in [9, {MAX_ORDER}] for Stage 2, got "
                         f"{order=!r}")
    fields, _, _ = _device_fields(basis_table(score_basis), basis_table(link_basis), beta_h,
                                  beta_w, arrays["q"], arrays["b"], arrays["z_obs"],
                                  arrays["y"], arrays["w"], _float64(s_f))
    moments, status = cell_moments(fields["cell_lo"], fields["cell_hi"], fields["cell_c"],
                                   order=order, backend=backend)
    return BmsRows(**fields, cell_moments=moments, cell_status=status, p_h=beta_h.shape[0],
                   p_w=beta_w.shape[0])


_device_fields = jax.jit(build_row_fields)


def _check_row_inputs(**rows):
    """The (n,) row arrays as float64, shapes checked; values checked where concrete."""
    arrays = {name: _float64(v) for name, v in rows.items()}
    first, n = next(iter(arrays)), next(iter(arrays.values())).shape
    for name, v in arrays.items():
        if v.ndim != 1 or v.shape != n:
            raise ValueError(f"{name} must have shape (n,) = {n} like {first}, got "
                             f"{name}.shape={v.shape}")
        if _is_concrete(v) and not np.all(np.isfinite(v)):
            raise ValueError(f"{name} must be finite")
    if "y" in arrays and _is_concrete(arrays["y"]):
        if not np.all((arrays["y"] == 0) | (arrays["y"] == 1)):
            raise ValueError("y must hold only 0 and 1")
    if "w" in arrays and _is_concrete(arrays["w"]) and not np.all(arrays["w"] > 0):
        raise ValueError(f"w must be > 0, got min(w)={arrays['w'].min()!r}")
    return arrays


def cell_moments(lo: Float[ArrayLike, " c"], hi: Float[ArrayLike, " c"],
                 c: Float[ArrayLike, "c 4"], *, order: int = reference.DEFAULT_ORDER,
                 backend: str = "auto") -> tuple[Float[Array, "c K1"], Int[Array, " c"]]:
    """Stage 1: m_k = ∫_lo^hi z^k exp(-(z² + η(z)²)/2) dz, k = 0..K, per cell.

    Finite cells use the 384-point Gauss-Legendre rule; affine semi-infinite tails, and
    affine cells (normalised |k2|, |k3| <= 1e-10) reaching more than 32 standard
    deviations 1/sqrt(1 + C1²) each side of their midpoint, use the closed form with the
    integration-by-parts recurrence (which loses the high moments of narrower cells).
    The rule cannot resolve the Gaussian on a much wider finite cell: keep other finite
    cells within |z| <= 40 (as :func:`build_rows` does).

    Args:
        lo: (c,) lower bounds (``-inf`` allowed for affine tails).
        hi: (c,) upper bounds (``+inf`` allowed).
        c: (c, 4) cubic coefficients C0..C3 of η in ascending powers of z. float32 or
            float64 (16-bit computes in float32); lo, hi and c compute in their promoted
            dtype.
        order: K in [0, 24].
        backend: "auto" | "pallas" | "reference" | "interpret".

    Returns:
        (moments (c, K+1), status (c,) int32 :class:`CellStatus`); non-Ok cells are 0.
    """
    c = _float_array("c", c, 2)
    if c.shape[1] != 4:
        raise ValueError(f"c must have shape (c, 4), got {c.shape=}")
    lo = _float_array("lo", lo, 1)
    hi = _float_array("hi", hi, 1)
    if lo.shape != (c.shape[0],) or hi.shape != (c.shape[0],):
        raise ValueError(f"lo and hi must have shape ({c.shape[0]},) like c, got {lo.shape=}, "
                         f"{hi.shape=}")
    if not is_int(order) or not 0 <= order <= MAX_ORDER:
        raise ValueError(f"order must be an integer in [0, {MAX_ORDER}], got {order=!r}")
    order = int(order)
    lo, hi, c = _common_float(lo, hi, c)
    # "auto" runs the kernel: faster than XLA's fusion of the reference and equal to it to
    # float64 rounding, order 15 included (bench_bms: Stage 1 cell_moments).
    path = resolve_backend(backend, op="bms.cell_moments")
    if path == "reference":
        return reference.cell_moments(lo, hi, c, order=order)
    return kernels.cell_moments(lo, hi, c, order=order, interpret=path == "interpret")


def _check_rows(rows: BmsRows) -> None:
    if not isinstance(rows, BmsRows):
        raise TypeError(f"rows must be a BmsRows (see build_rows), got {type(rows).__name__}")
    n = rows.mu_1.shape[0]
    r = rows.rho.shape[1] if rows.rho.ndim == 2 else -1
    if r != 2 + rows.p_h + rows.p_w:
        raise ValueError(f"r must equal 2 + p_h + p_w = {2 + rows.p_h + rows.p_w}, got "
                         f"rows.rho.shape={rows.rho.shape}")
    n_cells = rows.cell_c.shape[0]
    expected = {
        "q": (n,), "b": (n,), "mu_2": (n,), "e_obs": (n,), "chi": (n,), "xi": (n,), "y": (n,),
        "w": (n,), "z_obs": (n,), "tau": (n, r), "r_uv": (n, r, r), "cell_offsets": (n + 1,),
        "cell_c": (n_cells, 4), "cell_jet": (n_cells, r, 4), "cell_jet_a": (n_cells, r, 4),
        "cell_jet_b": (n_cells, r - 1, 4), "cell_status": (n_cells,), "s_f": (),
    }
    for name, shape in expected.items():
        got = getattr(rows, name).shape
        if got != shape:
            raise ValueError(f"rows.{name} must have shape {shape}, got rows.{name}.shape={got}")
    for name in ("cell_offsets", "cell_status"):
        dtype = getattr(rows, name).dtype
        if not jnp.issubdtype(dtype, jnp.integer):
            raise TypeError(f"rows.{name} must be an integer array, got rows.{name}.dtype={dtype}")
    m = rows.cell_moments
    if m.ndim != 2 or m.shape[0] != n_cells or m.shape[1] < reference.STAGE2_ORDER + 1:
        raise ValueError(f"rows.cell_moments must have shape ({n_cells}, K+1) with K >= 9, got "
                         f"rows.cell_moments.shape={m.shape}")
    _check_s_f(rows.s_f)
    if _is_concrete(rows.cell_offsets):
        off = np.asarray(rows.cell_offsets)
        if off[0] != 0 or off[-1] != n_cells or np.any(np.diff(off) < 0):
            k = int(np.argmax(np.diff(off) < 0)) if np.any(np.diff(off) < 0) else 0
            raise ValueError(f"rows.cell_offsets must be non-decreasing from 0 to n_cells="
                             f"{n_cells}, got offsets[0]={off[0]}, offsets[-1]={off[-1]}, "
                             f"first decrease at index {k}")


def row_derivatives(rows: BmsRows, *, backend: str = "auto") -> RowDerivatives:
    """Stage 2: per-row negative log-likelihood, gradient and Hessian in θ = (q, b, β_h, β_w).

    Per cell c: T_n = κ Σ_e C_e m_{e+n}, D(R) = κ Σ_k R_k m_k,
    H(R, S, U) = D(U) - Σ_pq R_p S_q T_{p+q}; summed over the row's cells into F_a,
    F_aa, F_u, F_au, F_uv (q enters F only through -Φ(q)); then a_u = -F_u/F_a,
    a_uv = -(F_uv + F_au a_v + F_av a_u + F_aa a_u a_v)/F_a, the observed jets
    ē_u = χ a_u + ρ_u, ē_uv = χ a_uv + ξ a_u a_v + τ_u a_v + a_u τ_v + r_uv, and
    with m = s e_obs: neglog = -w log Φ(m), g = -w s λ(m) ē, H = w C(m) ē ēᵀ - w s λ(m) ē_uv
    (λ = φ/Φ, C = λ(m + λ)).

    Works under ``jax.jit`` and ``jax.vmap`` (rows is a pytree; offsets are checked
    only when concrete).

    Args:
        rows: :class:`BmsRows` (n rows, c cells, r = 2 + p_h + p_w), float32 or float64.
        backend: "auto" | "pallas" | "reference" | "interpret".

    Returns:
        :class:`RowDerivatives` (neglog (n,), grad (n, r), hess (n, r, r) bitwise
        symmetric, status (n,) int32 :class:`RowStatus`).
    """
    _check_rows(rows)
    r = rows.r
    path = resolve_backend(backend, op="bms.row_derivatives", kernel_supports=r <= KERNEL_MAX_R,
                           unsupported_reason=f"the kernel holds (r, r) tiles up to r = "
                                              f"{KERNEL_MAX_R}, got r={r}")
    c, moments, jet, jet_a, jet_b, *row_arrays = _common_float(
        rows.cell_c, rows.cell_moments[:, :reference.STAGE2_ORDER + 1], rows.cell_jet,
        rows.cell_jet_a, rows.cell_jet_b, rows.mu_1, rows.mu_2, rows.e_obs, rows.chi, rows.xi,
        rows.rho, rows.tau, rows.r_uv, rows.y, rows.w)
    args = (rows.cell_offsets, c, moments, rows.cell_status, jet, jet_a, jet_b, *row_arrays)
    if path == "reference":
        return RowDerivatives(*reference.row_derivatives(*args))
    return RowDerivatives(*kernels.row_derivatives(*args, interpret=path == "interpret"))


def _hessians(rows_or_hessians):
    hess = rows_or_hessians
    if isinstance(rows_or_hessians, RowDerivatives):
        hess = rows_or_hessians.hess
    return _float_array("hess", hess, 3)


def _check_design(hess, x, g):
    n, r, r2 = hess.shape
    if r != r2 or r < 2:
        raise ValueError(f"hess must have shape (n, r, r) with r >= 2, got {hess.shape=}")
    return _check_design_rows(n, r, x, g)


def _check_design_rows(n, r, x, g):
    x = _float_array("x", x, 2)
    g = _float_array("g", g, 2)
    if x.shape[0] != n or g.shape[0] != n:
        raise ValueError(f"x and g must have n={n} rows like hess, got {x.shape=}, {g.shape=}")
    if x.shape[1] < 1 or g.shape[1] < 1:
        raise ValueError(f"x and g need at least one column, got {x.shape=}, {g.shape=}")
    return x, g, x.shape[1] + g.shape[1] + r - 2


def _joint_path(op, backend, hess, x, g):
    r = hess.shape[1]
    fits = r <= KERNEL_MAX_R and max(x.shape[1], g.shape[1], x.shape[1] + g.shape[1]) \
        <= KERNEL_MAX_DESIGN
    return resolve_backend(backend, op=op, kernel_supports=fits,
                           unsupported_reason=f"kernel tiles hold r <= {KERNEL_MAX_R} and "
                                              f"p_m + p_g <= {KERNEL_MAX_DESIGN}, got r={r}, "
                                              f"{x.shape=}, {g.shape=}")


def joint_hvp(rows_or_hessians: RowDerivatives | Float[ArrayLike, "n r r"],
              x: Float[ArrayLike, "n p_m"], g: Float[ArrayLike, "n p_g"],
              v: Float[ArrayLike, "*R p_total"], *, backend: str = "auto") -> Array:
    """Joint Hessian-vector products ``Σ_i J_iᵀ H_i J_i v`` (one or several directions).

    Args:
        rows_or_hessians: :class:`RowDerivatives` or row Hessians (n, r, r).
        x: (n, p_m) marginal design; g: (n, p_g) slope design.
        v: (p_total,) or (R, p_total), p_total = p_m + p_g + r - 2. Up to 8 directions
            share one pass over the Hessians; more run in batches of 8.
        backend: "auto" | "pallas" | "reference" | "interpret".

    Returns:
        Array of v's shape: the data part of the joint Hessian times v (no penalty).
    """
    hess = _hessians(rows_or_hessians)
    x, g, p_total = _check_design(hess, x, g)
    v = _float_array("v", v)
    if v.ndim not in (1, 2) or v.shape[-1] != p_total:
        raise ValueError(f"v must have shape (p_total,) or (R, p_total) with p_total={p_total}, "
                         f"got {v.shape=}")
    hess, x, g, v = _common_float(hess, x, g, v)
    vm = v[None] if v.ndim == 1 else v
    path = _joint_path("bms.joint_hvp", backend, hess, x, g)
    if path == "reference":
        out = reference.joint_hvp(hess, x, g, vm)
    else:
        out = kernels.joint_hvp(hess, x, g, vm, interpret=path == "interpret")
    return out[0] if v.ndim == 1 else out


def _joint_reduction(op: str, rows_or_hessians, x, g, backend: str):
    """Validate and dispatch a joint reduction of the row Hessians (diagonal or dense)."""
    hess = _hessians(rows_or_hessians)
    x, g, _ = _check_design(hess, x, g)
    hess, x, g = _common_float(hess, x, g)
    path = _joint_path(f"bms.{op}", backend, hess, x, g)
    if path == "reference":
        return getattr(reference, op)(hess, x, g)
    return getattr(kernels, op)(hess, x, g, interpret=path == "interpret")


def joint_diagonal(rows_or_hessians: RowDerivatives | Float[ArrayLike, "n r r"],
                   x: Float[ArrayLike, "n p_m"], g: Float[ArrayLike, "n p_g"], *,
                   backend: str = "auto") -> Float[Array, " p_total"]:
    """Diagonal of ``Σ_i J_iᵀ H_i J_i`` (a Jacobi preconditioner), (p_total,).

    Args:
        rows_or_hessians: :class:`RowDerivatives` or row Hessians (n, r, r).
        x: (n, p_m) marginal design; g: (n, p_g) slope design.
        backend: "auto" | "pallas" | "reference" | "interpret".
    """
    return _joint_reduction("joint_diagonal", rows_or_hessians, x, g, backend)


def joint_dense(rows_or_hessians: RowDerivatives | Float[ArrayLike, "n r r"],
                x: Float[ArrayLike, "n p_m"], g: Float[ArrayLike, "n p_g"], *,
                backend: str = "auto") -> Float[Array, "p_total p_total"]:
    """The dense joint Hessian block ``Σ_i J_iᵀ H_i J_i``, (p_total, p_total).

    Args:
        rows_or_hessians: :class:`RowDerivatives` or row Hessians (n, r, r).
        x: (n, p_m) marginal design; g: (n, p_g) slope design.
        backend: "auto" | "pallas" | "reference" | "interpret".
    """
    return _joint_reduction("joint_dense", rows_or_hessians, x, g, backend)


def joint_gradient(derivs: RowDerivatives, x: Float[ArrayLike, "n p_m"],
                   g: Float[ArrayLike, "n p_g"], *, backend: str = "auto"
                   ) -> Float[Array, " 1+p_total"]:
    """Log-likelihood and score: ``[-Σ_i neglog_i, -Σ_i J_iᵀ g_i]``, (1 + p_total,).

    One fused XLA reduction on every backend (a single pass over n (r + 1) values; no
    kernel beats it), so ``backend`` only validates the name.

    Args:
        derivs: :class:`RowDerivatives` (neglog (n,), grad (n, r)).
        x: (n, p_m) marginal design; g: (n, p_g) slope design.
        backend: "auto" | "pallas" | "reference" | "interpret".
    """
    if not isinstance(derivs, RowDerivatives):
        raise TypeError(f"derivs must be RowDerivatives, got {type(derivs).__name__}")
    grad = _float_array("derivs.grad", derivs.grad, 2)
    if grad.shape[1] < 2 or derivs.neglog.shape != grad.shape[:1]:
        raise ValueError(f"derivs must hold neglog (n,) and grad (n, r >= 2), got "
                         f"{derivs.neglog.shape=}, {grad.shape=}")
    x, g, _ = _check_design_rows(grad.shape[0], grad.shape[1], x, g)
    resolve_backend(backend, op="bms.joint_gradient")
    return reference.joint_gradient(*_common_float(derivs.neglog, grad, x, g))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class JointOperator:
    """The joint Hessian ``Σ_i J_iᵀ H_i J_i`` with its row Hessians resident on the device.

    Build once per Newton step; every :meth:`hvp` call streams the cached (n, r, r)
    Hessians (the matrix-free CG loop calls it thousands of times) without
    recomputing Stage 2. A pytree: pass it through ``jax.jit`` to fuse the HVP into a
    solver loop.

    Attributes:
        hess: (n, r, r) row Hessians; x: (n, p_m); g: (n, p_g).
        backend: static backend name for every operator call.
    """

    hess: Array
    x: Array
    g: Array
    backend: str = dataclasses.field(default="auto", metadata={"static": True})

    @classmethod
    def from_rows(cls, rows_or_hessians: RowDerivatives | Float[ArrayLike, "n r r"],
                  x: Float[ArrayLike, "n p_m"], g: Float[ArrayLike, "n p_g"], *,
                  backend: str = "auto") -> JointOperator:
        """Validate and place the row Hessians (n, r, r) and designs (n, p_m), (n, p_g)
        on the device."""
        hess = _hessians(rows_or_hessians)
        x, g, _ = _check_design(hess, x, g)
        return cls(jax.device_put(hess), jax.device_put(x), jax.device_put(g), backend)

    @property
    def p_total(self) -> int:
        """Joint coefficient count p_m + p_g + r - 2."""
        return self.x.shape[1] + self.g.shape[1] + self.hess.shape[1] - 2

    def hvp(self, v: Float[ArrayLike, "*R p_total"]) -> Array:
        """``Σ_i J_iᵀ H_i J_i v`` for v (p_total,) or (R, p_total)."""
        return joint_hvp(self.hess, self.x, self.g, v, backend=self.backend)

    def diagonal(self) -> Float[Array, " p_total"]:
        """Diagonal of the joint Hessian."""
        return joint_diagonal(self.hess, self.x, self.g, backend=self.backend)

    def dense(self) -> Float[Array, "p_total p_total"]:
        """The dense joint Hessian."""
        return joint_dense(self.hess, self.x, self.g, backend=self.backend)

