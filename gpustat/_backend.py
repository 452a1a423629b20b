"""Backend choice: the one place that decides reference / pallas / interpret.

Every public op takes ``backend="auto" | "pallas" | "reference" | "interpret"``
(and ``"triton"`` where a jax-triton kernel exists) and calls
:func:`resolve_backend` once, at trace time, before dispatching:

* ``"auto"``: the Pallas kernel when JAX's default backend is a CUDA GPU and the
  kernel supports the request (dtype, shape); otherwise the reference.
* ``"pallas"``: the compiled kernel; raises :class:`BackendUnavailableError` on a
  machine without a CUDA GPU. Never falls back.
* ``"interpret"``: the kernel body under ``interpret=True`` on any platform (tests).
* ``"reference"``: the pure ``jax.numpy`` definition of the op.
"""

from __future__ import annotations

import functools
import importlib.util

import jax

__all__ = [
    "BACKENDS",
    "BackendUnavailableError",
    "available_backends",
    "cuda_gpu_available",
    "resolve_backend",
]

BACKENDS = ("auto", "pallas", "reference", "interpret", "triton")


class BackendUnavailableError(RuntimeError):
    """A backend was requested explicitly but this machine cannot run it."""


@functools.cache
def cuda_gpu_available() -> bool:
    """True when JAX's default backend is an NVIDIA (CUDA) GPU."""
    if jax.default_backend() != "gpu":
        return False
    device = jax.devices()[0]
    return "cuda" in device.client.platform_version.lower()


def _machine_description() -> str:
    devices = jax.devices()
    kinds = sorted({f"{d.platform}:{d.device_kind}" for d in devices})
    return f"JAX default backend {jax.default_backend()!r} with devices {kinds}"


def _triton_missing() -> list[str]:
    return [m for m in ("triton", "jax_triton") if importlib.util.find_spec(m) is None]


def available_backends() -> tuple[str, ...]:
    """Backends that can run on this machine, in the order "auto" prefers them."""
    names = []
    if cuda_gpu_available():
        names.append("pallas")
        if not _triton_missing():
            names.append("triton")
    names += ["reference", "interpret"]
    return tuple(names)


def resolve_backend(
    backend: str,
    *,
    op: str,
    kernel_supports: bool = True,
    unsupported_reason: str = "",
    has_triton: bool = False,
    auto_prefers_kernel: bool = True,
) -> str:
    """Turn a user's ``backend=`` argument into the concrete path to run.

    Args:
        backend: the user's request, one of :data:`BACKENDS`.
        op: public name of the op, used in error messages.
        kernel_supports: whether the kernel handles this call (dtype, shape).
            ``"auto"`` uses the reference when False; an explicit ``"pallas"``
            or ``"interpret"`` raises ``ValueError`` with ``unsupported_reason``.
        unsupported_reason: why the kernel does not handle the call.
        has_triton: whether ``op`` has a jax-triton kernel.
        auto_prefers_kernel: False where the committed benchmarks show XLA's
            fusion of the reference at least as fast as the kernel for this call;
            ``"auto"`` then runs the reference on a GPU too.

    Returns:
        One of ``"pallas"``, ``"interpret"``, ``"reference"``, ``"triton"``.

    Raises:
        ValueError: unknown backend name, or a kernel asked for a call it cannot do.
        BackendUnavailableError: ``"pallas"``/``"triton"`` requested on a machine
            that cannot run it.
    """
    if backend not in BACKENDS or (backend == "triton" and not has_triton):
        allowed = [b for b in BACKENDS if b != "triton" or has_triton]
        raise ValueError(f"{op}: backend must be one of {allowed}, got {backend=!r}")
    if backend == "auto":
        use_kernel = cuda_gpu_available() and kernel_supports and auto_prefers_kernel
        return "pallas" if use_kernel else "reference"
    if backend in ("pallas", "triton") and not cuda_gpu_available():
        raise BackendUnavailableError(
            f"{op}: backend={backend!r} needs a CUDA GPU, but this machine has "
            f"{_machine_description()}. Use backend='auto', 'reference' or 'interpret'."
        )
    if backend == "triton" and _triton_missing():
        raise BackendUnavailableError(
            f"{op}: backend='triton' needs the packages {_triton_missing()} "
            "(pip install 'gpustat[triton]'), which are not installed."
        )
    if backend in ("pallas", "interpret", "triton") and not kernel_supports:
        raise ValueError(f"{op}: backend={backend!r} cannot run this call: {unsupported_reason}")
    return backend
