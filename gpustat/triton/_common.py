"""Launching Triton-language kernels from JAX: on the GPU, in Triton's interpreter, or compiled.

* :func:`launch` runs a ``@triton.jit`` kernel through ``jax_triton.triton_call``
  (a custom call in the XLA program, compiled by Triton at lowering time). With
  ``interpret=True`` it runs the same kernel in Triton's own interpreter on the
  host instead, behind ``jax.pure_callback``: the CPU tests drive every wrapper,
  reshape and batching rule through the real kernel source.
* :func:`compile_for_cuda` compiles a kernel with Triton's compiler (to a cubin
  for a chosen compute capability, ptxas included) on any machine: the CPU check
  that the kernel source lowers, as ``tests/pallas/test_lowering.py`` is for Pallas.

Kernels import ``triton.language as tl`` and call ``@triton.jit`` helpers of
their own module only: the interpreter re-creates the module's functions (and
gives it a ``tl`` whose library functions such as ``tl.sum`` are interpreted).
Static sizes are passed as ``tl.constexpr`` (JAX shapes are static anyway), so a
launch never has scalar runtime arguments. Array pointers are 16-byte aligned
(XLA's buffers; jax-triton tells Triton so).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import sys
import types
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["CompileCase", "compile_for_cuda", "launch", "triton_type"]

_TRITON_TYPES = {
    "float64": "fp64", "float32": "fp32", "float16": "fp16", "bfloat16": "bf16",
    "int64": "i64", "int32": "i32",
}


def triton_type(dtype) -> str:
    """Triton's name of a dtype (``"fp32"``, ``"bf16"``, ``"i32"``, ...)."""
    return _TRITON_TYPES[jnp.dtype(dtype).name]


def launch(kernel, args: Sequence[jax.Array], out_shape: jax.ShapeDtypeStruct,
           grid: tuple[int, ...], *, num_warps: int, interpret: bool = False,
           **constexprs) -> jax.Array:
    """Run ``kernel[grid](*args, out, **constexprs)`` on JAX arrays; returns ``out``.

    Args:
        kernel: a ``@triton.jit`` function whose last pointer argument is the output.
        args: input arrays (every one becomes a pointer argument).
        out_shape: shape and dtype of the single output.
        grid: launch grid (up to three program axes).
        num_warps: warps per program (ignored by the interpreter).
        interpret: run in Triton's interpreter on the host (any machine).
        **constexprs: the kernel's ``tl.constexpr`` arguments.
    """
    if interpret:
        host = functools.partial(_interpret_on_host, kernel, grid, out_shape, constexprs)
        return jax.pure_callback(host, out_shape, *args)
    import jax_triton  # lazy: importing it needs a CUDA jaxlib

    return jax_triton.triton_call(*args, kernel=kernel, out_shape=out_shape, grid=grid,
                                  num_warps=num_warps, num_stages=1, **constexprs)


class _HostTensor:
    """The part of ``torch.Tensor`` Triton's interpreter touches, over a numpy array."""

    def __init__(self, array: np.ndarray):
        self.array = array
        self.dtype = triton_type(array.dtype)

    def data_ptr(self) -> int:
        return self.array.ctypes.data

    def untyped_storage(self):
        return self

    def cpu(self):
        return self

    def new_empty(self, *_, **__):
        return _HostTensor(self.array)

    def set_(self, storage, *_):
        self.array = storage.array
        return self

    def storage_offset(self) -> int:
        return 0

    def size(self):
        return self.array.shape

    def stride(self):
        return tuple(s // self.array.itemsize for s in self.array.strides)

    def copy_(self, _):  # host and "device" share memory
        return self


def _interpreter_language():
    """``triton.language`` with its library ``@jit`` functions (``tl.sum``...) interpreted."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    proxy = types.ModuleType("triton.language")
    proxy.__getattr__ = functools.partial(getattr, tl)  # builtins: the interpreter patches tl
    for name in dir(tl):
        value = getattr(tl, name)
        if isinstance(value, JITFunction):
            setattr(proxy, name, InterpretedFunction(value.fn))
    return proxy


@functools.cache
def _interpreted(module_name: str, kernel_name: str):
    """The kernel re-created by executing its module again with the interpreter switched on."""
    import triton.language as tl
    from triton import knobs

    path = sys.modules[module_name].__file__
    spec = importlib.util.spec_from_file_location(f"{module_name}__interpreted", path)
    module = importlib.util.module_from_spec(spec)
    with knobs.runtime.scope():
        knobs.runtime.interpret = True
        spec.loader.exec_module(module)
    # the kernel sees the proxy as ``tl``; the interpreter patches the real module
    module.tl, module.triton_language = _interpreter_language(), tl
    return getattr(module, kernel_name)


def _interpret_on_host(kernel, grid, out_shape, constexprs, *arrays):
    run = _interpreted(kernel.fn.__module__, kernel.fn.__name__)
    inputs = [np.ascontiguousarray(a).copy() for a in arrays]
    # NaN-filled output: an element the kernel forgets to write shows up in the tests
    fill = np.nan if jnp.issubdtype(out_shape.dtype, jnp.floating) else 0
    out = np.full(out_shape.shape, fill, dtype=out_shape.dtype)
    run[grid](*map(_HostTensor, inputs), _HostTensor(out), **constexprs)
    return out


@dataclasses.dataclass(frozen=True)
class CompileCase:
    """One kernel configuration that must compile for CUDA (checked on CPU by the tests)."""

    name: str
    kernel: Callable
    arg_dtypes: tuple  # dtypes of the pointer arguments, output last
    constexprs: dict
    num_warps: int


def compile_for_cuda(case: CompileCase, capability: int = 90) -> int:
    """Compile ``case`` with Triton for ``sm_<capability>`` on this machine; cubin size in bytes.

    Raises what Triton's compiler raises for code it cannot compile.
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = case.kernel.arg_names
    pointers = [n for n in names if n not in case.constexprs]
    if len(pointers) != len(case.arg_dtypes):
        raise ValueError(f"{case.name}: {len(case.arg_dtypes)} dtypes for pointers {pointers}")
    signature = {n: "*" + triton_type(d) for n, d in zip(pointers, case.arg_dtypes)}
    signature.update({n: "constexpr" for n in case.constexprs})
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in pointers}
    source = ASTSource(case.kernel, signature=signature, constexprs=dict(case.constexprs),
                       attrs=attrs)
    compiled = triton.compile(source, target=GPUTarget("cuda", capability, 32),
                              options={"num_warps": case.num_warps, "num_stages": 1})
    return len(compiled.asm["cubin"])
