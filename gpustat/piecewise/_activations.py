"""Ready-made piecewise-polynomial activations with asymptotic tails.

Each activation is fitted once per (name, P, D, dtype) by
:func:`gpustat.piecewise.fit_piecewise` (Chebyshev nodes, uniform
breakpoints) on its domain, with one extra piece on each side holding the
function's asymptote. Domains end where the asymptote is within ~4e-8 of the
function (e.g. 20 e^-20 for SiLU), so the jump onto a tail is below the P = 256
fit error (e.g. GELU -> 0 on the left and x on the right), which
"extend" continues to +-inf; only exp's jump, e^-18 = 1.5e-8, is twice its
P = 256 fit error. The result is an ordinary
:class:`~gpustat.piecewise.PiecewisePolynomial`: evaluate it with ``pp(x)``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
from scipy import special

from gpustat._checks import check_int
from gpustat.piecewise._fit import fit_piecewise
from gpustat.piecewise._polynomial import PiecewisePolynomial

__all__ = ["ACTIVATIONS", "ActivationSpec", "activation"]


class ActivationSpec(NamedTuple):
    """The exact float64 function, the fitted domain and the two asymptotes."""

    fn: Callable[[np.ndarray], np.ndarray]
    lo: float
    hi: float
    left_tail: tuple[float, ...] | None  # global coefficients, highest power first
    right_tail: tuple[float, ...] | None


ACTIVATIONS: dict[str, ActivationSpec] = {
    "gelu": ActivationSpec(lambda x: x * special.ndtr(x), -8.0, 8.0, (0.0,), (1.0, 0.0)),
    "silu": ActivationSpec(lambda x: x * special.expit(x), -20.0, 20.0, (0.0,), (1.0, 0.0)),
    "tanh": ActivationSpec(np.tanh, -9.0, 9.0, (-1.0,), (1.0,)),
    "sigmoid": ActivationSpec(special.expit, -18.0, 18.0, (0.0,), (1.0,)),
    # exp has no polynomial asymptote on the right: the last piece continues
    # (accurate for x <= 0, e.g. a softmax after subtracting the row maximum).
    "exp": ActivationSpec(np.exp, -18.0, 0.0, (0.0,), None),
    "softplus": ActivationSpec(lambda x: np.logaddexp(0.0, x), -18.0, 18.0, (0.0,), (1.0, 0.0)),
}


def activation(name: str, num_pieces: int = 256, degree: int = 3,
               dtype=jnp.float32) -> PiecewisePolynomial:
    """A fitted activation: gelu, silu, tanh, sigmoid, exp or softplus.

    Args:
        name: one of :data:`ACTIVATIONS`.
        num_pieces: P, pieces on the fitted domain (two tail pieces are added).
        degree: D (at least 1 for gelu, silu and softplus: their right asymptote is x).
        dtype: coefficient dtype (float32 or float64).

    Returns:
        A :class:`PiecewisePolynomial` with coefficients (D+1, P+2) (P+1 for exp)
        and ``extrapolate="extend"``; its accuracy table is in the docs.

    Raises:
        ValueError: unknown ``name``, bad sizes, or coefficients that overflow ``dtype``.
    """
    if name not in ACTIVATIONS:
        raise ValueError(f"name must be one of {sorted(ACTIVATIONS)}, got {name=!r}")
    spec = ACTIVATIONS[name]
    degree = check_int(degree, "degree", 0)
    tail_degree = max(len(t) - 1 for t in (spec.left_tail, spec.right_tail) if t is not None)
    if degree < tail_degree:  # the tail pieces hold the asymptotes
        raise ValueError(f"degree must be >= {tail_degree} for {name!r} (the degree of its "
                         f"asymptotes), got {degree=}")
    # the cached object is shared: PiecewisePolynomial is immutable
    return _fitted(name, check_int(num_pieces, "num_pieces", 1), degree, jnp.dtype(dtype).name)


@functools.lru_cache(maxsize=64)
def _fitted(name: str, num_pieces: int, degree: int, dtype: str) -> PiecewisePolynomial:
    spec = ACTIVATIONS[name]
    fit = fit_piecewise(spec.fn, spec.lo, spec.hi, num_pieces, degree,
                        tails=(spec.left_tail, spec.right_tail), dtype=np.dtype(dtype))
    return fit.pp
