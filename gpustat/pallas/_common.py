"""Shared Pallas-Triton plumbing: compiler params and the ``pallas_call`` wrapper.

Facts of the Triton lowering in jax 0.11.2 that shape every kernel here
(see ``docs/design.md``): every in-kernel tensor has power-of-two dimensions,
partial edge blocks are not masked for us, gathers work only on refs, and
``lax.erf`` does not lower (use :mod:`gpustat.reference.numerics`).
"""

from __future__ import annotations

from collections.abc import Callable

from jax.experimental import pallas as pl

try:  # JAX deprecated this lowering in 0.11 and will remove it
    from jax.experimental.pallas import triton as plt
except ImportError:  # the kernels then cannot be built; gpustat._backend says why
    plt = None

__all__ = [
    "compiler_params",
    "pallas_call",
    "plt",
]


def compiler_params(num_warps: int = 4, num_stages: int = 1) -> plt.CompilerParams:
    """Triton compiler parameters (ignored in interpret mode)."""
    return plt.CompilerParams(num_warps=num_warps, num_stages=num_stages)


def pallas_call(kernel: Callable, *, interpret: bool, num_warps: int = 4, num_stages: int = 1,
                **kwargs) -> Callable:
    """``pl.pallas_call`` with the project's compiler params and interpret switch."""
    return pl.pallas_call(
        kernel,
        interpret=interpret,
        compiler_params=compiler_params(num_warps, num_stages),
        **kwargs,
    )
