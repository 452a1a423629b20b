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

import contextlib
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


def launch(kernel, args: Sequence[jax.Array], out_shape, grid: tuple[int, ...], *,
           num_warps: int, interpret: bool = False, aliases: dict[int, int] | None = None,
           num_stages: int = 1, **constexprs):
    """Run ``kernel[grid](*args, *outs, **constexprs)`` on JAX arrays; returns the outputs.

    Args:
        kernel: a ``@triton.jit`` function whose last pointer arguments are the outputs.
        args: input arrays (every one becomes a pointer argument).
        out_shape: shape and dtype of the output (a ``jax.ShapeDtypeStruct``: one array
            comes back), or a tuple of them (a tuple of arrays comes back).
        grid: launch grid (up to three program axes).
        num_warps: warps per program (ignored by the interpreter).
        interpret: run in Triton's interpreter on the host (any machine).
        num_stages: Triton's software-pipelining depth of the kernel's loops (1: none).
        aliases: ``{input position: output position}``: that output starts as that
            input's buffer (in place on the GPU), so the kernel may leave parts unwritten.
        **constexprs: the kernel's ``tl.constexpr`` arguments.
    """
    single = isinstance(out_shape, jax.ShapeDtypeStruct)
    shapes = (out_shape,) if single else tuple(out_shape)
    aliases = dict(aliases or {})
    if interpret:
        host = functools.partial(_interpret_on_host, kernel, grid, shapes, aliases, constexprs)
        outs = jax.pure_callback(host, shapes, *args)
    else:
        import jax_triton  # lazy: importing it needs a CUDA jaxlib

        outs = jax_triton.triton_call(*args, kernel=kernel, out_shape=shapes, grid=grid,
                                      num_warps=num_warps, num_stages=num_stages,
                                      input_output_aliases=aliases, **constexprs)
    return outs[0] if single else tuple(outs)


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


def _interpret_on_host(kernel, grid, shapes, aliases, constexprs, *arrays):
    run = _interpreted(kernel.fn.__module__, kernel.fn.__name__)
    inputs = [np.ascontiguousarray(a).copy() for a in arrays]
    source = {o: a for a, o in aliases.items()}  # output position -> its aliased input
    outs = []
    for i, shape in enumerate(shapes):
        if i in source:
            outs.append(inputs[source[i]].copy())
        else:  # NaN-filled: an element the kernel forgets to write shows up in the tests
            fill = np.nan if jnp.issubdtype(shape.dtype, jnp.floating) else 0
            outs.append(np.full(shape.shape, fill, dtype=shape.dtype))
    with _interpreter_patches_undone():
        run[grid](*map(_HostTensor, inputs), *map(_HostTensor, outs), **constexprs)
    return tuple(outs)


@contextlib.contextmanager
def _interpreter_patches_undone():
    """Undo every patch Triton's interpreter makes to ``triton.language`` while it runs.

    Triton 3.6's interpreter patches the language for each call of a ``@triton.jit``
    helper from a kernel and never restores it; afterwards, compiling any kernel in the
    same process fails (``tl.program_id`` returns a bare IR value). This records the
    value each patched attribute had before its first patch and puts it back."""
    from triton.runtime import interpreter

    missing = object()
    first_values = {}
    set_attr = interpreter._LangPatchScope.set_attr

    def recording_set_attr(scope, obj, name, value):
        first_values.setdefault((id(obj), name), (obj, name, getattr(obj, name, missing)))
        set_attr(scope, obj, name, value)

    interpreter._LangPatchScope.set_attr = recording_set_attr
    try:
        yield
    finally:
        interpreter._LangPatchScope.set_attr = set_attr
        for obj, name, value in first_values.values():
            if value is not missing:
                setattr(obj, name, value)
            elif name in vars(obj):
                delattr(obj, name)


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
