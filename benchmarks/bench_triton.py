"""Benchmarks: jax-triton kernels vs the Pallas kernels vs XLA's reference, one run.

Piecewise evaluation (the cases of ``bench_piecewise.py``: P = 256 cubic pieces
on [-8, 8], sinh-graded or uniform breakpoints):

* N = 2^26 points (far beyond L2): float32 search and uniform, bfloat16 search
  and uniform, float64 search and uniform; bytes moved = x read + y written;
* N = 2e6 (torchPACE's shape, L2-resident: rotating buffers, 10 calls per
  repetition), float32 search and uniform.

FM scoring (the spec's CTR anchor): 2^18 rows, one feature in each of 16 fields
(16 nonzeros per row, Zipf-like feature frequencies over 100k features), k = 8;
FFM and FwFM, float32 and float64.

Every kernel output is checked against XLA's reference at the benchmark size
before it is timed. Each case records Pallas (its default settings, the ones
``"auto"`` runs), Triton (several launch settings; ``default`` marks the one the
wrapper uses) and XLA; ``speedup_vs_pallas`` compares Triton with Pallas's default. Piecewise cases
also record ``triton_floor_one_piece``: the shared-memory kernel on one cubic piece
(no search, broadcast lookups), the cost of the kernel's streaming structure alone,
and at 2e6 points ``axpb``, a trivial ``a*x+b`` timed the same way.
Without a CUDA GPU the script runs one tiny case of each kind in the interpreters (a smoke
test). ``GPUSTAT_TRITON_CASES=piecewise`` (or ``factorization``) runs one group only.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.bench_piecewise import device_check, make_pp, points
from benchmarks.harness import (
    Recorder,
    check_close,
    main_from_args,
    rotating_copies,
    time_fn,
    x64_for,
)
from gpustat._backend import cuda_gpu_available
from gpustat.csr import CSR
from gpustat.pallas import factorization as pallas_fm
from gpustat.pallas.piecewise import ppoly_eval_tables
from gpustat.piecewise import PiecewisePolynomial, ppoly_eval
from gpustat.reference import factorization as reference_fm
from gpustat.reference.piecewise import guide_tables, kernel_tables, ppoly_eval_reference, side_rows

NUM_PIECES, DEGREE = 256, 3
# Triton launch settings tried per piecewise case: (tables, block_n, num_warps, chunks,
# lookup); None = the wrapper's defaults with the tables the public path passes (the
# guide, and side rows for float32). lookup: "knots" (the bucket lookup of guide_tables),
# "sides" (the same with side_rows: no knot lookup) or False (search or uniform guess).
# "shared" stages the tables in shared memory, "cache" gathers them from global memory
# through L1; "floor" is the shared kernel on a single cubic piece (no search, every
# gather a broadcast): the cost of streaming x and y plus Horner in that structure.
PPOLY_VARIANTS = {  # by table itemsize
    4: [None, ("shared", 4096, 8, 1, False), ("shared", 4096, 8, 1, "knots"),
        ("shared", 2048, 4, 8, "knots"), ("shared", 2048, 8, 4, "knots"),
        ("shared", 2048, 8, 4, "sides"), ("shared", 2048, 4, 8, "sides"),
        ("shared", 2048, 8, 8, False), ("floor", 4096, 8, 1, False)],
    8: [None, ("shared", 4096, 8, 1, False), ("shared", 2048, 16, 1, "knots"),
        ("shared", 4096, 32, 1, "knots"), ("shared", 2048, 8, 1, "knots"),
        ("shared", 1024, 8, 8, "knots"), ("floor", 4096, 8, 1, False)],
}
# FFM/FwFM settings tried: overrides of kernel_settings (empty = default)
FM_VARIANTS = [{}, {"block_rows": 1}, {"block_rows": 4, "num_warps": 8}, {"block_p": 64}]
FM_ROWS, FM_FIELDS, FM_FEATURES, FM_K = 1 << 18, 16, 100_000, 8


def _ppoly_fns(pp, interpret: bool):
    """(pallas, triton(settings), xla) jitted evaluations of ``pp`` on a stream x."""
    from gpustat.triton.piecewise import ppoly_eval_triton

    def tables_of(p):
        return kernel_tables(np.asarray(p.breakpoints), np.asarray(p.coeffs), p.uniform)

    statics = dict(num_pieces=NUM_PIECES, degree=DEGREE, uniform=pp.uniform, interpret=interpret)
    pallas = jax.jit(functools.partial(ppoly_eval_tables, *tables_of(pp), **statics))
    one_piece = PiecewisePolynomial(np.asarray(pp.breakpoints)[[0, -1]],
                                    np.asarray(pp.coeffs)[:, :1])
    guide = guide_tables(np.asarray(pp.breakpoints))
    sides = side_rows(guide[2], tables_of(pp)[1], DEGREE)
    public_sides = sides if np.dtype(pp.dtype) == np.float32 else None

    def triton(variant):
        if variant is None:
            return jax.jit(functools.partial(ppoly_eval_triton, *tables_of(pp), guide=guide,
                                             side_rows=public_sides, **statics))
        tables, block_n, num_warps, chunks, lookup = variant
        settings = dict(statics, block_n=block_n, num_warps=num_warps, tables=tables,
                        chunks=chunks, guide=guide if lookup else None,
                        side_rows=sides if lookup == "sides" else None)
        if tables == "floor":
            settings.update(num_pieces=1, uniform=False, tables="shared")
            return jax.jit(functools.partial(ppoly_eval_triton, *tables_of(one_piece),
                                             **settings))
        return jax.jit(functools.partial(ppoly_eval_triton, *tables_of(pp), **settings))

    xla = jax.jit(functools.partial(ppoly_eval_reference, pp.breakpoints, pp.coeffs,
                                    uniform=pp.uniform))
    return pallas, triton, xla


def _record_case(rec, name, shape, dtype, timings, nbytes, items, item_name, errors, labels):
    """Record xla, pallas and every triton variant of one case; return the summary row."""
    xla_ms, pallas_ms = timings["xla"].median_ms, timings["pallas"].median_ms
    common = dict(shape=shape, dtype=dtype, bytes_moved=nbytes, items=items, item_name=item_name)
    rec.record(f"{name}/xla_reference", backend="xla", timing=timings["xla"], **common)
    rec.record(f"{name}/pallas", backend="pallas", timing=timings["pallas"],
               baseline=f"{name}/xla_reference",
               extra={"max_rel_error": errors["pallas"], "speedup_vs_xla": xla_ms / pallas_ms,
                      "settings": "default"}, **common)
    triton_keys = [k for k in timings if k not in ("xla", "pallas")]
    floors = [k for k in triton_keys if labels[k].startswith("tables=floor")]
    triton_keys = [k for k in triton_keys if k not in floors]
    best = min(triton_keys, key=lambda k: timings[k].median_ms)
    for key in floors:  # diagnostic: one cubic piece, no search, broadcast gathers
        rec.record(f"{name}/triton_floor_one_piece", backend="triton", timing=timings[key],
                   baseline=f"{name}/pallas", extra={"settings": labels[key]}, **common)
    for key in triton_keys:
        ms = timings[key].median_ms
        rec.record(f"{name}/triton", backend="triton", timing=timings[key],
                   baseline=f"{name}/pallas",
                   extra={"max_rel_error": errors[key], "settings": labels[key],
                          "default": labels[key] == "default", "best_variant": key == best,
                          "speedup_vs_pallas": pallas_ms / ms, "speedup_vs_xla": xla_ms / ms},
                   **common)
    return (name, xla_ms, pallas_ms, timings[triton_keys[0]].median_ms,
            timings[best].median_ms, labels[best])


def _piecewise_cases(rec, on_gpu: bool, quick: bool):
    big = 1 << 26 if on_gpu else 1 << 9
    small = 2_000_000 if on_gpu else 300

    def label(v):
        return "default" if v is None else (f"tables={v[0]},block_n={v[1]},num_warps={v[2]}"
                                             + (f",chunks={v[3]}" if v[3] else "")
                                             + (f",{v[4]}" if v[4] else ""))
    cases = [("search", np.float32, jnp.float32, big), ("uniform", np.float32, jnp.float32, big),
             ("search", np.float32, jnp.bfloat16, big), ("uniform", np.float32, jnp.bfloat16, big),
             ("search", np.float64, jnp.float64, big), ("uniform", np.float64, jnp.float64, big),
             ("search", np.float32, jnp.float32, small),
             ("uniform", np.float32, jnp.float32, small)]
    summary = []
    for grid, table_dtype, x_dtype, n in cases if on_gpu else cases[:1]:
        with x64_for(x_dtype):  # 64-bit types for the float64 cases only
            pp = make_pp(grid == "uniform", table_dtype)
            pallas, triton, xla = _ppoly_fns(pp, interpret=not on_gpu)
            variants = PPOLY_VARIANTS[np.dtype(table_dtype).itemsize]
            variants = variants if on_gpu else variants[:2]
            labels = {v: label(v) for v in variants}
            cached = n < 1 << 24
            sets = (rotating_copies(lambda i, n=n, d=x_dtype: (points(n, d, 10 + i),),
                                    n * jnp.dtype(x_dtype).itemsize) if cached
                    else [(points(n, x_dtype, 1),)])
            calls = 10 if cached else None  # None: back-to-back calls filling >= 2 ms
            expected = xla(*sets[0])
            f64 = jnp.dtype(x_dtype) == jnp.float64
            tol = dict(rtol=1e-2, atol=8.0) if x_dtype == jnp.bfloat16 else (
                dict(rtol=1e-12, atol=1e-9) if f64 else dict(rtol=2e-6, atol=2e-3))
            fns = {"pallas": pallas, **{v: triton(v) for v in variants}}
            errors, timings = {}, {}
            size = {1 << 26: "2^26", 2_000_000: "2e6"}.get(n, str(n))
            name = f"{grid}_{jnp.dtype(x_dtype).name}_N{size}"
            for key, fn in fns.items():
                try:
                    # the floor computes another function: timed, not checked
                    floor = key is not None and key != "pallas" and key[0] == "floor"
                    errors[key] = (None if floor else
                                   device_check(f"{name}/{key}", fn(*sets[0]), expected, **tol))
                    timings[key] = time_fn(fn, sets, calls_per_repeat=calls)
                except Exception as err:  # one failing variant must not lose the others
                    print(f"{name}/{key} FAILED: {type(err).__name__}: {str(err)[:400]}")
                    if key == "pallas":
                        raise
            variants = [v for v in variants if v in timings]
            timings["xla"] = time_fn(xla, sets, calls_per_repeat=calls)
            nbytes = 2 * n * jnp.dtype(x_dtype).itemsize
            if not cached:  # what a user's pp(x) runs (backend "auto": guide, 16-bit table)
                public = jax.jit(lambda v, pp=pp: ppoly_eval(pp, v))
                error = device_check(f"{name}/public_auto", public(*sets[0]), expected, **tol)
                timing = time_fn(public, sets, calls_per_repeat=calls)
                rec.record(f"{name}/public_auto", shape=(n,), dtype=jnp.dtype(x_dtype).name,
                           backend="auto", timing=timing, bytes_moved=nbytes, items=n,
                           item_name="points", baseline=f"{name}/xla_reference",
                           extra={"max_rel_error": error,
                                  "speedup_vs_xla": timings["xla"].median_ms / timing.median_ms})
            if cached:  # torchPACE's shape: the trivial a*x+b timed the same way
                rec.record(f"{name}/axpb", shape=(n,), dtype=jnp.dtype(x_dtype).name, backend="xla",
                           timing=time_fn(jax.jit(lambda v: 1.5 * v + 0.25), sets,
                                          calls_per_repeat=calls),
                           bytes_moved=nbytes, items=n, item_name="points")
            summary.append(_record_case(rec, name, (n,), jnp.dtype(x_dtype).name,
                                        {k: timings[k] for k in ["xla", "pallas", *variants]},
                                        nbytes, n, "points", errors, labels))
    return summary


def ctr_rows(n: int, seed: int = 0) -> tuple[CSR, np.ndarray]:
    """One-hot rows: one feature per field, Zipf-like within each field's block of features."""
    rng = np.random.default_rng(seed)
    per_field = FM_FEATURES // FM_FIELDS
    rank = np.minimum(rng.zipf(1.2, size=(n, FM_FIELDS)) - 1, per_field - 1)
    indices = (np.arange(FM_FIELDS) * per_field + rank).reshape(-1).astype(np.int32)
    indptr = np.arange(n + 1, dtype=np.int64) * FM_FIELDS
    field_ids = np.repeat(np.arange(FM_FIELDS), per_field).astype(np.int32)
    field_ids = np.concatenate([field_ids, np.full(FM_FEATURES - field_ids.size, FM_FIELDS - 1,
                                                   np.int32)])
    X = CSR(np.ones(indices.size, np.float32), indices, indptr, (n, FM_FEATURES))
    return X, field_ids


def _fm_cases(rec, on_gpu: bool, quick: bool):
    from gpustat.triton import factorization as triton_fm

    n = FM_ROWS if on_gpu else 64
    variants = list(range(len(FM_VARIANTS) if on_gpu else 2))
    labels = {i: ", ".join(f"{k}={v}" for k, v in FM_VARIANTS[i].items()) or "default"
              for i in variants}
    X32, field_ids = ctr_rows(n)
    rng = np.random.default_rng(1)
    summary = []
    for dtype in (jnp.float32, jnp.float64) if on_gpu else (jnp.float64,):
        with x64_for(dtype):
            X = X32 if dtype == jnp.float32 else X32.with_data(X32.data.astype(jnp.float64))
            fields = jnp.asarray(field_ids)
            w0 = jnp.asarray(0.1, dtype)
            w = jnp.asarray(rng.normal(0, 0.1, FM_FEATURES), dtype)
            for model in ("ffm", "fwfm") if on_gpu else ("fwfm",):
                shape_v = (FM_FEATURES, FM_FIELDS, FM_K) if model == "ffm" else (FM_FEATURES, FM_K)
                V = jnp.asarray(rng.normal(0, 0.1, shape_v), dtype)
                args = (X, fields, w0, w, V)
                if model == "fwfm":
                    args = (*args, jnp.asarray(rng.normal(1, 0.2, (FM_FIELDS, FM_FIELDS)), dtype))
                ref_fn = jax.jit(getattr(reference_fm, f"{model}_scores"))
                pallas = jax.jit(functools.partial(getattr(pallas_fm, f"{model}_scores"),
                                                   interpret=not on_gpu))
                fns = {"pallas": pallas}
                for i in variants:
                    fns[i] = jax.jit(functools.partial(getattr(triton_fm, f"{model}_scores"),
                                                       interpret=not on_gpu, **FM_VARIANTS[i]))
                expected = ref_fn(*args)
                scale = float(jnp.max(jnp.abs(expected)))
                f64 = dtype == jnp.float64
                tol = dict(rtol=1e-12, atol=1e-12 * scale) if f64 else dict(rtol=2e-5,
                                                                            atol=2e-5 * scale)
                errors, timings = {}, {}
                name = f"{model}_{jnp.dtype(dtype).name}_n{n}_f{FM_FIELDS}_k{FM_K}"
                for key, fn in fns.items():
                    errors[key] = check_close(f"{name}/{key}", fn(*args), expected, **tol)
                    timings[key] = time_fn(fn, [args])
                timings["xla"] = time_fn(ref_fn, [args])
                summary.append(_record_case(rec, name, (n, FM_FIELDS), jnp.dtype(dtype).name,
                                            timings, None, n, "rows", errors, labels))
    return summary


def run(quick: bool = True, out: Path | None = None) -> None:
    on_gpu = cuda_gpu_available()
    rec = Recorder("triton", out)
    copy_gbs = rec.measure_copy(1 << 30 if on_gpu else 1 << 22)
    only = os.environ.get("GPUSTAT_TRITON_CASES", "piecewise,factorization").split(",")
    summary = ((_piecewise_cases(rec, on_gpu, quick) if "piecewise" in only else [])
               + (_fm_cases(rec, on_gpu, quick) if "factorization" in only else []))
    print(f"\ncopy bandwidth {copy_gbs:.0f} GB/s on {rec.device}")
    print(f"{'case':34s} {'xla ms':>9s} {'pallas ms':>10s} {'triton ms':>10s} "
          f"{'best ms':>9s} {'pallas/triton':>13s}  best triton settings")
    for name, xla_ms, pallas_ms, triton_ms, best_ms, label in summary:
        print(f"{name:34s} {xla_ms:9.4f} {pallas_ms:10.4f} {triton_ms:10.4f} {best_ms:9.4f} "
              f"{pallas_ms / triton_ms:13.2f}  {label}")


if __name__ == "__main__":
    main_from_args(run, "triton")
