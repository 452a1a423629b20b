"""Checking analytic derivatives against autodiff and finite differences.

For users who write gradient/Hessian code (and for gpustat's own tests): give
:func:`check_derivatives` an objective ``f(x) -> scalar`` and an analytic
function returning ``(value, gradient)`` or ``(value, gradient, hessian)``; it
compares them with ``jax.grad``/``jax.hessian`` of the objective and with
central finite differences, using tolerances that depend on the dtype, and
returns a :class:`DerivativeReport` that prints the worst entries.

Example:
    >>> import jax.numpy as jnp
    >>> f = lambda x: jnp.sum(jnp.sin(x) ** 2)
    >>> analytic = lambda x: (f(x), jnp.sin(2 * x), jnp.diag(2 * jnp.cos(2 * x)))
    >>> check_derivatives(analytic, f, jnp.array([0.1, 0.7])).ok
    True
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

__all__ = ["Comparison", "DerivativeReport", "check_derivatives", "default_tolerances"]


def default_tolerances(dtype) -> dict[str, float]:
    """Relative tolerances by dtype.

    ``autodiff``: analytic vs ``jax.grad``/``jax.hessian`` (same arithmetic, so only
    rounding differs); ``fd``: vs central differences with step ``eps^(1/3)``,
    whose truncation and rounding errors are both about ``eps^(2/3)``.
    """
    if jnp.dtype(dtype) == jnp.float64:
        return {"autodiff": 1e-9, "fd": 1e-5}
    return {"autodiff": 1e-4, "fd": 3e-2}


@dataclasses.dataclass(frozen=True)
class Comparison:
    """One comparison: ``what`` (e.g. "gradient vs jax.grad") and its worst entries."""

    what: str
    max_error: float
    tolerance: float
    worst: list[tuple[tuple[int, ...], float, float]]

    @property
    def ok(self) -> bool:
        return bool(self.max_error <= self.tolerance)

    def __str__(self) -> str:
        head = f"{'ok  ' if self.ok else 'FAIL'} {self.what}: max error {self.max_error:.3e} "
        head += f"(tolerance {self.tolerance:.1e})"
        rows = [f"    at {idx}: analytic {a:.17g}  expected {e:.17g}" for idx, a, e in self.worst]
        return "\n".join([head, *rows])


@dataclasses.dataclass(frozen=True)
class DerivativeReport:
    """All comparisons of one :func:`check_derivatives` call."""

    comparisons: list[Comparison]

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.comparisons)

    def __str__(self) -> str:
        return "\n".join(str(c) for c in self.comparisons)

    def assert_ok(self) -> None:
        """Raise ``AssertionError`` with the readable report unless every comparison passed."""
        if not self.ok:
            raise AssertionError("derivative check failed\n" + str(self))


def _compare(what: str, analytic, expected, tolerance: float, scale: float,
             show: int) -> Comparison:
    """Error of each entry relative to max(|expected entry|, scale); NaN on either side
    fails, even on both: a NaN checks nothing."""
    a = np.asarray(analytic, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    if a.shape != e.shape:
        raise ValueError(f"{what}: analytic shape {a.shape} != expected shape {e.shape}")
    err = np.abs(a - e) / np.maximum(np.abs(e), scale)
    err = np.where(np.isnan(err), np.inf, err)
    order = np.argsort(-err, axis=None)[:show]
    worst = [(tuple(int(i) for i in np.unravel_index(k, err.shape)), float(a.flat[k]),
              float(e.flat[k])) for k in order]
    return Comparison(what, float(err.max()) if err.size else 0.0, tolerance, worst)


def _central_gradient(f: Callable, x: jax.Array, step: float) -> jax.Array:
    """Central differences of a scalar function, one coordinate at a time."""
    flat = x.reshape(-1)
    eye = jnp.eye(flat.size, dtype=x.dtype)
    h = step * jnp.maximum(1.0, jnp.abs(flat))

    def partial(i):
        up = f((flat + h[i] * eye[i]).reshape(x.shape))
        down = f((flat - h[i] * eye[i]).reshape(x.shape))
        return (up - down) / (2 * h[i])

    return jax.vmap(partial)(jnp.arange(flat.size)).reshape(x.shape)


def check_derivatives(
    analytic: Callable,
    objective: Callable,
    x: Float[Array, "*shape"],
    *,
    finite_differences: bool = True,
    rtol: float | None = None,
    fd_rtol: float | None = None,
    show: int = 3,
) -> DerivativeReport:
    """Compare an analytic value/gradient(/Hessian) with autodiff and finite differences.

    Args:
        analytic: ``x -> (value, grad)`` or ``x -> (value, grad, hess)`` with ``grad``
            of ``x``'s shape and ``hess`` of shape ``x.shape + x.shape``.
        objective: ``x -> scalar``, written independently of ``analytic``.
        x: the point, float32 or float64 (tolerances follow its dtype).
        finite_differences: also compare with central differences of ``objective``
            (gradient) and of ``jax.grad(objective)`` (Hessian).
        rtol: tolerance against autodiff (default :func:`default_tolerances`).
        fd_rtol: tolerance against finite differences (default likewise).
        show: how many worst entries each comparison lists.

    Returns:
        A :class:`DerivativeReport`; ``report.ok``, ``print(report)``, ``report.assert_ok()``.
        Errors are relative to ``max(|expected|, max|expected|·1e-3)``, so entries far
        below the largest one are judged in absolute terms; a NaN entry fails even where
        the expected entry is NaN too.
    """
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"check_derivatives: x must be floating point, got {x.dtype=}")
    tols = default_tolerances(x.dtype)
    rtol = tols["autodiff"] if rtol is None else rtol
    fd_rtol = tols["fd"] if fd_rtol is None else fd_rtol
    out = analytic(x)
    if not isinstance(out, tuple) or len(out) not in (2, 3):
        raise ValueError("check_derivatives: analytic must return (value, grad) or "
                         f"(value, grad, hess), got {type(out).__name__} of length "
                         f"{len(out) if isinstance(out, tuple) else 'n/a'}")

    def scale_of(ref) -> float:
        return max(float(np.max(np.abs(np.asarray(ref, np.float64)), initial=0.0)) * 1e-3,
                   float(np.finfo(np.float64).tiny))

    comparisons = []
    value_ref = objective(x)
    comparisons.append(_compare("value vs objective", out[0], value_ref, rtol,
                                scale_of(value_ref), show))
    grad_ref = jax.grad(objective)(x)
    comparisons.append(_compare("gradient vs jax.grad", out[1], grad_ref, rtol,
                                scale_of(grad_ref), show))
    step = float(np.finfo(np.dtype(x.dtype)).eps) ** (1 / 3)
    if finite_differences:
        fd = _central_gradient(objective, x, step)
        comparisons.append(_compare("gradient vs central differences", out[1], fd, fd_rtol,
                                    scale_of(grad_ref), show))
    if len(out) == 3:
        hess_ref = jax.hessian(objective)(x)
        comparisons.append(_compare("Hessian vs jax.hessian", out[2], hess_ref, rtol,
                                    scale_of(hess_ref), show))
        if finite_differences:
            grad_fn = jax.grad(objective)
            fd_h = jax.vmap(lambda i: _central_gradient(
                lambda z: grad_fn(z).reshape(-1)[i], x, step))(jnp.arange(x.size))
            comparisons.append(_compare("Hessian vs central differences of jax.grad",
                                        out[2], np.asarray(fd_h).reshape(x.shape + x.shape),
                                        fd_rtol, scale_of(hess_ref), show))
    return DerivativeReport(comparisons)
