"""Shared Pallas-Triton plumbing: compiler params and the ``pallas_call`` wrapper.

Facts of the Triton lowering in jax 0.11.2 that shape every kernel here
(see ``docs/design.md``): every in-kernel tensor has power-of-two dimensions,
partial edge blocks are not masked for us, gathers work only on refs, and
``lax.erf`` does not lower (use :mod:`gpustat.reference.numerics`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

__all__ = [
    "LOWERING_CASES",
    "LoweringCase",
    "compiler_params",
    "pallas_call",
    "register_lowering_case",
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


@dataclasses.dataclass(frozen=True)
class LoweringCase:
    """One call of a kernel wrapper to be lowered for CUDA on a CPU machine.

    ``fn`` takes arrays positionally (static settings bound with a closure);
    ``args`` are ``jax.ShapeDtypeStruct``s. The test suite lowers every
    registered case (``tests/pallas/test_lowering.py``).
    """

    module: str
    name: str
    fn: Callable
    args: Sequence[jax.ShapeDtypeStruct]


LOWERING_CASES: list[LoweringCase] = []


def register_lowering_case(module: str, name: str, fn: Callable,
                           args: Sequence[jax.ShapeDtypeStruct]) -> None:
    """Record a kernel call whose CUDA lowering the tests must check."""
    LOWERING_CASES.append(LoweringCase(module, name, fn, tuple(args)))
