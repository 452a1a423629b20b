"""jax-triton backend: availability errors, lazy imports, "auto" choice, and the Triton
kernels vs the reference and independent oracles.

On CPU the Triton-language kernels run in Triton's own interpreter (``interpret``
variant, needs the ``triton`` package) and are compiled for sm_90 by Triton's
compiler; the ``triton`` variant (gpu-marked) runs them compiled through
``jax_triton.triton_call`` on a CUDA GPU, also through the public functions.
"""

import functools
import importlib.util
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.interpolate import PPoly

from gpustat._backend import BackendUnavailableError
from gpustat.csr import CSR
from gpustat.factorization import ffm_predict, fm_predict, fwfm_predict
from gpustat.piecewise import PiecewisePolynomial, fit_piecewise, ppoly_eval
from gpustat.reference import factorization as fref
from gpustat.reference.piecewise import guide_tables, kernel_tables, ppoly_eval_reference, side_rows
from tests.helpers import assert_close, assert_within_float32_ulps, tol
from tests.oracles import factorization_oracle as oracle
from tests.oracles.factorization_cases import make_large_value_problem, make_problem

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                  reason="the triton package is not installed")
BACKENDS = [pytest.param("interpret", id="interpret", marks=needs_triton),
            pytest.param("triton", id="triton", marks=pytest.mark.gpu)]

_reference_eval = jax.jit(ppoly_eval_reference, static_argnames=("extrapolate", "uniform"))


# -- availability and imports (CPU CI) --------------------------------------------------------

def _run_python(code: str) -> str:
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_gpustat_never_imports_triton_eagerly():
    out = _run_python("""
        import sys
        import jax.numpy as jnp
        import gpustat, gpustat.piecewise, gpustat.factorization, gpustat.triton
        from gpustat.piecewise import PiecewisePolynomial
        pp = PiecewisePolynomial(jnp.linspace(0.0, 1.0, 5), jnp.ones((4, 4)))
        pp(jnp.linspace(0.0, 1.0, 7)).block_until_ready()
        gpustat.factorization.ffm_predict(jnp.eye(3), jnp.zeros(3, int), 0.0, jnp.ones(3),
                            jnp.ones((3, 1, 2))).block_until_ready()
        print(sorted(m for m in ("triton", "jax_triton") if m in sys.modules))
    """)
    assert out.strip().splitlines()[-1] == "[]"


def test_gpustat_works_without_triton_installed():
    out = _run_python("""
        import sys
        sys.modules["triton"] = None  # import triton now fails, find_spec says missing
        sys.modules["jax_triton"] = None
        import jax.numpy as jnp
        from gpustat._backend import BackendUnavailableError, available_backends, triton_installed
        from gpustat.piecewise import PiecewisePolynomial
        pp = PiecewisePolynomial(jnp.linspace(0.0, 1.0, 5), jnp.ones((4, 4)))
        print(float(pp(jnp.asarray(0.625), backend="auto")), triton_installed(),
              "triton" in available_backends())
        try:
            pp(jnp.asarray(0.5), backend="triton")
        except BackendUnavailableError as err:
            print("unavailable:", err)
    """)
    lines = out.strip().splitlines()
    assert lines[0] == "1.142578125 False False"  # 1 + u + u^2 + u^3 at u = 1/8
    assert lines[1].startswith("unavailable:")


def _small_pp():
    return PiecewisePolynomial(jnp.linspace(0.0, 1.0, 5), jnp.ones((4, 4)))


def _small_fm_args(model):
    P = make_problem()
    V = P.V_ffm if model == "ffm" else P.V
    args = (P.X, P.field_ids, P.w0, P.w, V) + ((P.R,) if model == "fwfm" else ())
    return {"ffm": ffm_predict, "fwfm": fwfm_predict}[model], args


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="checks the error of a GPU-less machine")
def test_triton_backend_without_gpu_names_the_missing_device():
    with pytest.raises(BackendUnavailableError, match="needs a CUDA GPU"):
        ppoly_eval(_small_pp(), jnp.ones(3), backend="triton")
    for model in ("ffm", "fwfm"):
        fn, args = _small_fm_args(model)
        with pytest.raises(BackendUnavailableError, match="needs a CUDA GPU"):
            fn(*args, backend="triton")


def test_triton_backend_without_packages_names_them(monkeypatch):
    import gpustat._backend as backend_module

    monkeypatch.setattr(backend_module, "cuda_gpu_available", lambda: True)
    monkeypatch.setitem(sys.modules, "jax_triton", None)
    with pytest.raises(BackendUnavailableError, match="jax_triton"):
        ppoly_eval(_small_pp(), jnp.ones(3), backend="triton")
    fn, args = _small_fm_args("fwfm")
    with pytest.raises(BackendUnavailableError, match=r"gpustat\[triton\]"):
        fn(*args, backend="triton")


def test_fm_has_no_triton_kernel():
    P = make_problem()
    with pytest.raises(ValueError, match="backend must be one of"):
        fm_predict(P.X, P.w0, P.w, P.V, backend="triton")


def test_auto_takes_triton_only_for_one_polynomial(monkeypatch):
    import gpustat._backend as backend_module
    import gpustat.piecewise._polynomial as public

    monkeypatch.setattr(backend_module, "cuda_gpu_available", lambda: True)
    monkeypatch.setattr(backend_module, "triton_installed", lambda: True)
    paths = []
    monkeypatch.setattr(public, "_evaluate_jit",
                        lambda *args: paths.append(args[-1][-1]) or jnp.zeros(()))
    bp = jnp.linspace(-1.0, 2.0, 9) ** 3  # not uniform: the searched class
    x = jnp.zeros(1 << 23, jnp.float32)  # streaming
    ppoly_eval(PiecewisePolynomial(bp, jnp.ones((4, 8))), x)
    ppoly_eval(PiecewisePolynomial(bp, jnp.ones((4, 8, 2))), x)  # trailing axis
    ppoly_eval(PiecewisePolynomial(bp, jnp.ones((4, 8))), x, backend="pallas")
    assert paths == ["triton", "pallas", "pallas"]


# -- compile for CUDA on CPU ------------------------------------------------------------------

def _compile_cases():
    if importlib.util.find_spec("triton") is None:
        return []
    from gpustat.triton import border, factorization, mixture, piecewise

    return [*piecewise.COMPILE_CASES, *factorization.COMPILE_CASES, *border.COMPILE_CASES,
            *mixture.COMPILE_CASES]


@needs_triton
@pytest.mark.parametrize("case", _compile_cases(), ids=lambda c: c.name)
def test_kernel_compiles_for_sm90(case):
    from gpustat.triton._common import compile_for_cuda

    assert compile_for_cuda(case, capability=90) > 1000  # bytes of cubin


# -- piecewise kernel vs reference ------------------------------------------------------------

def _ppoly_case(num_pieces, degree, uniform, trailing=(), size=None, seed=0):
    rng = np.random.default_rng(seed)
    bp = (np.linspace(-2.0, 3.0, num_pieces + 1) if uniform
          else np.sort(rng.uniform(-2.0, 3.0, num_pieces + 1)))
    c = rng.normal(size=(degree + 1, num_pieces, *trailing))
    x = np.concatenate([rng.uniform(-5.0, 6.0, 12), bp, np.nextafter(bp, np.inf),
                        np.nextafter(bp, -np.inf), [np.inf, -np.inf, np.nan]])
    return bp, c, (x if size is None else np.resize(x, size))


def _ppoly_expected(bp, c, x, dtype, mode, uniform):
    return _reference_eval(jnp.asarray(bp, dtype), jnp.asarray(c, dtype), jnp.asarray(x, dtype),
                           extrapolate=mode, uniform=uniform)


def _check_16bit(got, expected, dtype):
    """Within 2 units of the 16-bit dtype's precision of the float32 reference (rounded)."""
    got = np.asarray(got, np.float64)
    rounded = np.asarray(jnp.asarray(expected, jnp.float32).astype(dtype), np.float64)
    spacing = float(jnp.finfo(dtype).eps) * np.maximum(np.abs(rounded), 1e-2)
    close = np.abs(got - rounded) <= 2 * spacing + 4e-7
    assert np.all(close | (np.isnan(got) & np.isnan(rounded)) | (got == rounded))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("grid", ["graded", "uniform", "random"])
def test_guide_tables_give_searchsorted_pieces(dtype, grid):
    # the kernel's rule (bucket as the kernel computes it, then below + (x >= split),
    # clipped at 0) against np.searchsorted at random points, every breakpoint +- 1 ulp
    # and +-inf, NaN
    rng = np.random.default_rng(21)
    t = np.linspace(-1.0, 1.0, 257)
    bp = {"graded": 8.0 * np.sinh(2.5 * t) / np.sinh(2.5), "uniform": 3.0 * t - 1.0,
          "random": np.sort(rng.uniform(-1.0, 1.0, 33))}[grid].astype(dtype)
    guide = guide_tables(bp)
    if grid == "random":  # 33 random breakpoints: some closer than 1/1024 of the range
        assert guide is None or guide[0].shape[0] <= 1024
        if guide is None:
            return
    below, split, knots, scale = guide
    assert below.dtype == np.int32 and split.dtype == knots.dtype == dtype
    assert split.shape == below.shape and knots.shape == (bp.size - 1,)
    x = np.concatenate([rng.uniform(-9.0, 9.0, 20_000), bp, np.nextafter(bp, np.inf),
                        np.nextafter(bp, -np.inf), [np.inf, -np.inf, np.nan]]).astype(dtype)
    with np.errstate(invalid="ignore"):
        b = np.floor((x - bp[0]) * scale[0])
        b = np.where(b == b, np.clip(b, 0, below.size - 1), 0).astype(np.int64)
        above = x >= split[b]
    piece = np.maximum(below[b] + above, 0)
    finite = ~np.isnan(x)
    expected = np.clip(np.searchsorted(bp[1:-1], x[finite], side="right"), 0, bp.size - 2)
    np.testing.assert_array_equal(piece[finite], expected)
    np.testing.assert_array_equal(np.where(above, split[b], knots[piece])[finite],
                                  bp[expected])
    assert 0 <= piece[~finite].min(initial=0) and piece.max() <= bp.size - 2


@pytest.mark.parametrize("degree", [3, 2, 0])
def test_side_rows_recentre_the_piece_below_each_breakpoint(degree):
    # row q (1 < q < P) evaluated at x - x_q equals piece q - 1 (scipy PPoly, float64) on
    # all of piece q - 1; row 0 and rows T.. are the pieces' own rows, the rest zero
    rng = np.random.default_rng(31)
    bp = 4.0 * np.sinh(2.0 * np.linspace(-1.0, 1.0, 41)) / np.sinh(2.0)
    c = rng.normal(size=(degree + 1, 40))
    _, rows, _ = kernel_tables(bp, c, False)
    sides = side_rows(bp[:-1], rows, degree)
    T, P = 64, 40
    assert sides.shape == (T + P, rows.shape[1]) and sides.dtype == rows.dtype
    np.testing.assert_array_equal(sides[T:], rows)
    np.testing.assert_array_equal(sides[0], rows[0])
    assert not sides[P:T].any() and not sides[1].any() and not sides[:P, degree + 1:].any()
    for q in range(2, P):
        x = rng.uniform(bp[q - 1], bp[q], 7)
        got = np.polyval(sides[q, :degree + 1], x - bp[q])
        assert_close(got, PPoly(c, bp)(x), rtol=1e-12, atol=1e-12)
    # traced coefficients: the same shift in float32 (the rows' dtype)
    rows32 = rows.astype(np.float32)
    traced = np.asarray(jax.jit(side_rows, static_argnums=2)(bp[:-1].astype(np.float32),
                                                             rows32, degree))
    exact = side_rows(bp[:-1].astype(np.float32), rows32, degree)
    assert_close(traced, exact, rtol=1e-5, atol=1e-5 * np.abs(exact).max())


def test_guide_tables_with_side_rows_evaluate_every_point_at_its_split():
    # the kernel's side-row rule: row below + 1 + T * (x >= split), u = x - split, but
    # row 0 at u = x - x_0 for piece 0 (below <= 0 left of split)
    bp = 8.0 * np.sinh(2.5 * np.linspace(-1.0, 1.0, 257)) / np.sinh(2.5)
    c = np.random.default_rng(22).normal(size=(4, 256))
    below, split, knots, scale = guide_tables(bp)
    sides = side_rows(knots, kernel_tables(bp, c, False)[1], 3)
    rng = np.random.default_rng(23)
    x = np.concatenate([rng.uniform(-8.0, 8.0, 20_000), bp[:-1], np.nextafter(bp[1:-1], -9)])
    b = np.clip(np.floor((x - bp[0]) * scale[0]), 0, below.size - 1).astype(np.int64)
    above = x >= split[b]
    first = (below[b] <= 0) & ~above
    row = np.where(first, 0, below[b] + 1 + 256 * above)
    u = np.where(first, x - bp[0], x - split[b])
    got = np.array([np.polyval(sides[r], v) for r, v in zip(row, u)])
    assert_close(got, PPoly(c, bp)(x), rtol=1e-12, atol=1e-12)


def test_guide_tables_decline_clustered_breakpoints():
    bp = np.array([0.0, 0.5, 0.5 + 1e-7, 1.0])  # two breakpoints in any bucket of 1/1024
    assert guide_tables(bp) is None
    assert guide_tables(np.array([-1.0, 1.0]))[0].shape == (16,)  # one piece: 16 buckets


class TestPiecewiseTritonKernel:
    @pytest.fixture(autouse=True, params=BACKENDS)
    def _backend(self, request):
        self.interpret = request.param == "interpret"

    def run(self, bp, c, x, dtype, mode, uniform, guided=False, sides=False, **settings):
        keys, rows, params = kernel_tables(np.asarray(bp, dtype), np.asarray(c, dtype), uniform)
        if guided:
            guide = guide_tables(np.asarray(bp, dtype))
            assert guide is not None
            settings["guide"] = tuple(map(jnp.asarray, guide))
            if sides:
                settings["side_rows"] = jnp.asarray(side_rows(guide[2], rows, c.shape[0] - 1))
        return gtriton_piecewise().ppoly_eval_triton(
            jnp.asarray(keys), jnp.asarray(rows), jnp.asarray(params), x,
            num_pieces=c.shape[1], degree=c.shape[0] - 1, extrapolate=mode, uniform=uniform,
            interpret=self.interpret, **settings)

    @pytest.mark.parametrize("mode", ["extend", "nan", "clamp", "periodic"])
    @pytest.mark.parametrize("grid", ["graded", "uniform", "one_piece"])
    @pytest.mark.parametrize("sides", [False, True], ids=["knots", "side_rows"])
    def test_guided_lookup_float64_equals_reference_and_scipy(self, mode, grid, sides):
        # graded: pieces from 0.03 to 0.3 wide (a 256-bucket guide); chunks=2 and 33
        # blocks of 16 points: a second program with a block past the end; side rows
        # (the float32 path's lookup) checked here in float64 against scipy
        rng = np.random.default_rng(11)
        num_pieces = {"graded": 40, "uniform": 7, "one_piece": 1}[grid]
        t = np.linspace(-1.0, 1.0, num_pieces + 1)
        bp = 3.0 * np.sinh(1.5 * t) if grid == "graded" else 2.5 * t + 0.5
        c = rng.normal(size=(4, num_pieces))
        x = np.concatenate([rng.uniform(-5.0, 6.0, 400), bp, np.nextafter(bp, np.inf),
                            np.nextafter(bp, -np.inf), [np.inf, -np.inf, np.nan]])
        uniform = grid == "uniform"
        got = np.asarray(self.run(bp, c, jnp.asarray(x), np.float64, mode, uniform, guided=True,
                                  sides=sides, block_n=16, chunks=2, tables="shared"))
        expected = _ppoly_expected(bp, c, x, jnp.float64, mode, uniform)
        assert_close(got, expected, rtol=tol(np.float64, "kernel"), atol=1e-12)
        inside = (x >= bp[0]) & (x < bp[-1]) & (np.arange(x.shape[0]) < 400)
        assert_close(got[inside], PPoly(c, bp)(x[inside]), rtol=1e-12, atol=1e-12)

    @pytest.mark.parametrize("sides", [True, False], ids=["side_rows", "knots"])
    @pytest.mark.parametrize("dtype, degree", [("float32", 3), ("float32", 0),
                                               ("bfloat16", 2)])
    def test_guided_lookup_float32_tables(self, dtype, degree, sides):
        # float32: (below, split) travel as one 64-bit word (unpaired for degree 0); with
        # side rows no knot is looked up (what the public float32 path runs)
        bp = (4.0 * np.sinh(2.0 * np.linspace(-1.0, 1.0, 65)) / np.sinh(2.0)).astype(np.float32)
        c = np.random.default_rng(12).normal(size=(degree + 1, 64)).astype(np.float32)
        x = np.concatenate([np.random.default_rng(13).uniform(-5.0, 5.0, 300), bp,
                            np.nextafter(bp, np.float32(np.inf)),
                            np.nextafter(bp, np.float32(-np.inf))]).astype(np.float32)
        xs = jnp.asarray(x, dtype)
        got = self.run(bp, c, xs, np.float32, "extend", False, guided=True, sides=sides,
                       block_n=64, tables="shared")
        expected = _ppoly_expected(bp, c, np.asarray(xs, np.float32), jnp.float32, "extend",
                                   False)
        if dtype == "float32":
            terms = np.sum(np.abs(c)) * 5.0 ** degree
            assert_close(got, expected, rtol=tol(np.float32, "kernel"),
                         atol=tol(np.float32, "kernel") * terms)
        else:
            _check_16bit(got, expected, dtype)

    def test_side_rows_float32_within_a_few_ulp_of_float64(self):
        # a smooth function on graded pieces, every breakpoint -1 ulp included: the
        # points left of their bucket's breakpoint evaluate the re-expanded piece below
        bp = (4.0 * np.sinh(2.0 * np.linspace(-1.0, 1.0, 129)) / np.sinh(2.0)).astype(np.float32)
        fitted, _ = fit_piecewise(np.sin, float(bp[0]), float(bp[-1]), 128, 3,
                                  breakpoints=bp.astype(np.float64))
        c = np.asarray(fitted.coeffs, np.float32)
        x = np.concatenate([np.random.default_rng(15).uniform(-4.0, 4.0, 3000),
                            np.nextafter(bp, np.float32(-np.inf)), bp]).astype(np.float32)
        got = np.asarray(self.run(bp, c, jnp.asarray(x), np.float32, "extend", False,
                                  guided=True, sides=True, tables="shared"), np.float64)
        exact = PPoly(c.astype(np.float64), bp.astype(np.float64))(x.astype(np.float64))
        assert_within_float32_ulps(got, exact, 4.0, floor=2.0 ** -3)

    @pytest.mark.parametrize("tables", ["shared", "cache"])
    @pytest.mark.parametrize("mode, uniform", [
        ("extend", False), ("extend", True), ("nan", False), ("clamp", True),
        ("periodic", False), ("periodic", True)])
    def test_modes_float64_equal_scipy_and_reference(self, mode, uniform, tables):
        bp, c, x = _ppoly_case(7, 3, uniform, seed=1)
        got = np.asarray(self.run(bp, c, jnp.asarray(x), np.float64, mode, uniform, block_n=32,
                                  tables=tables))
        expected = _ppoly_expected(bp, c, x, jnp.float64, mode, uniform)
        assert_close(got, expected, rtol=tol(np.float64, "kernel"), atol=1e-12)
        # independent oracle at the random points inside [x_0, x_P) (all modes agree with
        # scipy there; next to a breakpoint periodic folding may round onto it)
        inside = (x >= bp[0]) & (x < bp[-1]) & (np.arange(x.shape[0]) < 12)
        assert_close(got[inside], PPoly(c, bp)(x[inside]), rtol=1e-12, atol=1e-12)

    @pytest.mark.parametrize("tables", ["shared", "cache"])
    @pytest.mark.parametrize("num_pieces, degree, size, block_n, uniform", [
        (1, 0, 1, None, False),  # one piece, a constant, one point
        (2, 1, 70, 32, True),  # three programs, ragged last block
        (256, 3, 90, 64, False),  # the benchmark's table: 8-level search
        (300, 2, 50, 32, True),  # P not a power of two: padded shared columns
    ])
    def test_sizes_and_degrees(self, num_pieces, degree, size, block_n, uniform, tables):
        bp, c, x = _ppoly_case(num_pieces, degree, uniform, size=size, seed=2)
        got = self.run(bp, c, jnp.asarray(x), np.float64, "extend", uniform, block_n=block_n,
                       tables=tables)
        expected = _ppoly_expected(bp, c, x, jnp.float64, "extend", uniform)
        assert_close(got, expected, rtol=tol(np.float64, "kernel"), atol=1e-12)

    @pytest.mark.parametrize("chunks, uniform", [(1, False), (4, True)])
    def test_shared_tables_several_blocks_per_program(self, chunks, uniform):
        # 90 points in blocks of 16: 6 blocks; chunks=4 gives a second program whose
        # last two blocks lie wholly past the end
        bp, c, x = _ppoly_case(40, 3, uniform, size=90, seed=8)
        got = self.run(bp, c, jnp.asarray(x), np.float64, "extend", uniform, block_n=16,
                       tables="shared", chunks=chunks)
        expected = _ppoly_expected(bp, c, x, jnp.float64, "extend", uniform)
        assert_close(got, expected, rtol=tol(np.float64, "kernel"), atol=1e-12)

    @pytest.mark.parametrize("mode", ["clamp", "periodic", "extend"])
    def test_side_rows_keep_the_first_piece_exact_at_x0(self, mode):
        # x_1 in the first bucket: the points of piece 0 left of it take piece 0's own
        # row at its knot x_0, so a polynomial that vanishes at x_0 gives exactly 0
        # there (every x <= x_0 under "clamp"; x_0 + the period under "periodic")
        bp = np.array([0.0, 0.01, 0.5, 0.7, 1.0], np.float32)
        c = (np.random.default_rng(3).normal(size=(4, 4)) * 10).astype(np.float32)
        c[3, 0] = 0.0
        guide = guide_tables(bp)
        assert guide[0][0] == 0 and guide[1][0] == bp[1]  # bucket 0 holds x_1
        x = np.array([-5.0, -1e-3, 0.0, 1.0, 3.0, 0.004], np.float32)
        got = np.asarray(self.run(bp, c, jnp.asarray(x), np.float32, mode, False, guided=True,
                                  sides=True, tables="shared"))
        expected = np.asarray(_ppoly_expected(bp, c, x, jnp.float32, mode, False))
        at_x0 = {"clamp": [0, 1, 2], "periodic": [2, 3, 4], "extend": [2]}[mode]
        np.testing.assert_array_equal(got[at_x0], 0.0)
        assert_close(got, expected, rtol=1e-5, atol=1e-5 * np.abs(c).sum())

    def test_side_rows_need_the_guide_and_their_shape(self):
        bp, c, x = _ppoly_case(40, 3, True, seed=4)  # uniform: a guide exists
        keys, rows, params = kernel_tables(bp, c, False)
        guide = tuple(map(jnp.asarray, guide_tables(bp)))
        sides = jnp.asarray(side_rows(guide[2], rows, 3))
        evaluate = functools.partial(gtriton_piecewise().ppoly_eval_triton, keys, rows, params,
                                     jnp.asarray(x), num_pieces=40, degree=3,
                                     interpret=self.interpret)
        with pytest.raises(ValueError, match="side_rows need guide"):
            evaluate(side_rows=sides)
        with pytest.raises(ValueError, match="side_rows need guide"):
            evaluate(guide=guide, side_rows=sides, tables="cache")
        with pytest.raises(ValueError, match="side_rows must be"):
            evaluate(guide=guide, side_rows=sides[:-1])

    def test_trailing_axes_share_one_search(self):
        bp, c, x = _ppoly_case(5, 2, False, trailing=(2, 3), seed=3)
        got = self.run(bp, c, jnp.asarray(x), np.float64, "clamp", False, block_n=16)
        assert got.shape == (x.shape[0], 2, 3)
        with pytest.raises(ValueError, match="tables='shared' needs one polynomial"):
            self.run(bp, c, jnp.asarray(x), np.float64, "clamp", False, tables="shared")
        with pytest.raises(ValueError, match="tables must be"):
            self.run(bp, c[:, :, 0, 0], jnp.asarray(x), np.float64, "clamp", False,
                     tables="registers")
        expected = _ppoly_expected(bp, c, x, jnp.float64, "clamp", False)
        assert_close(got, expected, rtol=tol(np.float64, "kernel"), atol=1e-12)

    @pytest.mark.parametrize("dtype, degree, tables", [
        ("float32", 3, "shared"), ("float32", 3, "cache"), ("bfloat16", 3, None),
        ("float16", 3, "cache"),
        # float32 shared columns travel in 64-bit pairs: odd, padded and unpaired widths
        ("float32", 0, "shared"), ("float32", 2, "shared"), ("float32", 4, "shared")])
    def test_float32_and_16bit_inputs(self, dtype, degree, tables):
        bp, c, x = _ppoly_case(9, degree, dtype == "float16", seed=4)
        x = jnp.asarray(np.nan_to_num(x, nan=0.5, posinf=5.0, neginf=-5.0), dtype)
        got = self.run(bp, c, x, np.float32, "nan", dtype == "float16", block_n=32,
                       tables=tables)
        assert got.dtype == x.dtype
        expected = _ppoly_expected(bp, c, np.asarray(x, np.float32), jnp.float32, "nan",
                                   dtype == "float16")
        if dtype == "float32":
            terms = np.sum(np.abs(c)) * 3.0 ** degree  # scale of the Horner terms (|u| <= 3)
            assert_close(got, expected, rtol=tol(np.float32, "kernel"),
                         atol=tol(np.float32, "kernel") * terms)
        else:
            _check_16bit(got, expected, dtype)

    def test_jit_and_vmap(self):
        bp, c, x = _ppoly_case(6, 3, True, size=24, seed=5)
        xs = jnp.asarray(x.reshape(2, 12))
        batched = jax.jit(jax.vmap(
            lambda v: self.run(bp, c, v, np.float64, "extend", True, block_n=16)))(xs)
        expected = _ppoly_expected(bp, c, xs, jnp.float64, "extend", True)
        assert_close(batched, expected, rtol=tol(np.float64, "kernel"), atol=1e-12)
        # tables batched too (one launch per polynomial)
        keys, rows, params = kernel_tables(bp, c, True)
        two = jax.vmap(lambda r, v: gtriton_piecewise().ppoly_eval_triton(
            jnp.asarray(keys), r, jnp.asarray(params), v, num_pieces=6, degree=3,
            uniform=True, interpret=self.interpret, block_n=16))(
            jnp.stack([jnp.asarray(rows), 2 * jnp.asarray(rows)]), xs)
        assert_close(two[1], 2 * expected[1], rtol=tol(np.float64, "kernel"), atol=1e-12)


def gtriton_piecewise():
    from gpustat.triton import piecewise

    return piecewise


# -- FFM / FwFM kernels vs the reference and the brute-force oracle ---------------------------

def _fm_problem(model, dtype, seed=0, row_lengths=None):
    P = make_problem(seed) if row_lengths is None else make_problem(seed, row_lengths, p=40)
    X = CSR.from_scipy(P.X, dtype=dtype)
    V = P.V_ffm if model == "ffm" else P.V
    params = [jnp.asarray(P.field_ids), jnp.asarray(P.w0, dtype), jnp.asarray(P.w, dtype),
              jnp.asarray(V, dtype)] + ([jnp.asarray(P.R, dtype)] if model == "fwfm" else [])
    return P, X, params


def _fm_oracle(model, P):
    if model == "ffm":
        return oracle.ffm_scores(P.X, P.field_ids, P.w0, P.w, P.V_ffm)
    return oracle.fwfm_scores(P.X, P.field_ids, P.w0, P.w, P.V, P.R)


def _fm_reference(model, X, params):
    return (fref.ffm_scores if model == "ffm" else fref.fwfm_scores)(X, *params)


@needs_triton
@pytest.mark.gpu
def test_gpu_launch_after_an_interpreted_run():
    """Triton 3.6's interpreter patches triton.language for every @jit helper a kernel
    calls and never restores it; a later GPU compile in the same process then failed
    ("'ir.value' object has no attribute 'dtype'" at tl.program_id, seen on the H200 with
    the interpreted and compiled FFM tests in one worker). launch() undoes the patches."""
    from gpustat.triton import factorization

    _, X, params = _fm_problem("ffm", np.float64)
    interpreted = factorization.ffm_scores(X, *params, interpret=True)
    compiled = factorization.ffm_scores(X, *params)
    assert_close(compiled, interpreted, rtol=1e-12, atol=1e-12)


class TestFactorizationTritonKernels:
    @pytest.fixture(autouse=True, params=BACKENDS)
    def _backend(self, request):
        self.interpret = request.param == "interpret"

    def scores(self, model, X, params, **settings):
        from gpustat.triton import factorization

        fn = factorization.ffm_scores if model == "ffm" else factorization.fwfm_scores
        return fn(X, *params, interpret=self.interpret, **settings)

    @pytest.mark.parametrize("model", ["ffm", "fwfm"])
    def test_float64_equals_oracle_and_reference(self, model):
        # ragged buckets of width 1, 4, 8; empty rows; same-field pairs; a duplicate summed
        P, X, params = _fm_problem(model, np.float64)
        got = np.asarray(self.scores(model, X, params))
        assert_close(got, _fm_oracle(model, P), rtol=1e-10, atol=1e-10)
        assert_close(got, _fm_reference(model, X, params), rtol=tol(np.float64, "kernel"),
                     atol=1e-12)

    @pytest.mark.parametrize("model", ["ffm", "fwfm"])
    def test_long_rows_several_pair_steps_and_explicit_zeros(self, model):
        # widths 16 and 32 with block_p = 16: a row walks many pair steps; zeros skipped
        _, X, params = _fm_problem(model, np.float64, seed=1, row_lengths=(17, 30, 9, 0, 25))
        data = X.data.at[jnp.asarray([0, 20, 40])].set(0.0)
        X = X.with_data(data)
        got = self.scores(model, X, params, block_p=16, block_rows=2)
        assert_close(got, _fm_reference(model, X, params), rtol=tol(np.float64, "kernel"),
                     atol=1e-12)

    @pytest.mark.parametrize("model", ["ffm", "fwfm"])
    def test_no_factors_scores_the_linear_model(self, model):
        """k = 0 (V with an empty last axis): every score is w0 + x . w."""
        P, X, params = _fm_problem(model, np.float64)
        params[3] = params[3][..., :0]
        got = self.scores(model, X, params)
        assert_close(got, P.w0 + P.X @ P.w, rtol=1e-12, atol=1e-12)

    @pytest.mark.parametrize("data_dtype", ["float32", "bfloat16"])
    def test_float32_and_16bit_values(self, data_dtype):
        P, X, params = _fm_problem("ffm", np.float64)
        X = CSR.from_scipy(P.X, dtype=jnp.dtype(data_dtype))
        params32 = [params[0]] + [a.astype(jnp.float32) for a in params[1:]]
        got = self.scores("ffm", X, params32)
        assert got.dtype == jnp.float32
        expected = _fm_reference("ffm", X, [params[0]] + [a.astype(jnp.float64)
                                                          for a in params[1:]])
        assert_close(got, expected, rtol=20 * tol(np.float32, "kernel"), atol=1e-5)

    @pytest.mark.parametrize("model", ["ffm", "fwfm"])
    def test_float32_values_near_1e20_score_like_float64(self, model):
        """V times x before the dot: 1e20 values with 1e-21 factors do not underflow."""
        large, error = make_large_value_problem()
        X = CSR.from_scipy(large.X, dtype=np.float32)
        V = large.V_ffm if model == "ffm" else large.V
        params = [jnp.asarray(large.field_ids, jnp.int32),
                  *(jnp.asarray(a, jnp.float32) for a in (large.w0, large.w, V))]
        if model == "fwfm":
            params.append(jnp.asarray(large.R, jnp.float32))
        got = np.asarray(self.scores(model, X, params))
        assert np.all(np.isfinite(got))
        assert np.all(np.abs(got - _fm_oracle(model, large))
                      <= 16 * np.finfo(np.float32).eps * error[model])

    def test_multiclass_vmap_and_jit(self):
        _, X, params = _fm_problem("fwfm", np.float64)
        field_ids, w0, w, V, R = params
        stacked = (jnp.stack([w0, w0 + 1]), jnp.stack([w, -w]), jnp.stack([V, 2 * V]),
                   jnp.stack([R, R.T]))
        got = jax.jit(jax.vmap(lambda *a: self.scores("fwfm", X, [field_ids, *a])))(*stacked)
        for c in range(2):
            expected = _fm_reference("fwfm", X, [field_ids, *(a[c] for a in stacked)])
            assert_close(got[c], expected, rtol=tol(np.float64, "kernel"), atol=1e-12)


# -- the public functions with backend="triton" (GPU) -----------------------------------------

@pytest.mark.gpu
class TestPublicTritonBackend:
    @pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16", "float16"])
    @pytest.mark.parametrize("uniform", [False, True], ids=["search", "uniform"])
    def test_ppoly_eval_equals_reference(self, dtype, uniform):
        bp, c, x = _ppoly_case(256, 3, uniform, size=100_003, seed=6)
        table = np.float64 if dtype == "float64" else np.float32
        pp = PiecewisePolynomial(bp.astype(table), c.astype(table), extrapolate="nan")
        xs = jnp.asarray(np.nan_to_num(x, nan=0.5, posinf=5.0, neginf=-5.0), dtype)
        got = ppoly_eval(pp, xs, backend="triton")
        expected = ppoly_eval(pp, xs, backend="reference")
        assert got.dtype == xs.dtype
        if dtype in ("float64", "float32"):
            terms = np.sum(np.abs(c), axis=0).max() * 3.0 ** 3
            assert_close(got, expected, rtol=tol(dtype, "kernel"),
                         atol=tol(dtype, "kernel") * terms)
        else:
            _check_16bit(got, ppoly_eval(pp, xs.astype(jnp.float32), backend="reference"),
                         dtype)

    def test_ppoly_eval_trailing_grad_jit_vmap(self):
        bp, c, x = _ppoly_case(16, 3, False, trailing=(3,), size=64, seed=7)
        pp = PiecewisePolynomial(bp, c, extrapolate="clamp")
        xs = jnp.asarray(np.nan_to_num(x, nan=0.5, posinf=5.0, neginf=-5.0).reshape(8, 8))
        expected = ppoly_eval(pp, xs, backend="reference")
        jitted = jax.jit(lambda p, v: ppoly_eval(p, v, backend="triton"))(pp, xs)
        assert_close(jitted, expected, rtol=1e-12, atol=1e-12)
        mapped = jax.vmap(lambda v: ppoly_eval(pp, v, backend="triton"))(xs)
        assert_close(mapped, expected, rtol=1e-12, atol=1e-12)
        grad = jax.grad(lambda v: ppoly_eval(pp, v, backend="triton").sum())(xs)
        assert_close(grad, jax.grad(lambda v: ppoly_eval(pp, v, backend="reference").sum())(xs),
                     rtol=1e-12, atol=1e-12)

    @pytest.mark.parametrize("model", ["ffm", "fwfm"])
    def test_predict_equals_reference_with_grad(self, model):
        fn, args = _small_fm_args(model)
        got = fn(*args, backend="triton")
        assert_close(got, fn(*args, backend="reference"), rtol=1e-12, atol=1e-12)
        X = CSR.from_scipy(args[0])

        def loss(w, backend):
            return fn(X, args[1], args[2], w, *args[4:], backend=backend).sum()

        w = jnp.asarray(args[3])
        assert_close(jax.jit(jax.grad(loss), static_argnums=1)(w, "triton"),
                     jax.grad(loss)(w, "reference"), rtol=1e-12, atol=1e-12)
