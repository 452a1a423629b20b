"""Piecewise kernel (interpret on CPU, compiled on a GPU) vs scipy and the reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.interpolate import PPoly

import gpustat.piecewise._polynomial
from gpustat.pallas.piecewise import ppoly_eval_pallas
from gpustat.piecewise import PiecewisePolynomial, activation, ppoly_eval
from gpustat.reference import piecewise as ref
from gpustat.reference.piecewise import eytzinger_order
from tests.helpers import KernelTests, assert_close, assert_within_float32_ulps, tol

SCIPY_MODE = {"extend": True, "nan": False, "periodic": "periodic"}
evaluate_reference = jax.jit(ref.ppoly_eval_reference, static_argnames=("extrapolate", "uniform"))


def make_case(num_pieces, degree, uniform, seed=0, size=None):
    rng = np.random.default_rng(seed)
    if uniform:
        bp = np.linspace(-2.0, 3.0, num_pieces + 1)
    else:
        bp = np.sort(rng.uniform(-2.0, 3.0, num_pieces + 1))
    c = rng.normal(size=(degree + 1, num_pieces))
    x = np.concatenate([rng.uniform(-5.0, 6.0, 100), bp, np.nextafter(bp, np.inf),
                        np.nextafter(bp, -np.inf), [np.inf, -np.inf, np.nan]])
    if size is not None:
        x = np.resize(x, size)
    return bp, c, x


def expected_scipy(bp, c, x, mode):
    """scipy PPoly; "clamp" is scipy at the clipped points; +-inf under "extend" is the limit."""
    with np.errstate(invalid="ignore"):
        if mode == "clamp":
            return PPoly(c, bp)(np.clip(x, bp[0], bp[-1]))
        out = PPoly(c, bp, extrapolate=SCIPY_MODE[mode])(x)
    if mode == "extend":  # scipy's power sum gives NaN there (0 * inf, inf - inf)
        degree = c.shape[0] - 1
        for value, piece in ((np.inf, -1), (-np.inf, 0)):
            sign = np.sign(c[0, piece]) * (np.sign(value) ** degree)
            out[x == value] = sign * np.inf if degree else c[0, piece]
    return out


class TestPiecewiseKernel(KernelTests):
    @pytest.mark.parametrize("uniform", [False, True], ids=["search", "uniform"])
    @pytest.mark.parametrize("mode", ["extend", "nan", "clamp", "periodic"])
    def test_equals_scipy_float64(self, mode, uniform):
        bp, c, x = make_case(7, 3, uniform, seed=1)
        pp = PiecewisePolynomial(bp, c, extrapolate=mode)
        assert pp.uniform == uniform
        got = np.asarray(pp(jnp.asarray(x), backend=self.backend))
        expected = expected_scipy(bp, c, x, mode)
        terms = np.sum(np.abs(c)) * 8.0 ** 3  # cancellation scale of the terms
        assert_close(got, expected, rtol=tol(np.float64, "oracle"),
                     atol=tol(np.float64, "oracle") * terms)

    @pytest.mark.parametrize("num_pieces, degree, size, block_n", [
        (1, 0, 1, None),  # one piece, a constant, one point
        (2, 1, 130, 64),  # three programs, ragged last block
        (5, 5, 333, 128),
        (256, 3, 1000, 256),  # the benchmark's table, 8-level search
    ])
    @pytest.mark.parametrize("uniform", [False, True], ids=["search", "uniform"])
    def test_sizes_and_degrees_vs_reference(self, num_pieces, degree, size, block_n, uniform):
        bp, c, x = make_case(num_pieces, degree, uniform, seed=2, size=size)
        got = ppoly_eval_pallas(jnp.asarray(bp), jnp.asarray(c), jnp.asarray(x),
                                uniform=uniform, block_n=block_n,
                                interpret=self.backend == "interpret")
        expected = evaluate_reference(jnp.asarray(bp), jnp.asarray(c), jnp.asarray(x),
                                      uniform=uniform)
        assert_close(got, expected, rtol=tol(np.float64, "kernel"), atol=1e-12)

    def test_prefetch_chunks(self):
        """Several blocks per program (next x prefetched), ragged last program."""
        bp, c, x = make_case(33, 3, False, seed=12, size=1000)
        got = ppoly_eval_pallas(jnp.asarray(bp), jnp.asarray(c), jnp.asarray(x), block_n=128,
                                chunks=3, interpret=self.backend == "interpret")
        expected = evaluate_reference(jnp.asarray(bp), jnp.asarray(c), jnp.asarray(x),
                                      uniform=False)
        assert_close(got, expected, rtol=tol(np.float64, "kernel"), atol=1e-12)

    def test_column_gather_variant(self):
        bp, c, x = make_case(9, 3, False, seed=3)
        kwargs = dict(interpret=self.backend == "interpret", extrapolate="nan")
        got = ppoly_eval_pallas(jnp.asarray(bp), jnp.asarray(c), jnp.asarray(x), gather="column",
                                **kwargs)
        expected = ppoly_eval_pallas(jnp.asarray(bp), jnp.asarray(c), jnp.asarray(x), **kwargs)
        np.testing.assert_array_equal(got, expected)

    @pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
    def test_low_precision_inputs_compute_in_float32(self, dtype):
        pp = activation("gelu", num_pieces=64, dtype=jnp.float32)
        x = jnp.asarray(np.random.default_rng(4).uniform(-10, 10, 777), dtype=dtype)
        got = pp(x, backend=self.backend)
        assert got.dtype == x.dtype and got.shape == x.shape
        # oracle: scipy in float64 at the same (rounded) points, rounded to dtype
        exact = pp.to_scipy()(np.asarray(x, np.float64))
        expected = np.asarray(jnp.asarray(exact, jnp.float32).astype(dtype), np.float64)
        spacing = np.asarray(jnp.finfo(dtype).eps) * np.maximum(np.abs(expected), 1e-2)
        assert np.all(np.abs(np.asarray(got, np.float64) - expected) <= 2 * spacing + 4e-7)

    @pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
    def test_16bit_table_lookup_equals_evaluating_each_point(self, dtype, monkeypatch):
        # above the threshold the kernel runs once over all 65,536 16-bit values and the
        # points look theirs up: bitwise the values of evaluating every point
        rng = np.random.default_rng(14)
        pp = PiecewisePolynomial(np.sort(rng.uniform(-3, 3, 10)).astype(np.float32),
                                 rng.normal(size=(4, 9, 2)).astype(np.float32), extrapolate="nan")
        x = np.concatenate([rng.uniform(-4, 4, 2997), [np.inf, -np.inf, np.nan]])
        x = jnp.asarray(x, dtype)
        monkeypatch.setattr(gpustat.piecewise._polynomial, "_TABLE_LOOKUP_MIN_POINTS", 1 << 40)
        each = np.asarray(pp(x, backend=self.backend), np.float64)
        monkeypatch.setattr(gpustat.piecewise._polynomial, "_TABLE_LOOKUP_MIN_POINTS", 1000)
        looked_up = pp(x.reshape(3, 1000), backend=self.backend)  # new shape: traced anew
        assert looked_up.dtype == x.dtype and looked_up.shape == (3, 1000, 2)
        np.testing.assert_array_equal(np.asarray(looked_up, np.float64).reshape(-1, 2), each)
        # the concrete polynomial's 65,536 values were evaluated once: a new trace holds
        # the lookup alone, no kernel
        jaxpr = str(jax.make_jaxpr(lambda v: pp(v, backend=self.backend))(x[:2000]))
        assert "gather" in jaxpr
        assert not any(kernel in jaxpr for kernel in ("pallas_call", "triton_kernel_call"))
        with jax.disable_jit():  # no ahead-of-time compile there: the values per call
            plain = pp(x.reshape(3, 1000), backend=self.backend)
        np.testing.assert_array_equal(np.asarray(plain, np.float64).reshape(-1, 2), each)

    def test_float32_few_ulp_of_float64(self):
        pp32 = activation("tanh", num_pieces=128, dtype=jnp.float32)
        x = jnp.asarray(np.random.default_rng(5).uniform(-9, 9, 1000), jnp.float32)
        got = np.asarray(pp32(x, backend=self.backend), np.float64)
        exact = pp32.to_scipy()(np.asarray(x, np.float64))  # same f32 tables, f64 arithmetic
        assert_within_float32_ulps(got, exact, 4.0, floor=2.0 ** -3)

    def test_trailing_axes(self):
        rng = np.random.default_rng(6)
        bp = np.linspace(0.0, 1.0, 5)
        c = rng.normal(size=(4, 4, 2, 3))
        x = rng.uniform(-0.5, 1.5, (6, 5))
        pp = PiecewisePolynomial(bp, c, extrapolate="clamp")
        got = pp(jnp.asarray(x), backend=self.backend)
        assert got.shape == (6, 5, 2, 3)
        expected = PPoly(c, bp)(np.clip(x, 0.0, 1.0))
        assert_close(got, expected, rtol=1e-12, atol=1e-12)

    def test_gradients_vs_reference_autodiff(self):
        bp, c, _ = make_case(6, 3, False, seed=7)
        x = jnp.asarray(np.random.default_rng(8).uniform(-3.0, 4.0, 50))
        weights = jnp.asarray(np.random.default_rng(9).normal(size=50))

        def loss(coeffs, points, backend):
            pp = PiecewisePolynomial(bp, coeffs, extrapolate="clamp")
            return jnp.sum(weights * ppoly_eval(pp, points, backend=backend))

        def independent(coeffs, points):  # the clamped polynomial written out directly
            xc = jnp.clip(points, bp[0], bp[-1])
            i = jnp.clip(jnp.searchsorted(jnp.asarray(bp), xc, side="right") - 1, 0, 5)
            u = xc - jnp.asarray(bp)[i]
            return jnp.sum(weights * sum(coeffs[k, i] * u ** (3 - k) for k in range(4)))

        got = jax.grad(loss, argnums=(0, 1))(jnp.asarray(c), x, self.backend)
        expected = jax.grad(independent, argnums=(0, 1))(jnp.asarray(c), x)
        assert_close(got[0], expected[0], rtol=tol(np.float64, "autodiff"), atol=1e-12)
        assert_close(got[1], expected[1], rtol=tol(np.float64, "autodiff"), atol=1e-12)

    def test_jit_and_vmap(self):
        bp, c, _ = make_case(8, 2, True, seed=10)
        pp = PiecewisePolynomial(bp, c)
        x = jnp.asarray(np.random.default_rng(11).uniform(-3.0, 4.0, (3, 16)))
        jitted = jax.jit(lambda p, v: ppoly_eval(p, v, nu=1, backend=self.backend))
        mapped = jax.vmap(lambda v: ppoly_eval(pp, v, nu=1, backend=self.backend))
        expected = PPoly(c, bp).derivative()(np.asarray(x))
        assert_close(jitted(pp, x), expected, rtol=1e-12, atol=1e-12)
        assert_close(mapped(x), expected, rtol=1e-12, atol=1e-12)


def primitives_outside_kernels(jaxpr) -> set[str]:
    """Primitive names of a jaxpr and its sub-jaxprs, not looking inside pallas_call."""
    names = set()
    for eqn in jaxpr.eqns:
        names.add(eqn.primitive.name)
        if eqn.primitive.name == "pallas_call":
            continue
        for value in eqn.params.values():
            inner = getattr(value, "jaxpr", value)
            if hasattr(inner, "eqns"):
                names |= primitives_outside_kernels(inner)
    return names


def test_constant_polynomial_under_jit_has_host_built_tables():
    """A polynomial closed over inside jit costs the kernel call and nothing else."""
    pp = PiecewisePolynomial(np.linspace(0.0, 1.0, 9), np.ones((4, 8), np.float32))
    closed = jax.make_jaxpr(lambda v: pp(v, backend="interpret"))(jnp.zeros(64, jnp.float32))
    names = primitives_outside_kernels(closed.jaxpr)
    assert "pallas_call" in names
    assert names <= {"pallas_call", "pjit", "jit", "custom_jvp_call", "reshape"}, names


def test_eytzinger_order_is_in_order_walk():
    for levels in range(0, 6):
        order = eytzinger_order(levels)
        size = (1 << levels) - 1
        assert sorted(order[1:].tolist()) == list(range(size))
        for node in range(1, size + 1):  # left subtree ranks < node rank < right subtree ranks
            if 2 * node <= size:
                assert order[2 * node] < order[node] < order[2 * node + 1]
