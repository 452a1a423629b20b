"""Benchmarks for batched border solves: the Pallas kernel vs the XLA reference and scipy.

Acceptance case (issue): B = 100,000 atoms, n_a ~ U[8, 128], d = 2, k_a ~ U[4, 12],
float64. Input: 6.8M rows x (4 + 2 + 2 k_a) + the borders ~ 1.26 GB (``input_bytes``,
what the roofline fraction counts).

The one-stage kernel (H100, b8b3cb9) took 11.9 ms (3.8% of copy): the serial
16-column Schur Cholesky per program set the time (~65 ns per atom at 1 warp,
flat in the rows). The three-stage solve takes it off that path. Prediction:
stage 1 (row pass) reads the input once (1.26 GB) and writes S and r (100k x 272 x
8 B = 0.22 GB): ~0.55 ms at ~2.7 TB/s if bandwidth-bound, ~1.5-2 ms if the
per-program overhead of ~10-20 ns per atom remains; stage 2 (batched cuSOLVER
Cholesky + two batched triangular solves on (100k, 16, 16)) reads S ~3x: ~0.1-1 ms;
stage 3 re-reads the input (1.26 GB) and writes delta_t (0.11 GB): ~0.5 ms. Total
~1.2-3.5 ms. ``stage_*`` cases time each stage alone.

Outcome (H100, commit 79e89cb, same run): 6.55 ms with a 32-row cap (192 GB/s, 6.9%
of the 2766 GB/s copy; XLA reference 49.25 ms, 7.5x); a 64-row cap 13.6-13.9 ms,
128-row 51.9 ms, whatever the back-substitution chunk. The row pass with large tiles
(spilling, see docs/border.md) now dominates; the stage breakdown did not run there
(weak-typed ridges, fixed since), so the split per stage is not yet measured.

``--quick`` runs issue 37's acceptance cases alone: the d = 4, 8, 16, 32 classes (the
default kernel, the XLA reference and the scipy loop on a subset, same run; d = 8 also
with the ``D8_CONFIGS``) and the charter shape (one atom, N = 5000, d = 16, k = 6: the
kernel beside scipy's cho_factor on the assembled dense system).
``GPUSTAT_BENCH_SMALL=1`` shrinks those to a few atoms and runs the kernels in interpret
mode (CPU smoke run).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from scipy.linalg import cho_factor, cho_solve

from benchmarks.harness import Recorder, check_close, main_from_args, time_fn
from gpustat.border import BorderBatch, solve_batched_border
from gpustat.pallas import border as kernels
from gpustat.pallas.border import KernelConfig, solve_border_pallas
from gpustat.reference.border import BorderLayout

RIDGE = 1e-6
SCIPY_SAMPLE = 2000
SMALL = os.environ.get("GPUSTAT_BENCH_SMALL") == "1"
KERNEL = "interpret" if SMALL else "pallas"
# Solves issued back to back per timed repetition, as in a Newton loop that keeps its
# state on the device (bench_distributed does the same); one call per repetition adds
# the host's launch and synchronisation latency to every solve, recorded separately as
# ``solve_single_call`` for the best config.
BACK_TO_BACK = 10
BENCH_ATOMS = 100_000
# Config sweep: KernelConfig(tile_elems, max_block_rows, elems_per_warp, max_warps,
# back_rows, back_warps). Row pass: one program per atom (K = 16 for k_a in [4, 12];
# one-chunk buckets of 16, 32, 64 rows, longer atoms streamed in chunks of the cap), now
# without the Schur Cholesky; back substitution: one program per chunk of back_rows rows.
# Measured (H100, 57462a9, 10 back to back): r16 at 2 warps 3.40 ms, at 1 warp 3.54 ms,
# r32 5.67 ms, r64 37.6 ms (the row pass's per-lane accumulators spill past 16 rows);
# with per-chunk reductions (78d3496, one call per repetition) r16 5.25 ms, r32 6.86 ms.
# --quick runs the first five, the default first.
CONFIGS = {
    "r16_e128_b32w1": KernelConfig(4096, 16, 128, 4, 32, 1),
    "r16_b32w1": KernelConfig(4096, 16, 512, 4, 32, 1),
    "r16_b16w1": KernelConfig(4096, 16, 512, 4, 16, 1),
    "r32_b32w1": KernelConfig(4096, 32, 512, 4, 32, 1),
    "r64_b32w1": KernelConfig(4096, 64, 512, 4, 32, 1),
    "r64_b64w2": KernelConfig(4096, 64, 512, 4, 64, 2),
    "r128_b32w1": KernelConfig(4096, 128, 512, 4, 32, 1),
    "r64_e1024_b32w1": KernelConfig(4096, 64, 1024, 4, 32, 1),
}


def random_packed_batch(b: int, d: int, n_range, k_range, seed: int = 0) -> BorderBatch:
    """Random PD atoms generated directly in the packed layout (vectorised numpy)."""
    rng = np.random.default_rng(seed)
    n_rows = rng.integers(n_range[0], n_range[1] + 1, size=b)
    k_dims = rng.integers(k_range[0], k_range[1] + 1, size=b)
    layout = BorderLayout(d, n_rows, k_dims)
    N = layout.num_rows
    A = rng.normal(size=(N, d, d))
    H_tt = A.transpose(0, 2, 1) @ A + np.eye(d)
    scale = np.repeat(1.0 / np.sqrt(n_rows * d * k_dims), n_rows * d * k_dims)
    H_tb = rng.normal(size=int(layout.cross_offsets[-1])) * scale
    g_t = rng.normal(size=(N, d))
    H_bb = np.empty(int(layout.hbb_offsets[-1]))
    for k in np.unique(k_dims):
        atoms = np.flatnonzero(k_dims == k)
        Bm = rng.normal(size=(atoms.size, k, k))
        blocks = Bm.transpose(0, 2, 1) @ Bm / k + 2.0 * np.eye(k)
        H_bb[layout.hbb_index(atoms)] = blocks.reshape(-1)
    g_b = rng.normal(size=int(layout.border_offsets[-1]))
    return BorderBatch.from_packed(layout, *(jnp.asarray(x) for x in (H_tt, H_tb, g_t, H_bb,
                                                                      g_b)))


def input_bytes(batch: BorderBatch) -> int:
    return sum(x.size * x.dtype.itemsize for x in (batch.H_tt, batch.H_tb, batch.g_t,
                                                   batch.H_bb, batch.g_b))


def scipy_seconds_per_atom(batch: BorderBatch, sample: int):
    """Dense per-atom cho_factor + cho_solve on the host over ``sample`` atoms (assembly
    excluded from the timing); returns seconds per atom, the atom ids and the solutions."""
    atoms = np.random.default_rng(1).choice(batch.num_atoms, size=sample, replace=False)
    systems = []
    for a in atoms:
        H_tt, H_tb, g_t, H_bb, g_b = (np.asarray(x) for x in batch.atom(int(a)))
        n, d, k = H_tb.shape
        m = n * d + k
        H = np.zeros((m, m))
        for i in range(n):
            H[i * d:(i + 1) * d, i * d:(i + 1) * d] = H_tt[i] + RIDGE * np.eye(d)
            H[i * d:(i + 1) * d, n * d:] = H_tb[i]
            H[n * d:, i * d:(i + 1) * d] = H_tb[i].T
        H[n * d:, n * d:] = H_bb + RIDGE * np.eye(k)
        systems.append((H, -np.concatenate([g_t.ravel(), g_b])))
    start = time.perf_counter()
    solutions = [cho_solve(cho_factor(H, lower=True), rhs) for H, rhs in systems]
    seconds = (time.perf_counter() - start) / sample
    return seconds, atoms, solutions


def stage_breakdown(rec: Recorder, batch: BorderBatch, config: KernelConfig) -> None:
    """Time each stage alone on the whole batch (K groups in sequence): the row pass,
    the batched XLA Schur solve on its outputs, and the back substitution."""
    lay = batch.layout
    arrays = tuple(x.reshape(-1) for x in (batch.H_tt, batch.H_tb, batch.g_t, batch.H_bb,
                                           batch.g_b))
    ridges = jnp.full((batch.num_atoms,), RIDGE, batch.H_tt.dtype)  # weak-typed ridges break the
    # Triton lowering of the row pass (f64 vs f32 operands); solve_border_pallas casts them
    groups = kernels._group_positions(lay)

    @jax.jit
    def rows(arrays):
        return [kernels._row_pass(lay, K, atoms, arrays, ridges, config=config,
                                  interpret=False, spare=0) for K, atoms in groups.items()]

    def schur_with(unrolled):
        @jax.jit
        def schur(passes):
            return [kernels._schur_solve(S, r, jnp.asarray(lay.k_dims[atoms]), ridges[atoms],
                                         *stats,
                                         unrolled=unrolled and K <= kernels.MAX_UNROLLED_K)[0]
                    for (S, r, stats), (K, atoms) in zip(passes, groups.items())]
        return schur

    schur, schur_batched = schur_with(True), schur_with(False)

    @jax.jit
    def back(arrays, betas):
        out = jax.ShapeDtypeStruct((lay.num_rows * lay.d,), arrays[0].dtype)
        for (K, atoms), beta in zip(groups.items(), betas):
            out = kernels._back_substitution(lay, K, atoms, arrays, ridges, beta, out,
                                             config=config, interpret=False)
        return out

    shape = (batch.num_atoms, lay.num_rows, lay.d)
    try:
        passes = jax.block_until_ready(rows(arrays))
        betas = jax.block_until_ready(schur(passes))
        check_close("stage2 unrolled vs batched", betas[0], schur_batched(passes)[0], rtol=1e-9,
                    atol=1e-11)
        cases = [("stage1_row_pass", rows, (arrays,)), ("stage2_schur_solve", schur, (passes,)),
                 ("stage2_batched_cholesky", schur_batched, (passes,)),
                 ("stage3_back_substitution", back, (arrays, betas))]
    except Exception as err:
        print(f"[border] stage breakdown failed: {type(err).__name__}: {err}"[:2000], flush=True)
        return
    for name, fn, args in cases:
        try:
            rec.record(name, shape=shape, dtype="float64", backend="pallas",
                       timing=time_fn(fn, [args]), items=batch.num_atoms, item_name="atoms")
        except Exception as err:
            print(f"[border] {name} failed: {type(err).__name__}: {err}"[:2000], flush=True)


def time_checked(rec: Recorder, case: str, backend: str, config: str, kernel, batch, want,
                 nbytes: int):
    """Check ``kernel(batch)`` against the reference solution ``want`` (values to 1e-9, every
    status 0), then time it and record ``case``; ``None`` (reported, not raised) when the
    compile or the check fails, so one failing path does not lose the others."""
    try:
        got = jax.block_until_ready(kernel(batch))
        for i, field in enumerate(("delta_t", "delta_beta", "log_det")):
            check_close(f"{case} {field}", got[i], getattr(want, field), rtol=1e-9,
                        atol=1e-11)
        np.testing.assert_array_equal(np.asarray(got[3]), 0)
        timing = time_fn(kernel, [(batch,)], calls_per_repeat=BACK_TO_BACK)
    except Exception as err:
        print(f"[border] {case} failed: {type(err).__name__}: {err}"[:2000], flush=True)
        return None
    lay = batch.layout
    rec.record(case, shape=(batch.num_atoms, lay.num_rows, lay.d), dtype="float64",
               backend=backend, timing=timing, bytes_moved=nbytes, items=batch.num_atoms,
               item_name="atoms", extra={"config": config})
    return timing


def time_kernels(rec: Recorder, case: str, batch: BorderBatch, ridges) -> None:
    """Record ``solve_<case>_pallas`` (default config) and ``solve_<case>_triton`` on
    ``batch``: the measurements behind ``backend="auto"``'s choices beyond the issue's case."""
    from gpustat.triton.border import solve_border_triton

    lay, b = batch.layout, batch.num_atoms
    for path, solve in (("pallas", solve_border_pallas), ("triton", solve_border_triton)):
        kernel = jax.jit(lambda bt, solve=solve: solve(
            bt.layout, bt.H_tt, bt.H_tb, bt.g_t, bt.H_bb, bt.g_b, ridges, ridges))
        try:
            jax.block_until_ready(kernel(batch))
            timing = time_fn(kernel, [(batch,)], calls_per_repeat=BACK_TO_BACK)
        except Exception as err:
            print(f"[border] {case} {path} failed: {type(err).__name__}: {err}"[:2000],
                  flush=True)
            continue
        rec.record(f"solve_{case}_{path}", shape=(b, lay.num_rows, lay.d),
                   dtype=str(batch.H_tt.dtype), backend=path, timing=timing,
                   bytes_moved=input_bytes(batch), items=b, item_name="atoms")


# Row-dimension classes (issue 37): atoms per class so each batch holds ~10-40M H_tt
# entries; n_a ~ U[8, 64], k_a ~ U[4, 12], float64. d <= 8 also times the fused Triton
# kernel; the scipy loop is sampled and extrapolated.
DIM_CLASSES = ({4: 4, 8: 3, 16: 2, 32: 2} if SMALL
               else {4: 20_000, 8: 10_000, 16: 4_000, 32: 1_000})
DIM_ROWS = (8, 20) if SMALL else (8, 64)
DIM_SCIPY_SAMPLE = {4: 200, 8: 200, 16: 50, 32: 20} if not SMALL else {4: 2, 8: 2, 16: 2, 32: 2}
# d = 8 runs the unrolled row pass, whose per-chunk live set (2 d tiles of 16 x K rows
# plus d (d + 1) / 2 row vectors) is about 4x d = 4's: every run (--quick too) also times
# it at 4 and 8 warps and on the looped row factorisation (tiles padded to 16)
D8_CONFIGS = {"e64": KernelConfig(elems_per_warp=64),
              "e32w8": KernelConfig(elems_per_warp=32, max_warps=8),
              "looped": KernelConfig(unrolled_d=4)}
# The charter single-system shape (spec B.7): one atom of N = 5000 rows, d = 16, k = 6,
# rho = 1e-9. Its assembled dense matrix is 80,006^2 (51 GB), so scipy's cho_factor on it
# runs at CHARTER_DENSE_ROWS rows and is extrapolated by the cube of the size; the
# block-dense scipy loop (per-row cho_factor, Schur complement, back substitution) runs at
# full size.
CHARTER = (40, 16, 6) if SMALL else (5000, 16, 6)
CHARTER_RIDGE = 1e-9
CHARTER_DENSE_ROWS = 10 if SMALL else 500
# Chunk rows x warps of the looped row factorisation (d > 8), swept on the d = 16 and 32
# classes and the charter; --quick runs the first two, the default first.
WIDE_CONFIGS = {
    "w16x2": KernelConfig(wide_rows=16, wide_warps=2),
    "w8x1": KernelConfig(wide_rows=8, wide_warps=1),
    "w16x4": KernelConfig(wide_rows=16, wide_warps=4),
    "w32x2": KernelConfig(wide_rows=32, wide_warps=2),
    "w4x1": KernelConfig(wide_rows=4, wide_warps=1),
}


def _dense_system(atom, ridge):
    """Assembled ridged ``(n d + k)^2`` matrix and right-hand side ``-g`` of one atom."""
    H_tt, H_tb, g_t, H_bb, g_b = (np.asarray(x) for x in atom)
    n, d, k = H_tb.shape
    H = np.zeros((n * d + k, n * d + k))
    for i in range(n):
        H[i * d:(i + 1) * d, i * d:(i + 1) * d] = H_tt[i] + ridge * np.eye(d)
        H[i * d:(i + 1) * d, n * d:] = H_tb[i]
        H[n * d:, i * d:(i + 1) * d] = H_tb[i].T
    H[n * d:, n * d:] = H_bb + ridge * np.eye(k)
    return H, -np.concatenate([g_t.ravel(), g_b])


def scipy_block_loop(atom, ridge):
    """One atom by the square-root Schur form in a host loop of scipy calls (per-row
    ``cho_factor``, whitening, Schur Cholesky, back substitution): ``(delta_t, delta_beta)``."""
    from scipy.linalg import solve_triangular

    H_tt, H_tb, g_t, H_bb, g_b = (np.asarray(x) for x in atom)
    n, d, k = H_tb.shape
    S = H_bb + ridge * np.eye(k)
    r = -g_b.copy()
    factors = []
    for i in range(n):
        L = cho_factor(H_tt[i] + ridge * np.eye(d), lower=True)[0]
        Y = solve_triangular(L, H_tb[i], lower=True)
        u = solve_triangular(L, g_t[i], lower=True)
        S -= Y.T @ Y
        r += Y.T @ u
        factors.append((L, Y, u))
    delta_beta = cho_solve(cho_factor(S, lower=True), r)
    delta_t = np.stack([-solve_triangular(L, u + Y @ delta_beta, lower=True, trans="T")
                        for L, Y, u in factors])
    return delta_t, delta_beta


def _fields(solution):
    """``(delta_t, delta_beta, log_det, status)`` of a solution, as :func:`time_checked`
    reads a kernel's outputs."""
    return solution.delta_t, solution.delta_beta, solution.log_det, solution.status


def sweep_wide_configs(rec: Recorder, case: str, batch: BorderBatch, ridge: float, want,
                       quick: bool) -> None:
    """``solve_<case>_<config>`` for the :data:`WIDE_CONFIGS` of the d > 8 kernel."""
    ridges = jnp.full((batch.num_atoms,), ridge, batch.H_tt.dtype)
    for name, config in list(WIDE_CONFIGS.items())[1:2 if quick else None]:
        kernel = jax.jit(lambda bt, c=config: solve_border_pallas(
            bt.layout, bt.H_tt, bt.H_tb, bt.g_t, bt.H_bb, bt.g_b, ridges, ridges, config=c))
        time_checked(rec, f"solve_{case}_{name}", "pallas", name, kernel, batch, want,
                     input_bytes(batch))


def dimension_classes(rec: Recorder, quick: bool) -> None:
    """Per row dimension d: the Pallas kernel (and the fused Triton one for d <= 8), the
    XLA reference and the scipy dense loop on one batch, checked against each other."""
    for d, b in DIM_CLASSES.items():
        try:
            batch = random_packed_batch(b, d, DIM_ROWS, (4, 12), seed=d)
            reference = jax.jit(lambda bt: solve_batched_border(bt, RIDGE, RIDGE,
                                                                backend="reference"))
            want = jax.block_until_ready(reference(batch))
            per_atom, sample, solutions = scipy_seconds_per_atom(batch, DIM_SCIPY_SAMPLE[d])
            for a, x in zip(sample[:20], solutions[:20]):
                dt, db = (np.asarray(v) for v in want.atom(int(a)))
                check_close(f"d={d} reference atom {a}", np.concatenate([dt.ravel(), db]), x,
                            rtol=1e-9, atol=1e-12)
        except Exception as err:
            print(f"[border] d={d} setup failed: {type(err).__name__}: {err}"[:2000], flush=True)
            continue
        lay, nbytes = batch.layout, input_bytes(batch)
        shape = (b, lay.num_rows, d)
        paths = ["pallas", "triton"] if d <= kernels.MAX_UNROLLED_D else ["pallas"]
        paths = [KERNEL] if SMALL or quick else paths
        best = None
        for path in paths:
            kernel = jax.jit(lambda bt, p=path: _fields(solve_batched_border(bt, RIDGE, RIDGE,
                                                                             backend=p)))
            timing = time_checked(rec, f"solve_d{d}_{path}", path, "default", kernel, batch,
                                  want, nbytes)
            if timing and (best is None or timing.median_ms < best[1].median_ms):
                best = (path, timing)
        if d > kernels.MAX_UNROLLED_D and not quick:
            sweep_wide_configs(rec, f"d{d}", batch, RIDGE, want, quick)
        if d == kernels.MAX_UNROLLED_D and not SMALL:
            ridges = jnp.full((b,), RIDGE)
            for name, config in D8_CONFIGS.items():
                kernel = jax.jit(lambda bt, c=config, r=ridges: solve_border_pallas(
                    bt.layout, bt.H_tt, bt.H_tb, bt.g_t, bt.H_bb, bt.g_b, r, r, config=c))
                time_checked(rec, f"solve_d8_{name}", "pallas", name, kernel, batch, want,
                             nbytes)
        xla = time_fn(reference, [(batch,)], calls_per_repeat=BACK_TO_BACK)
        rec.record(f"solve_d{d}_xla_reference", shape=shape, dtype="float64", backend="xla",
                   timing=xla, bytes_moved=nbytes, items=b, item_name="atoms")
        scipy_ms = per_atom * b * 1e3
        rec.record(f"solve_d{d}_scipy_cho_factor_loop", shape=shape, dtype="float64",
                   backend="scipy-host", timing=None,
                   extra={"extrapolated_ms": scipy_ms, "sample_atoms": DIM_SCIPY_SAMPLE[d],
                          "seconds_per_atom": per_atom,
                          "note": "per-atom cho_factor+cho_solve on pre-assembled dense "
                                  "matrices, subsample extrapolated to B atoms"})
        if best:
            rec.record(f"summary_d{d}", shape=shape, dtype="float64", backend=best[0],
                       timing=best[1], bytes_moved=nbytes, items=b, item_name="atoms",
                       baseline=f"solve_d{d}_xla_reference",
                       extra={"speedup_vs_xla": xla.median_ms / best[1].median_ms,
                              "speedup_vs_scipy": scipy_ms / best[1].median_ms,
                              "xla_target": 10})


def charter(rec: Recorder, quick: bool) -> None:
    """One atom of N = 5000 rows, d = 16, k = 6 through the Pallas kernel (chunks of rows
    in parallel, partial Schur sums reduced per atom), beside the XLA reference, the
    block-dense scipy loop and scipy's cho_factor on the assembled dense system."""
    n, d, k = CHARTER
    shape = (1, n, d)
    try:
        batch = random_packed_batch(1, d, (n, n), (k, k), seed=16)
        atom = tuple(np.asarray(x) for x in batch.atom(0))
        start = time.perf_counter()
        loop_dt, loop_db = scipy_block_loop(atom, CHARTER_RIDGE)
        loop_ms = (time.perf_counter() - start) * 1e3
        small = (atom[0][:CHARTER_DENSE_ROWS], atom[1][:CHARTER_DENSE_ROWS],
                 atom[2][:CHARTER_DENSE_ROWS], atom[3], atom[4])
        H, rhs = _dense_system(small, CHARTER_RIDGE)
        start = time.perf_counter()
        dense = cho_solve(cho_factor(H, lower=True), rhs)
        dense_small_ms = (time.perf_counter() - start) * 1e3
        small_dt, small_db = scipy_block_loop(small, CHARTER_RIDGE)
        check_close("charter block loop vs dense (first rows)",
                    np.concatenate([small_dt.ravel(), small_db]), dense, rtol=1e-8, atol=1e-10)
        dense_ms = dense_small_ms * ((n * d + k) / (CHARTER_DENSE_ROWS * d + k)) ** 3
    except Exception as err:
        print(f"[border] charter setup failed: {type(err).__name__}: {err}"[:2000], flush=True)
        return
    rec.record("charter_scipy_block_loop", shape=shape, dtype="float64", backend="scipy-host",
               timing=None, extra={"measured_ms": loop_ms, "note": "per-row cho_factor, Schur "
                                   "complement and back substitution in a host loop, full size"})
    rec.record("charter_scipy_cho_factor_dense", shape=shape, dtype="float64",
               backend="scipy-host", timing=None,
               extra={"extrapolated_ms": dense_ms, "measured_ms": dense_small_ms,
                      "measured_rows": CHARTER_DENSE_ROWS,
                      "note": "cho_factor+cho_solve on the assembled dense system of the "
                              "first rows, extrapolated by the cube of the matrix size"})
    want = (jnp.asarray(loop_dt), jnp.asarray(loop_db))
    nbytes = input_bytes(batch)
    timings = {}
    for path in (KERNEL, "reference"):
        solve = jax.jit(lambda bt, p=path: solve_batched_border(bt, CHARTER_RIDGE, CHARTER_RIDGE,
                                                                backend=p))
        try:
            got = jax.block_until_ready(solve(batch))
            if path == KERNEL:
                got_pallas = got
            check_close(f"charter {path} delta_t", got.delta_t, want[0], rtol=1e-8, atol=1e-10)
            check_close(f"charter {path} delta_beta", got.delta_beta, want[1], rtol=1e-8,
                        atol=1e-10)
            timings[path] = time_fn(solve, [(batch,)], calls_per_repeat=BACK_TO_BACK)
        except Exception as err:
            print(f"[border] charter {path} failed: {type(err).__name__}: {err}"[:2000],
                  flush=True)
            continue
        rec.record(f"charter_{'xla_reference' if path == 'reference' else path}", shape=shape,
                   dtype="float64", backend="xla" if path == "reference" else path,
                   timing=timings[path], bytes_moved=nbytes, items=n, item_name="rows")
    if KERNEL in timings:
        if not quick:
            sweep_wide_configs(rec, "charter", batch, CHARTER_RIDGE, got_pallas, quick)
        kernel_ms = timings[KERNEL].median_ms
        extra = {"speedup_vs_scipy_block_loop": loop_ms / kernel_ms,
                 "speedup_vs_scipy_dense": dense_ms / kernel_ms, "dense_target": 10}
        if "reference" in timings:
            extra["speedup_vs_xla"] = timings["reference"].median_ms / kernel_ms
        rec.record("charter_summary", shape=shape, dtype="float64", backend=KERNEL,
                   timing=timings[KERNEL], bytes_moved=nbytes, items=n, item_name="rows",
                   baseline="charter_xla_reference", extra=extra)


def run(quick: bool, out: Path | None) -> None:
    rec = Recorder("border", out)
    if quick or SMALL:
        dimension_classes(rec, quick=True)
        charter(rec, quick=True)
        return
    copy_gbs = rec.measure_copy()
    b = BENCH_ATOMS
    batch = random_packed_batch(b, 2, (8, 128), (4, 12))
    nbytes = input_bytes(batch)
    shape = (b, batch.layout.num_rows, 2)
    print(f"[border] atoms={b} rows={batch.layout.num_rows} input={nbytes / 1e9:.3f} GB "
          f"copy={copy_gbs:.0f} GB/s", flush=True)

    reference = jax.jit(lambda bt: solve_batched_border(bt, RIDGE, RIDGE, backend="reference"))
    want = jax.block_until_ready(reference(batch))
    assert int(jnp.sum(want.status != 0)) == 0, "benchmark batch must be PD"

    # Correctness first: the XLA reference against scipy on a sample, the kernel against both.
    per_atom, sample, scipy_solutions = scipy_seconds_per_atom(batch, SCIPY_SAMPLE)
    for a, x in zip(sample[:200], scipy_solutions[:200]):
        dt, db = (np.asarray(v) for v in want.atom(int(a)))
        check_close(f"reference atom {a}", np.concatenate([dt.ravel(), db]), x, rtol=1e-9,
                    atol=1e-12)

    ridges = jnp.full((b,), RIDGE)
    best = None
    for name, config in list(CONFIGS.items())[: 5 if quick else None]:
        kernel = jax.jit(lambda bt, c=config: solve_border_pallas(
            bt.layout, bt.H_tt, bt.H_tb, bt.g_t, bt.H_bb, bt.g_b, ridges, ridges, config=c))
        timing = time_checked(rec, f"solve_{name}", "pallas", name, kernel, batch, want,
                              nbytes)
        if timing and (best is None or timing.median_ms < best[1].median_ms):
            best = (name, timing, kernel)
    stage_breakdown(rec, batch, CONFIGS[best[0]] if best else KernelConfig())
    from gpustat.triton.border import solve_border_triton

    kernel = jax.jit(lambda bt: solve_border_triton(
        bt.layout, bt.H_tt, bt.H_tb, bt.g_t, bt.H_bb, bt.g_b, ridges, ridges))
    timing = time_checked(rec, "solve_triton", "triton", "fused", kernel, batch, want, nbytes)
    if timing and (best is None or timing.median_ms < best[1].median_ms):
        best = ("triton", timing, kernel)
    # the same batch in float32; k_a in [17, 30] (every atom in the K = 32 group)
    time_kernels(rec, "float32", BorderBatch.from_packed(batch.layout, *(
        x.astype(jnp.float32) for x in (batch.H_tt, batch.H_tb, batch.g_t, batch.H_bb,
                                        batch.g_b))), ridges.astype(jnp.float32))
    time_kernels(rec, "k32", random_packed_batch(30_000, 2, (8, 128), (17, 30), seed=1),
                 jnp.full((30_000,), RIDGE))
    xla = time_fn(reference, [(batch,)], calls_per_repeat=BACK_TO_BACK)
    rec.record("solve_xla_reference", shape=shape, dtype="float64", backend="xla", timing=xla,
               bytes_moved=nbytes, items=b, item_name="atoms")
    dimension_classes(rec, quick)
    charter(rec, quick)
    if best is None:
        print("[border] every kernel config failed", flush=True)
        return
    name, timing, kernel = best
    path = "triton" if name == "triton" else "pallas"
    rec.record("solve_single_call", shape=shape, dtype="float64", backend=path,
               timing=time_fn(kernel, [(batch,)], calls_per_repeat=1), bytes_moved=nbytes,
               items=b, item_name="atoms", extra={"config": name})
    scipy_ms = per_atom * b * 1e3
    rec.record("solve_scipy_cho_factor_loop", shape=shape, dtype="float64", backend="scipy-host",
               timing=None, extra={"extrapolated_ms": scipy_ms, "sample_atoms": SCIPY_SAMPLE,
                                   "seconds_per_atom": per_atom,
                                   "note": "per-atom cho_factor+cho_solve on pre-assembled dense "
                                           "matrices, subsample extrapolated to B atoms"})
    rec.record("summary", shape=shape, dtype="float64", backend=path, timing=timing,
               bytes_moved=nbytes, items=b, item_name="atoms", baseline="solve_xla_reference",
               extra={"config": name, "speedup_vs_xla": xla.median_ms / timing.median_ms,
                      "speedup_vs_scipy": scipy_ms / timing.median_ms,
                      "roofline_target": 0.6, "xla_target": 10, "scipy_target": 100})


if __name__ == "__main__":
    main_from_args(run, "border")
