"""Elementwise numerics kernel vs the reference (interpret on CPU, compiled on GPU)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gpustat import numerics
from gpustat.reference import numerics as ref
from tests.helpers import KernelTests, assert_close, tol

OPS = ["erfc", "erfcx", "ndtr", "log_ndtr", "log_ndtr_and_mills", "probit_curvature"]


def _kernel_rtol(op, dtype):
    """Kernel and reference fuse differently; float32 curvature amplifies that by its
    cancellation (documented float32 bound 5e-6, tests/reference/test_numerics.py)."""
    if op == "probit_curvature" and dtype == jnp.float32:
        return 5e-6
    return tol(dtype, "kernel")


def _inputs(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(scale=12.0, size=shape)
    flat = x.reshape(-1)
    specials = [np.nan, np.inf, -np.inf, 0.0, -3.0, -40.0, 30.0]
    flat[: min(len(specials), flat.size)] = specials[: flat.size]
    return jnp.asarray(x, dtype=dtype)


class TestNumericsKernel(KernelTests):
    # size 1, sizes that are not block multiples (512 f64 / 1024 f32), a 3-D shape
    @pytest.mark.parametrize("shape", [(1,), (1025,), (2, 3, 167)])
    @pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
    @pytest.mark.parametrize("op", OPS)
    def test_matches_reference(self, op, dtype, shape):
        x = _inputs(shape, dtype)
        got = getattr(numerics, op)(x, backend=self.backend)
        expected = getattr(ref, op)(x)
        for g, e in zip(jax.tree.leaves(got), jax.tree.leaves(expected), strict=True):
            assert g.shape == x.shape and g.dtype == x.dtype
            assert_close(g, e, rtol=_kernel_rtol(op, dtype), atol=0.0, err_msg=op)

    @pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
    def test_half_precision_computes_in_float32(self, dtype):
        x = _inputs((300,), dtype)
        got = numerics.log_ndtr(x, backend=self.backend)
        assert got.dtype == dtype
        expected = ref.log_ndtr(x.astype(jnp.float32)).astype(dtype)
        np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(expected, np.float32))

    def test_under_jit_and_vmap(self):
        x = _inputs((4, 33), jnp.float64)
        f = jax.jit(jax.vmap(lambda row: numerics.probit_curvature(row, backend=self.backend)))
        assert_close(f(x), ref.probit_curvature(x), rtol=tol(jnp.float64, "kernel"))
