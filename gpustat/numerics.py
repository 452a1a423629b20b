r"""Probit numerics usable inside Pallas kernels, and as public functions.

The standard normal CDF :math:`\Phi`, its log, the Mills ratio
:math:`\lambda(x) = \varphi(x)/\Phi(x)` and the probit curvature
:math:`C(x) = -\frac{d^2}{dx^2}\log\Phi(x) = \lambda(x)\,(x + \lambda(x))`, plus
``erfc`` and the scaled ``erfcx(x) = exp(x^2) erfc(x)``. They are built from
``exp``/``log``/``log1p``/``floor`` and W. J. Cody's rational approximations
(Math. Comp. 23, 1969), because ``lax.erf`` does not lower in Triton kernels;
kernels of other capabilities call :mod:`gpustat.reference.numerics` on loaded
blocks.

Accuracy (max relative error against mpmath over [-1e3, 1e3], tests
``tests/reference/test_numerics.py``): float64 <= 2e-15 for ``erfc``, ``erfcx``,
``ndtr``, ``log_ndtr``, the Mills ratio, and <= 1e-14 for ``probit_curvature``;
float32 <= 2e-6 (curvature <= 5e-6, from the cancellation in x + λ near x = -3)
wherever the result is at least 1e-300 (float64) or 16 times the smallest normal
float32 (just above underflow C is 0 where λ ≈ φ is subnormal: x in (37.62, 37.71]
in float64, (13.15, 13.34] in float32). Special values follow
``../shared/specs/bms_flex.md`` A.6 (NaN -> NaN; ``log_ndtr(+inf) = 0``,
``log_ndtr(-inf) = -inf``, ``λ(-inf) = +inf``, ``C(-inf) = 1``, ``C(+inf) = 0``).
Where the spec restricts ``erfcx`` to x >= 0 (NaN below), gpustat follows
scipy's full-line ``erfcx`` (finite down to about -26.6, then +inf).

Every function takes ``backend="auto" | "pallas" | "reference" | "interpret"``
(see :mod:`gpustat._backend`; "auto" runs XLA's fusion of the reference, as fast
as the standalone elementwise kernel in ``benchmarks/bench_numerics.py``), works
under ``jax.jit``/``jax.vmap``, and has an
exact ``custom_jvp`` (the derivative formulas below, not derivatives of the
rational approximations).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike
from jaxtyping import Array, Float

from gpustat._arrays import compute_dtype
from gpustat._backend import resolve_backend
from gpustat.pallas import numerics as _kernels
from gpustat.reference import numerics as _ref

__all__ = [
    "erfc",
    "erfcx",
    "log_ndtr",
    "log_ndtr_and_mills",
    "ndtr",
    "probit_curvature",
]


def _as_float(x: ArrayLike, name: str) -> jax.Array:
    """Validate ``x``: real numbers; integers become the default float dtype."""
    try:
        x = jnp.asarray(x)
    except (TypeError, ValueError) as err:
        got = getattr(x, "dtype", type(x).__name__)
        raise TypeError(f"numerics.{name}: x must be real numbers, got {got}") from err
    if jnp.issubdtype(x.dtype, jnp.complexfloating) or x.dtype == jnp.bool_:
        raise TypeError(f"numerics.{name}: x must be real floating point, got {x.dtype=}")
    if not jnp.issubdtype(x.dtype, jnp.floating):
        x = x.astype(jnp.result_type(float))
    return x


def _run(name: str, x: jax.Array, backend: str):
    """Dispatch one op to the reference or the elementwise kernel."""
    fn, count = _kernels.KERNELS[name]
    path = resolve_backend(backend, op=f"numerics.{name}", capability="numerics")
    if path == "reference":
        out = fn(x.astype(compute_dtype(x.dtype)))
        return jax.tree.map(lambda o: o.astype(x.dtype), out)
    return _kernels.elementwise(x, fn=fn, num_outputs=count, interpret=path == "interpret")


def _public(name: str, derivative: Callable) -> Callable:
    """Public single-output op: validation, dispatch and an exact custom_jvp."""

    @functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
    def op(x, backend):
        return _run(name, x, backend)

    @op.defjvp
    def _jvp(backend, primals, tangents):
        (x,), (dx,) = primals, tangents
        y = op(x, backend)
        # The derivative in the compute dtype, as the value: 16-bit x overflows the
        # rational approximations, and a 16-bit y is too coarse for the formulas.
        cdt = compute_dtype(x.dtype)
        y_c = y if x.dtype == cdt else _run(name, x.astype(cdt), backend)
        return y, (derivative(x.astype(cdt), y_c) * dx.astype(cdt)).astype(x.dtype)

    def public(x: Float[ArrayLike, "*shape"], *, backend: str = "auto") -> Float[Array, "*shape"]:
        return op(_as_float(x, name), backend)

    public.__name__ = public.__qualname__ = name
    return public


def _mills(x):
    # λ with its own custom_jvp (λ' = -C): (log Φ)'' = -C is then exact, not the derivative
    # of the reference's rational approximations (NaN where x^2 overflows and at ±inf).
    return _log_ndtr_and_mills(x, "reference")[1]


erfc = _public("erfc", _ref.erfc_derivative)
erfc.__doc__ = """Complementary error function ``erfc(x) = 1 - erf(x)``.

    Args:
        x: array of any shape; float16/bfloat16 compute in float32; integers
            are promoted to the default float dtype.
        backend: "auto", "pallas", "reference" or "interpret".

    Returns:
        Array of ``x``'s shape and (floating) dtype, in [0, 2].
    """

erfcx = _public("erfcx", _ref.erfcx_derivative)
erfcx.__doc__ = """Scaled complementary error function ``exp(x^2) erfc(x)``.

    Finite and about ``1/(x√π)`` for large positive x (no overflow); for negative x
    it equals ``2 exp(x^2) - erfcx(-x)`` and overflows to +inf below about -26.6
    in float64 (scipy's convention).

    Args:
        x: array of any shape (dtype rules as :func:`erfc`).
        backend: "auto", "pallas", "reference" or "interpret".

    Returns:
        Array of ``x``'s shape and dtype.
    """

ndtr = _public("ndtr", _ref.ndtr_derivative)
ndtr.__doc__ = """Standard normal CDF ``Φ(x)``, accurate in relative terms in the left tail.

    Args:
        x: array of any shape (dtype rules as :func:`erfc`).
        backend: "auto", "pallas", "reference" or "interpret".

    Returns:
        Array of ``x``'s shape and dtype, in [0, 1].
    """

log_ndtr = _public("log_ndtr", lambda x, y: _mills(x))
log_ndtr.__doc__ = """``log Φ(x)``, no underflow: ``-x^2/2 + log erfcx(-x/√2) - log 2`` for x < 0.

    Args:
        x: array of any shape (dtype rules as :func:`erfc`).
        backend: "auto", "pallas", "reference" or "interpret".

    Returns:
        Array of ``x``'s shape and dtype; ``log_ndtr(-inf) = -inf``, ``log_ndtr(inf) = 0``.
    """

probit_curvature = _public("probit_curvature", _ref.probit_curvature_derivative)
probit_curvature.__doc__ = """Probit curvature ``C(x) = -d² log Φ(x)/dx² = λ(x) (x + λ(x))``.

    In (0, 1): ``C(-inf) = 1``, ``C(+inf) = 0``. For x <= -3 a 64-term Laplace
    continued fraction removes the cancellation in ``x + λ``.

    Args:
        x: array of any shape (dtype rules as :func:`erfc`).
        backend: "auto", "pallas", "reference" or "interpret".

    Returns:
        Array of ``x``'s shape and dtype.
    """


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def _log_ndtr_and_mills(x, backend):
    return _run("log_ndtr_and_mills", x, backend)


@_log_ndtr_and_mills.defjvp
def _log_ndtr_and_mills_jvp(backend, primals, tangents):
    (x,), (dx,) = primals, tangents
    log_cdf, mills = _log_ndtr_and_mills(x, backend)
    # In the compute dtype, as _public: 16-bit tangents are rounded once. The curvature is
    # the public op, whose custom_jvp (C') makes λ'' = -C' exact.
    cdt = compute_dtype(x.dtype)
    mills_c = mills if x.dtype == cdt else _log_ndtr_and_mills(x.astype(cdt), backend)[1]
    curvature = probit_curvature(x.astype(cdt), backend="reference")
    dx = dx.astype(cdt)
    return (log_cdf, mills), ((mills_c * dx).astype(x.dtype), (-curvature * dx).astype(x.dtype))


def log_ndtr_and_mills(
    x: Float[ArrayLike, "*shape"], *, backend: str = "auto"
) -> tuple[Float[Array, "*shape"], Float[Array, "*shape"]]:
    """``(log Φ(x), λ(x))`` with the Mills ratio ``λ = φ/Φ``, in one pass.

    The first output equals :func:`log_ndtr` bitwise. ``λ`` stays finite where
    ``Φ`` underflows (``λ(x) ≈ -x`` as x -> -inf): ``λ(-1e100) = 1e100``.

    Args:
        x: array of any shape (dtype rules as :func:`erfc`).
        backend: "auto", "pallas", "reference" or "interpret".

    Returns:
        Two arrays of ``x``'s shape and dtype.
    """
    return _log_ndtr_and_mills(_as_float(x, "log_ndtr_and_mills"), backend)
