"""Kernel calls whose CUDA lowering the tests check on a CPU machine (PALLAS.md).

One function per kernel module returns its cases: small shapes that cover every dtype,
every static branch and ragged sizes.
"""

import dataclasses
import functools
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class LoweringCase:
    """One call of a kernel wrapper: ``fn`` takes arrays positionally (static settings
    bound), ``args`` are ``jax.ShapeDtypeStruct``s."""

    module: str
    name: str
    fn: Callable
    args: Sequence[jax.ShapeDtypeStruct]


def piecewise_cases() -> list[LoweringCase]:
    from gpustat.pallas.piecewise import ppoly_eval_pallas

    settings = [  # (x dtype, table dtype, uniform, extrapolate, gather, chunks)
        (jnp.float32, jnp.float32, False, "extend", "row", 1),
        (jnp.float32, jnp.float32, True, "clamp", "row", 4),
        (jnp.float32, jnp.float32, False, "periodic", "column", 1),
        (jnp.bfloat16, jnp.float32, True, "nan", "row", 1),
        (jnp.float64, jnp.float64, False, "nan", "row", 4),
        (jnp.float64, jnp.float64, True, "extend", "column", 1),
    ]
    num_pieces, degree = 256, 3
    cases = []
    for x_dtype, dtype, uniform, extrapolate, gather, chunks in settings:
        fn = functools.partial(ppoly_eval_pallas, extrapolate=extrapolate, uniform=uniform,
                               gather=gather, chunks=chunks, block_n=1024)
        name = (f"ppoly_eval[{jnp.dtype(x_dtype).name},{'uniform' if uniform else 'search'},"
                f"{extrapolate},{gather},chunks={chunks}]")
        cases.append(LoweringCase("piecewise", name, fn, [
            jax.ShapeDtypeStruct((num_pieces + 1,), dtype),
            jax.ShapeDtypeStruct((degree + 1, num_pieces), dtype),
            jax.ShapeDtypeStruct((5000,), x_dtype),
        ]))
    return cases


def bms_cases() -> list[LoweringCase]:
    from gpustat.pallas.bms import (
        MAX_RHS,
        cell_moments,
        joint_dense,
        joint_diagonal,
        joint_hvp,
        row_derivatives,
    )

    cases = []
    def sds(shape, dtype):
        return jax.ShapeDtypeStruct(shape, dtype)

    n, n_cells, r, p_m, p_g = 5, 23, 20, 14, 12
    for dtype in (jnp.float32, jnp.float64):
        name = jnp.dtype(dtype).name
        cases.append(LoweringCase(
            "bms", f"cell_moments_{name}", cell_moments,
            [sds((n_cells,), dtype), sds((n_cells,), dtype), sds((n_cells, 4), dtype)]))
        cases.append(LoweringCase(
            "bms", f"row_derivatives_{name}", row_derivatives,
            [sds((n + 1,), jnp.int32), sds((n_cells, 4), dtype), sds((n_cells, 10), dtype),
             sds((n_cells,), jnp.int32), sds((n_cells, r, 4), dtype), sds((n_cells, r, 4), dtype),
             sds((n_cells, r - 1, 4), dtype)] + [sds((n,), dtype)] * 5
            + [sds((n, r), dtype)] * 2 + [sds((n, r, r), dtype)] + [sds((n,), dtype)] * 2))
        design = [sds((n, r, r), dtype), sds((n, p_m), dtype), sds((n, p_g), dtype)]
        p_total = p_m + p_g + r - 2
        cases.append(LoweringCase("bms", f"joint_hvp_{name}", joint_hvp,
                               [*design, sds((MAX_RHS, p_total), dtype)]))
        cases.append(LoweringCase("bms", f"joint_diagonal_{name}", joint_diagonal, design))
        cases.append(LoweringCase("bms", f"joint_dense_{name}", joint_dense, design))
    return cases


def border_cases() -> list[LoweringCase]:
    """One small ragged layout per dtype and row dimension: one-chunk atoms (K 16 and 32)
    and streamed atoms; d = 2 unrolls the row factorisation, d = 16 and 32 loop over it
    (row tiles padded to 16 and 32)."""
    from gpustat.pallas.border import KernelConfig, solve_border_pallas
    from gpustat.reference.border import BorderLayout

    cases = []
    for d in (2, 16, 32):
        layout = BorderLayout(d, np.array([3, 40, 1, 20, 200]), np.array([2, 5, 1, 20, 17]))
        for dtype in (jnp.float32, jnp.float64):
            sizes = layout.packed_sizes()
            args = [jax.ShapeDtypeStruct(sizes[name], dtype)
                    for name in ("H_tt", "H_tb", "g_t", "H_bb", "g_b")]
            args += [jax.ShapeDtypeStruct((layout.num_atoms,), dtype)] * 2
            name = f"solve_border_{jnp.dtype(dtype).name}" + ("" if d == 2 else f"_d{d}")
            cases.append(LoweringCase(
                "border", name, functools.partial(solve_border_pallas, layout), args))
    # d = 8 on the looped row factorisation (tiles padded to 16), as bench_border times it
    layout = BorderLayout(8, np.array([3, 40]), np.array([2, 17]))
    sizes = layout.packed_sizes()
    args = [jax.ShapeDtypeStruct(sizes[name], jnp.float64)
            for name in ("H_tt", "H_tb", "g_t", "H_bb", "g_b")]
    args += [jax.ShapeDtypeStruct((layout.num_atoms,), jnp.float64)] * 2
    cases.append(LoweringCase("border", "solve_border_float64_d8_looped", functools.partial(
        solve_border_pallas, layout, config=KernelConfig(unrolled_d=4)), args))
    return cases


def estimators_cases() -> list[LoweringCase]:
    from gpustat.pallas.estimators import scatter_add_rows

    cases = []
    # FM-like (m = k = 8) and FFM-like (m = F k = 128, and a ragged width 18) shapes.
    for dtype in (jnp.float32, jnp.float64):
        for n_entries, width in ((4096 * 16, 8), (300, 128), (77, 18)):
            cases.append(LoweringCase(
                "estimators", f"scatter_add_rows_e{n_entries}_m{width}_{jnp.dtype(dtype).name}",
                functools.partial(scatter_add_rows, n_targets=1000),
                (jax.ShapeDtypeStruct((n_entries,), jnp.int32),
                 jax.ShapeDtypeStruct((n_entries, width), dtype)),
            ))
    return cases


def factorization_cases() -> list[LoweringCase]:
    """One case per model (and FwFM's field-slot path) and dtype: 100 rows of up to 64
    nonzeros (two chunks of 32)."""
    from gpustat.csr import CSR, RowBuckets
    from gpustat.pallas.factorization import ffm_scores, fm_scores, fwfm_scores

    cases = []

    n, p, n_fields, k, nnz = 100, 50, 5, 6, 3000
    shape = jax.ShapeDtypeStruct

    def matrix(data, indices, indptr, rows, slots=None):
        return CSR.tree_unflatten(((n, p), RowBuckets((64,), True)),
                                  (data, indices, indptr, (rows,), slots))

    for dtype in (jnp.float32, jnp.float64):
        rows = [shape((nnz,), dtype), shape((nnz,), jnp.int32), shape((n + 1,), jnp.int32),
                shape((n,), jnp.int32)]
        fields = shape((p,), jnp.int32)
        linear = [shape((), dtype), shape((p,), dtype)]
        name = jnp.dtype(dtype).name
        cases.append(LoweringCase(
            "factorization", f"fm_{name}",
            lambda d, i, ip, r, w0, w, V: fm_scores(matrix(d, i, ip, r), w0, w, V),
            [*rows, *linear, shape((p, k), dtype)]))
        cases.append(LoweringCase(
            "factorization", f"ffm_{name}",
            lambda d, i, ip, r, f, w0, w, V: ffm_scores(matrix(d, i, ip, r), f, w0, w, V),
            [*rows, fields, *linear, shape((p, n_fields, k), dtype)]))
        cases.append(LoweringCase(
            "factorization", f"fwfm_{name}",
            lambda d, i, ip, r, f, w0, w, V, R: fwfm_scores(matrix(d, i, ip, r), f, w0, w, V, R),
            [*rows, fields, *linear, shape((p, k), dtype), shape((n_fields, n_fields), dtype)]))
        cases.append(LoweringCase(
            "factorization", f"fwfm_slots_{name}",
            lambda d, i, ip, r, s, f, w0, w, V, R: fwfm_scores(matrix(d, i, ip, r, s), f, w0, w,
                                                               V, R),
            [*rows, shape((n, n_fields), jnp.int32), fields, *linear, shape((p, k), dtype),
             shape((n_fields, n_fields), dtype)]))
    return cases


def mixture_cases() -> list[LoweringCase]:
    """Lowering cases per kernel, moments and dtype (n = 100 ragged rows, p = 16, k = 40)."""
    from gpustat.pallas.mixture import log_prob, mvn_logpdf, sample_labels_with_stats, suff_stats
    from gpustat.reference.mixture import MixtureParams

    n, p, k = 100, 16, 40

    def params_of(dtype):
        return MixtureParams(
            jax.ShapeDtypeStruct((k,), dtype), jax.ShapeDtypeStruct((k, p), dtype),
            jax.ShapeDtypeStruct((k, p, p), dtype), jax.ShapeDtypeStruct((k, p, p), dtype),
            "full")

    # the smallest blocks the tests use (float64 dots need M, K >= 16 and N >= 8)
    small = dict(block_n=16, block_k=8)
    calls = {
        "log_prob": lambda X, prm: log_prob(X, prm),
        "suff_stats_tf32x3": lambda X, prm: suff_stats(X, prm, precision="tf32x3"),
        "suff_stats_packed": lambda X, prm: suff_stats(
            X, prm, precision="tf32x3", stats_blocks=dict(moments="packed")),
        "suff_stats_small_blocks": lambda X, prm: suff_stats(
            X, prm, density_blocks=small, stats_blocks=small),
        "suff_stats_centred": lambda X, prm: suff_stats(X, prm, pivot=prm.means),
        "suff_stats_centred_tf32x3": lambda X, prm: suff_stats(X, prm, pivot=prm.means,
                                                               precision="tf32x3"),
        "mvn_logpdf": lambda X, prm: mvn_logpdf(X, prm),
        "sample_labels_with_stats": lambda X, prm: sample_labels_with_stats(
            jax.random.key(0), X, prm),
    }
    cases = []
    for dtype in (jnp.float32, jnp.float64):
        for name, fn in calls.items():
            cases.append(LoweringCase(
                "mixture", f"{name}_{jnp.dtype(dtype).name}", fn,
                (jax.ShapeDtypeStruct((n, p), dtype), params_of(dtype))))
    return cases


def label_stats_cases() -> list[LoweringCase]:
    """float32 with both dot algorithms and float64; n = 100 ragged rows, p = 16, k = 40."""
    from gpustat.pallas.mixture import LABEL_BLOCKS, label_stats

    cases = []
    n, P, k = 100, 16, 40
    algorithms = {"float32_highest": (jnp.float32, jax.lax.DotAlgorithmPreset.F32_F32_F32),
                  "float32_tf32x3": (jnp.float32, jax.lax.DotAlgorithmPreset.TF32_TF32_F32_X3),
                  "float64": (jnp.float64, None)}
    for name, (dtype, algorithm) in algorithms.items():
        cases.append(LoweringCase(
            "mixture", f"label_stats_{name}",
            functools.partial(label_stats, n_components=k, p=P, algorithm=algorithm,
                              interpret=False, **LABEL_BLOCKS["highest"]),
            (jax.ShapeDtypeStruct((n, P), dtype), jax.ShapeDtypeStruct((n,), dtype),
             jax.ShapeDtypeStruct((n,), jnp.int32))))
    return cases


def numerics_cases() -> list[LoweringCase]:
    from gpustat.pallas.numerics import KERNELS, elementwise

    return [LoweringCase("numerics", f"{name}[{jnp.dtype(dtype).name}]",
                         functools.partial(elementwise, fn=fn, num_outputs=count),
                         [jax.ShapeDtypeStruct((3000,), dtype)])
            for name, (fn, count) in KERNELS.items() for dtype in (jnp.float32, jnp.float64)]


def all_cases() -> list[LoweringCase]:
    """Every kernel module's cases."""
    return [case for cases in (piecewise_cases, bms_cases, border_cases, estimators_cases,
                               factorization_cases, mixture_cases, label_stats_cases,
                               numerics_cases) for case in cases()]
