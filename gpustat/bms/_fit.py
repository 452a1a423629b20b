"""BMS FLEX fitting: damped Newton with preconditioned conjugate gradients, in one jitted loop.

Minimises over the joint coefficients β = [β_m (p_m) | β_g (p_g) | β_h (p_h) | β_w (p_w)]

    f(β) = Σ_i ℓ_i(θ_i) + ½ βᵀ S β,     θ_i = (x_iᵀ β_m, g_iᵀ β_g, β_h, β_w),

with ℓ_i the row negative log-likelihood of :mod:`gpustat.bms` and S an optional
penalty. Each Newton iteration, inside one ``lax.while_loop``:

1. Stage 0 (:mod:`gpustat.bms._stage0`) at the intercepts the line search calibrated
   at β (before the first step, a calibration from the rigid start), Stage 1 and
   Stage 2 at β give f, the gradient
   ∇f = Σ_i J_iᵀ g_i + S β and the row Hessians of the :class:`gpustat.bms.JointOperator`.
2. Converged when ``max_j |∇f_j| <= gtol · max(1, |f|)``.
3. The direction d solves ``(Σ_i J_iᵀ H_i J_i + S) d = -∇f`` by conjugate gradients
   preconditioned with the inverse diagonal (:func:`gpustat.bms.joint_diagonal` plus
   diag S), to the relative residual ``min(0.5, sqrt(max_j |∇f_j| / max(1, |f|)))``
   (an inexact Newton forcing term: superlinear convergence). On negative curvature CG
   stops with its last iterate, or with the preconditioned gradient step when that
   happens at once; either is a descent direction (truncated Newton, Steihaug).
4. Backtracking line search: the step length halves (at most ``MAX_HALVINGS`` times)
   until Armijo's condition ``f(β + t d) <= f(β) + 1e-4 t ∇fᵀd + 1e-13 |f(β)|`` holds
   (the last term: rounding of f, which sums n rows' values); the trial values
   need only the intercepts and the observed predictors, not the cells. The trial's
   calibration starts at ``a + t da``, da the intercepts' first-order change along d
   (∂a/∂θ from the Stage-1 moments, :func:`_intercept_gradient`). A trial with a failed
   row is rejected.

Reference: J. Nocedal and S. J. Wright, *Numerical Optimization* (2nd ed., 2006),
chapter 7.1 (line-search Newton-CG).
"""

from __future__ import annotations

import enum
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from gpustat.bms import _ops as _bms
from gpustat.bms._stage0 import (
    CalibrationStatus,
    basis_table,
    calibrate_intercepts,
    fields_at_intercepts,
    observed_neglog,
)
from gpustat.piecewise import PiecewisePolynomial
from gpustat.reference.bms import KAPPA

__all__ = ["FitResult", "FitStatus", "fit"]

ARMIJO = 1e-4
# f sums n rows' values, and a trial's intercepts come from a calibration of their own:
# changes of f below this fraction of |f| are rounding, which Armijo's test allows (else
# a step near the optimum fails on rounding and the fit stops short of gtol)
ROUNDING_SLACK = 1e-13
MAX_HALVINGS = 30
_RUNNING = -1


class FitStatus(enum.IntEnum):
    """Outcome of :func:`fit`."""

    CONVERGED = 0
    MAX_ITERATIONS = 1
    LINE_SEARCH_FAILED = 2     # no step length lowered f enough
    ROW_FAILURE = 3            # a row's calibration or derivatives failed at the iterate


class FitResult(NamedTuple):
    """Report of :func:`fit` (jax scalars; ``beta`` (p_total,)).

    Attributes:
        beta: the last iterate, (p_total,).
        objective: f at ``beta``.
        gradient_norm: max_j |∂f/∂β_j| at ``beta``.
        iterations: Newton iterations taken (steps).
        cg_iterations: conjugate-gradient iterations (joint HVPs) over all steps.
        status: int32 :class:`FitStatus`.
    """

    beta: Array
    objective: Array
    gradient_norm: Array
    iterations: Array
    cg_iterations: Array
    status: Array


def _split(beta, p_m, p_g, p_h):
    return (beta[:p_m], beta[p_m:p_m + p_g], beta[p_m + p_g:p_m + p_g + p_h],
            beta[p_m + p_g + p_h:])


def _intercept_gradient(fields, moments):
    """∂a/∂θ (n, r) of each row, θ = (q, b, β_h, β_w), from its cells' Stage-1 moments:
    ``-F_u / F_a`` with ``F_u = κ Σ_cells E_u · m[:4]`` and ``F_q = -φ(q)``, the first
    derivatives Stage 2 forms (:func:`gpustat.reference.bms.finalize_row`). ``fields`` are
    Stage 0's, whose rows hold their cells at a fixed stride; ``moments`` (cells, K + 1)."""
    n, r = fields["mu_1"].shape[0], fields["cell_jet"].shape[1]
    jet = fields["cell_jet"].reshape(n, -1, r, 4)
    first = KAPPA * jnp.einsum("nkrc,nkc->nr", jet, moments[:, :4].reshape(n, -1, 4))
    return -first.at[:, 0].set(-fields["mu_1"]) / first[:, :1]


def _pcg(matvec, precond, rhs, tol, max_cg):
    """Preconditioned CG from 0 on ``matvec(d) = rhs``, stopping at ‖r‖ <= tol ‖rhs‖, at
    max_cg iterations, or on negative curvature. Returns (d, iterations)."""
    z0 = precond * rhs
    stop = tol * jnp.linalg.norm(rhs)

    def cond(state):
        _, r, _, _, k, done = state
        return ~done & (k < max_cg) & (jnp.linalg.norm(r) > stop)

    def body(state):
        d, r, p, rz, k, _ = state
        ap = matvec(p)
        curvature = p @ ap
        negative = ~(curvature > 0)
        alpha = rz / jnp.where(negative, 1.0, curvature)
        d_new = d + alpha * p
        r_new = r - alpha * ap
        z = precond * r_new
        rz_new = r_new @ z
        p_new = z + (rz_new / rz) * p
        # negative curvature: keep the last iterate (the preconditioned gradient at k = 0)
        d_out = jnp.where(negative, jnp.where(k == 0, z0, d), d_new)
        keep = lambda new, old: jnp.where(negative, old, new)   # noqa: E731
        return (d_out, keep(r_new, r), keep(p_new, p), keep(rz_new, rz), k + 1, negative)

    init = (jnp.zeros_like(rhs), rhs, z0, rhs @ z0, jnp.int32(0), jnp.bool_(False))
    d, _, _, _, k, _ = jax.lax.while_loop(cond, body, init)
    return d, k


@functools.partial(jax.jit, static_argnames=("order", "backend"))
def _fit_loop(score, link, x, g, z_obs, y, w, s_f, beta0, penalty, gtol, max_iterations,
              max_cg, *, order, backend):
    p_m, p_g = x.shape[1], g.shape[1]
    p_h = 0 if score is None else score[2].shape[1]

    def penalty_term(beta):
        return 0.5 * beta @ (penalty @ beta)

    def derivatives(beta, a):
        """The rows' derivatives at beta, whose calibrated intercepts are a (a failed
        row's NaN fails its cells in Stage 1 and the row in Stage 2)."""
        bm, bg, bh, bw = _split(beta, p_m, p_g, p_h)
        fields, _ = fields_at_intercepts(score, link, bh, bw, a, x @ bm, g @ bg, z_obs, y, w,
                                         s_f)
        moments, status = _bms.cell_moments(fields["cell_lo"], fields["cell_hi"],
                                            fields["cell_c"], order=order, backend=backend)
        rows = _bms.BmsRows(**fields, cell_moments=moments, cell_status=status, p_h=p_h,
                            p_w=beta.shape[0] - p_m - p_g - p_h)
        return _bms.row_derivatives(rows, backend=backend), _intercept_gradient(fields, moments)

    def objective(beta, a_start):
        """f at beta and the intercepts calibrated there from a_start (at an accepted
        point, the intercepts of the next iterate's rows)."""
        bm, bg, bh, bw = _split(beta, p_m, p_g, p_h)
        b = g @ bg
        a, status, _ = calibrate_intercepts(score, link, bh, bw, x @ bm, b, s_f,
                                            a_start=a_start)
        value = jnp.sum(observed_neglog(score, link, bh, bw, a, b, z_obs, y, w, s_f))
        value = value + penalty_term(beta)
        ok = jnp.all(status == CalibrationStatus.OK) & jnp.isfinite(value)
        return jnp.where(ok, value, jnp.inf), a

    def newton_step(beta, a, f, grad, gnorm, derivs, a_grad):
        op = _bms.JointOperator(derivs.hess, x, g, backend)
        diag = op.diagonal() + jnp.diagonal(penalty)
        precond = jnp.where(diag > 0, 1.0 / jnp.where(diag > 0, diag, 1.0),
                            1.0 / jnp.maximum(jnp.max(diag), 1.0))
        forcing = jnp.minimum(0.5, jnp.sqrt(gnorm / jnp.maximum(1.0, jnp.abs(f))))
        d, cg_its = _pcg(lambda v: op.hvp(v) + penalty @ v, precond, -grad, forcing, max_cg)
        slope = grad @ d
        # the trial at beta + t d starts its calibration at a + t da, da the intercepts'
        # first-order change along d
        dm, dg, dh, dw = _split(d, p_m, p_g, p_h)
        da = (a_grad[:, 0] * (x @ dm) + a_grad[:, 1] * (g @ dg)
              + a_grad[:, 2:] @ jnp.concatenate([dh, dw]))

        def sufficient(t, value):
            return value <= f + ARMIJO * t * slope + ROUNDING_SLACK * jnp.abs(f)

        def search_cond(state):
            t, value, _, k = state
            return ~sufficient(t, value) & (k < MAX_HALVINGS)

        def search_body(state):
            t, _, _, k = state
            t = 0.5 * t
            return (t, *objective(beta + t * d, a + t * da), k + 1)

        t, value, a_trial, _ = jax.lax.while_loop(
            search_cond, search_body,
            (jnp.asarray(1.0, beta.dtype), *objective(beta + d, a + da), jnp.int32(0)))
        accepted = sufficient(t, value) & (slope < 0)
        return (jnp.where(accepted, beta + t * d, beta), jnp.where(accepted, a_trial, a),
                accepted, cg_its)

    def body(state):
        beta, a, it, cg_total, _, _, _, _ = state
        derivs, a_grad = derivatives(beta, a)
        f = jnp.sum(derivs.neglog) + penalty_term(beta)
        grad = -_bms.joint_gradient(derivs, x, g)[1:] + penalty @ beta
        gnorm = jnp.max(jnp.abs(grad))
        rows_ok = jnp.all(derivs.status == 0) & jnp.isfinite(f)
        converged = rows_ok & (gnorm <= gtol * jnp.maximum(1.0, jnp.abs(f)))
        stepping = rows_ok & ~converged & (it < max_iterations)
        new_beta, new_a, accepted, cg_its = jax.lax.cond(
            stepping, newton_step,
            lambda *_: (beta, a, jnp.bool_(False), jnp.int32(0)), beta, a, f, grad, gnorm,
            derivs, a_grad)
        status = jnp.select([~rows_ok, converged, it >= max_iterations, ~accepted],
                            [FitStatus.ROW_FAILURE, FitStatus.CONVERGED,
                             FitStatus.MAX_ITERATIONS, FitStatus.LINE_SEARCH_FAILED], _RUNNING)
        done = status != _RUNNING
        return (new_beta, new_a, it + accepted.astype(jnp.int32), cg_total + cg_its,
                status.astype(jnp.int32), f, gnorm, done)

    def cond(state):
        return ~state[-1]

    nan = jnp.asarray(jnp.nan, beta0.dtype)
    # the intercepts at beta0 from the rigid start; after a step, those the line search
    # calibrated at the accepted point (a rejected step keeps beta and its intercepts)
    bm, bg, bh, bw = _split(beta0, p_m, p_g, p_h)
    a0, _, _ = calibrate_intercepts(score, link, bh, bw, x @ bm, g @ bg, s_f)
    init = (beta0, a0, jnp.int32(0), jnp.int32(0), jnp.int32(_RUNNING), nan, nan,
            jnp.bool_(False))
    beta, _, it, cg_total, status, f, gnorm, _ = jax.lax.while_loop(cond, body, init)
    return FitResult(beta, f, gnorm, it, cg_total, status)


def _zeros_for(basis):
    """Placeholder coefficients of a basis' shape (None when it is not a basis)."""
    return np.zeros(basis.trailing_shape) if isinstance(basis, PiecewisePolynomial) else None


def fit(x: Float[ArrayLike, "n p_m"], g: Float[ArrayLike, "n p_g"],
        score_basis: PiecewisePolynomial | None, link_basis: PiecewisePolynomial | None,
        z_obs: Float[ArrayLike, " n"], y: Float[ArrayLike, " n"], w: Float[ArrayLike, " n"],
        s_f: float = 1.0, *, beta0: Float[ArrayLike, " p_total"] | None = None,
        penalty: Float[ArrayLike, "p_total p_total"] | None = None,
        max_iterations: int = 50, gtol: float = 1e-9, max_cg: int | None = None,
        order: int = 9, backend: str = "auto") -> FitResult:
    """Fit the joint BMS FLEX coefficients by damped Newton-CG (one compiled loop).

    Args:
        x: (n, p_m) marginal design (q = x β_m); g: (n, p_g) slope design (b = g β_g).
        score_basis, link_basis: bases as in :func:`gpustat.bms.build_rows` (or None),
            p_h and p_w functions.
        z_obs, y, w: (n,) observed score, response in {0, 1}, positive weights.
        s_f: probit frailty scale S_f, finite and > 0.
        beta0: (p_total,) start, p_total = p_m + p_g + p_h + p_w; default β_g's first
            entry 1 (a unit slope when g's first column is an intercept), all else 0.
        penalty: (p_total, p_total) symmetric positive semi-definite S, or None (0).
        max_iterations: most Newton steps.
        gtol: convergence when max_j |∂f/∂β_j| <= gtol · max(1, |f|).
        max_cg: most CG iterations per step (default 2 p_total).
        order: Stage-1 moment order K (>= 9).
        backend: "auto" | "pallas" | "reference" | "interpret" for the row and joint ops.

    Returns:
        :class:`FitResult`. Status ROW_FAILURE keeps the iterate at which a row failed
        (its calibration or derivatives non-finite); LINE_SEARCH_FAILED the last iterate.

    Raises:
        ValueError: shapes, non-finite or out-of-range values, a bad backend name.
        TypeError: ``jax_enable_x64`` off, a basis that is not a PiecewisePolynomial.
    """
    if not jax.config.jax_enable_x64:
        raise TypeError("fit computes in float64 but jax_enable_x64 is off: call "
                        "jax.config.update('jax_enable_x64', True) first")
    _bms._check_s_f(s_f)
    p_h, p_w = (_bms._check_basis(name, basis, beta_name, _zeros_for(basis)).shape[0]
                for name, basis, beta_name in (("score_basis", score_basis, "beta_h"),
                                               ("link_basis", link_basis, "beta_w")))
    rows = _bms._check_row_inputs(z_obs=z_obs, y=y, w=w)
    n = rows["z_obs"].shape[0]
    x = _bms._float64(x)
    g = _bms._float64(g)
    if x.ndim != 2 or g.ndim != 2 or x.shape[0] != n or g.shape[0] != n:
        raise ValueError(f"x and g must have shape (n, p) with n={n} rows like z_obs, got "
                         f"{x.shape=}, {g.shape=}")
    if x.shape[1] < 1 or g.shape[1] < 1:
        raise ValueError(f"x and g need at least one column, got {x.shape=}, {g.shape=}")
    for name, v in (("x", x), ("g", g)):
        if not np.all(np.isfinite(v)):
            raise ValueError(f"{name} must be finite")
    p_total = x.shape[1] + g.shape[1] + p_h + p_w
    if beta0 is None:
        beta0 = np.zeros(p_total)
        beta0[x.shape[1]] = 1.0
    beta0 = _bms._float64(beta0)
    if beta0.shape != (p_total,) or not np.all(np.isfinite(beta0)):
        raise ValueError(f"beta0 must be finite with shape (p_total,) = ({p_total},), got "
                         f"{beta0.shape=}")
    penalty = np.zeros((p_total, p_total)) if penalty is None else _bms._float64(penalty)
    if penalty.shape != (p_total, p_total) or not np.all(np.isfinite(penalty)):
        raise ValueError(f"penalty must be finite with shape ({p_total}, {p_total}), got "
                         f"{penalty.shape=}")
    for name, v in (("max_iterations", max_iterations), ("max_cg", max_cg)):
        if v is not None and (not _bms.is_int(v) or v < 1):
            raise ValueError(f"{name} must be a positive integer, got {name}={v!r}")
    if not (np.isscalar(gtol) and np.isfinite(gtol) and gtol > 0):
        raise ValueError(f"gtol must be a finite scalar > 0, got {gtol=!r}")
    if not _bms.is_int(order) or not 9 <= order <= _bms.MAX_ORDER:
        raise ValueError(f"order must be an integer in [9, {_bms.MAX_ORDER}], got {order=!r}")
    _bms.resolve_backend(backend, op="bms.fit")
    return _fit_loop(basis_table(score_basis), basis_table(link_basis), x, g, rows["z_obs"],
                     rows["y"], rows["w"], _bms._float64(s_f), beta0, penalty, float(gtol),
                     np.int32(max_iterations), np.int32(2 * p_total if max_cg is None else max_cg),
                     order=int(order), backend=backend)
