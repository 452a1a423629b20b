"""Shared test helpers: tolerances, the CUDA-lowering check, the kernel test base class."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import numpy as np
import pytest

# One tolerance table for the project: (dtype, comparison) -> relative tolerance.
#   oracle:   reference vs an independent float64 oracle (scipy, mpmath, dense, brute force)
#   kernel:   Pallas kernel (interpret or compiled) vs the reference, same dtype
#   autodiff: analytic derivatives vs jax.grad / jax.hessian of an objective
TOLERANCES: dict[tuple[str, str], float] = {
    ("float64", "oracle"): 1e-12,
    ("float64", "kernel"): 1e-12,
    ("float64", "autodiff"): 1e-9,
    ("float32", "oracle"): 2e-6,
    ("float32", "kernel"): 2e-6,
    ("float32", "autodiff"): 1e-4,
}


def tol(dtype, kind: str) -> float:
    """Relative tolerance for comparing in ``dtype`` (16-bit types compare as float32)."""
    name = "float64" if np.dtype(dtype) == np.float64 else "float32"
    return TOLERANCES[(name, kind)]


def assert_close(actual, expected, *, rtol: float, atol: float = 0.0, err_msg: str = "") -> None:
    """``np.testing.assert_allclose`` that also requires NaNs in the same places."""
    np.testing.assert_allclose(
        np.asarray(actual), np.asarray(expected), rtol=rtol, atol=atol, equal_nan=True,
        err_msg=err_msg,
    )


def assert_within_float32_ulps(got, exact, ulps: float, *, floor: float) -> None:
    """``|got - exact|`` at most ``ulps`` float32 ulps of ``max(|exact|, floor)`` everywhere
    (``exact``: a float64 oracle; the floor keeps values near zero from demanding ulps of
    tiny numbers)."""
    spacing = np.spacing(np.maximum(np.abs(exact), floor).astype(np.float32))
    worst = float(np.max(np.abs(np.asarray(got, np.float64) - exact) / spacing))
    assert worst <= ulps, f"{worst:.2f} float32 ulps > {ulps}"


def assert_lowers_for_cuda(fn: Callable, args: Sequence[jax.ShapeDtypeStruct],
                           device_kind: str = "NVIDIA H100",
                           calls: Sequence[str] = ("triton_kernel_call",
                                                   "__gpu$xla.gpu.triton")) -> str:
    """Lower ``jax.jit(fn)(*args)`` for CUDA on this (CPU) machine and return the text.

    Raises what the GPU compile would raise for primitives the Triton (or Mosaic
    GPU) lowering lacks, non-power-of-two in-kernel tensors or too-small f64 dots.
    It does not run Triton's compiler or ptxas: a GPU run is still needed.
    ``calls``: custom-call names one of which the lowered module must hold
    (``("mosaic_gpu",)`` for Mosaic GPU kernels).
    """
    device = jax.sharding.AbstractDevice(device_kind, 132, "cuda")
    mesh = jax.sharding.AbstractMesh((1,), ("x",), abstract_device=device)
    with jax.sharding.use_abstract_mesh(mesh):
        lowered = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
    text = lowered.as_text()
    assert any(call in text for call in calls), (
        f"the lowered module holds no kernel call named one of {list(calls)}"
    )
    return text


KERNEL_BACKENDS = [
    pytest.param("interpret", id="interpret"),
    pytest.param("pallas", id="pallas", marks=pytest.mark.gpu),
]


class KernelTests:
    """Base class: every test method runs in interpret mode on CPU and compiled on a GPU.

    Test bodies call the op with ``backend=self.backend``. The ``pallas`` variant
    carries the ``gpu`` marker, so it is skipped without a CUDA GPU and selected by
    ``pytest -m gpu`` on the GPU machine.
    """

    backend: str

    @pytest.fixture(autouse=True, params=KERNEL_BACKENDS)
    def _kernel_backend(self, request):
        self.backend = request.param


def compiled_programs(fn) -> list[str]:
    """The names (``jit(<function>)``) of the XLA compilations ``fn()`` triggers, in
    order (JAX's monitoring events)."""
    from jax._src import monitoring

    seen = []

    def listen(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            seen.append(kwargs.get("fun_name", "?"))

    monitoring.register_event_duration_secs_listener(listen)
    try:
        fn()
    finally:
        monitoring.unregister_event_duration_listener(listen)
    return seen


def count_compiles(fn) -> int:
    """How many XLA compilations ``fn()`` triggers."""
    return len(compiled_programs(fn))
