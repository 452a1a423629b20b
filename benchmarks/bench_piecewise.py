"""Benchmarks: piecewise polynomial evaluation (PwPA) vs XLA, PyTorch and the copy roofline.

Acceptance cases (``--quick``), all P = 256 pieces, D = 3:

* N = 2^26 float32, non-uniform breakpoints: fraction of the in-run copy bandwidth
  (8 bytes/point read + written) and speed-up over the XLA-compiled reference
  (``jnp.searchsorted`` path); block-size / warp / gather variants are timed too;
* N = 2^26 float32, uniform breakpoints: vs XLA's fusion of the uniform-index reference;
* N = 2e6 (torchPACE's shape), rotating buffers: vs a trivial ``a*x+b`` timed the same way;
* N = 2^26 bfloat16 (4 B/point) and float64 (16 B/point): fraction of copy bandwidth;
* the PyTorch way (``torch.bucketize`` + gather + Horner) on the same GPU, both sizes;
* the Mosaic GPU kernel (sm_90+, :func:`mosaic_cases`): N = 2^26 float32, guided,
  searched and uniform lookups and a launch sweep, beside ``backend="auto"`` and
  ``"triton"`` through the public call.

Without a CUDA GPU the script runs tiny sizes in interpret mode (a smoke test).
"""

from __future__ import annotations

import functools
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.harness import (
    MIN_REPEATS,
    Recorder,
    Timing,
    check_close,
    main_from_args,
    rotating_copies,
    time_fn,
    x64_for,
)
from gpustat._backend import cuda_gpu_available, mosaic_unavailable_reason, triton_installed
from gpustat.pallas.piecewise import ppoly_eval_tables
from gpustat.piecewise import PiecewisePolynomial
from gpustat.reference.piecewise import kernel_tables, ppoly_eval_reference

NUM_PIECES, DEGREE = 256, 3
BIG, TORCHPACE_N = 1 << 26, 2_000_000
# (block_n, num_warps, gather, chunks, num_stages) variants timed per case; run 1 on an H100
# put every one-block-per-program variant at 35-44% of copy bandwidth, with the
# row and column gathers equal (so not L1-bound): the sweep looks for the
# occupancy / prefetch (chunks > 1) setting that keeps HBM busy.
VARIANTS = {
    "f32": [(1024, 4, "row", 1, 1), (512, 4, "row", 1, 1), (256, 2, "row", 1, 1),
            (1024, 8, "row", 1, 1), (4096, 8, "row", 1, 1), (1024, 4, "row", 4, 1),
            (1024, 4, "row", 16, 1), (512, 4, "row", 8, 1), (512, 2, "row", 8, 1),
            (2048, 8, "row", 4, 1), (1024, 8, "row", 8, 1), (1024, 4, "column", 4, 1),
            (1024, 4, "row", 16, 3), (512, 4, "row", 8, 2)],
    "bf16": [(1024, 4, "row", 1, 1), (512, 4, "row", 1, 1), (1024, 4, "row", 8, 1),
             (512, 4, "row", 8, 1), (2048, 8, "row", 4, 1), (512, 2, "row", 8, 1),
             (1024, 4, "row", 16, 3)],
    "f64": [(512, 4, "row", 1, 1), (256, 4, "row", 1, 1), (512, 4, "row", 8, 1),
            (1024, 4, "row", 4, 1), (256, 2, "row", 8, 1), (1024, 8, "row", 4, 1),
            (512, 4, "row", 8, 3)],
}


def make_pp(uniform: bool, dtype) -> PiecewisePolynomial:
    """P = 256 cubic pieces on [-8, 8]: uniform, or sinh-graded (dense near 0)."""
    t = np.linspace(-1.0, 1.0, NUM_PIECES + 1)
    bp = 8.0 * t if uniform else 8.0 * np.sinh(2.5 * t) / np.sinh(2.5)
    coeffs = np.random.default_rng(0).normal(size=(DEGREE + 1, NUM_PIECES))
    pp = PiecewisePolynomial(bp.astype(dtype), coeffs.astype(dtype))
    assert pp.uniform == uniform
    return pp


def points(n: int, dtype, seed: int) -> jax.Array:
    x = jax.random.uniform(jax.random.key(seed), (n,), jnp.float32, -8.5, 8.5)
    return x.astype(dtype)


def torch_peer(pp: PiecewisePolynomial):
    """The PyTorch way on the same GPU: bucketize + gather + Horner (eager), or None."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    dtype = {jnp.dtype(jnp.float32): torch.float32,
             jnp.dtype(jnp.float64): torch.float64}[jnp.dtype(pp.dtype)]
    bp = torch.tensor(np.asarray(pp.breakpoints), dtype=dtype, device="cuda")
    table = torch.tensor(np.asarray(pp.coeffs).T.copy(), dtype=dtype, device="cuda")
    interior = bp[1:-1].contiguous()

    def evaluate(x):
        index = torch.bucketize(x, interior, right=True)
        c = table[index]
        u = x - bp[index]
        return ((c[:, 0] * u + c[:, 1]) * u + c[:, 2]) * u + c[:, 3]

    def to_torch(x):
        return torch.from_dlpack(x)

    return torch, evaluate, to_torch


def time_torch(torch, fn, arg_sets, repeats=MIN_REPEATS, calls_per_repeat=1) -> Timing:
    """Same protocol as :func:`benchmarks.harness.time_fn`, synchronising the torch stream."""
    for i in range(3):
        fn(*arg_sets[i % len(arg_sets)])
    torch.cuda.synchronize()
    times, k = [], 0
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls_per_repeat):
            fn(*arg_sets[k % len(arg_sets)])
            k += 1
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3 / calls_per_repeat)
    return Timing.of(times)


def device_check(name: str, actual, expected, *, rtol: float, atol: float) -> float:
    """:func:`check_close` reduced on the device (a 2^26 host copy per variant is slow)."""
    a, e = actual.astype(jnp.float32 if actual.dtype != jnp.float64 else jnp.float64), \
        expected.astype(jnp.float32 if expected.dtype != jnp.float64 else jnp.float64)
    both_nan = jnp.isnan(a) & jnp.isnan(e)
    excess = jnp.where(both_nan, 0.0, jnp.abs(a - e) / (atol + rtol * jnp.abs(e)))
    worst = float(jnp.max(jnp.where(jnp.isnan(excess), jnp.inf, excess)))
    if not worst <= 1.0:
        raise AssertionError(f"{name}: error {worst:.3g} x the allowed (rtol={rtol}, atol={atol})")
    rel = jnp.where(both_nan, 0.0, jnp.abs(a - e) / jnp.maximum(jnp.abs(e), 1e-30))
    return float(jnp.max(rel))


def kernel_fn(pp: PiecewisePolynomial, interpret: bool, **config):
    """The kernel alone on host-built tables (what ``pp(x)`` runs for a constant pp)."""
    tables = kernel_tables(np.asarray(pp.breakpoints), np.asarray(pp.coeffs), pp.uniform)
    return jax.jit(functools.partial(ppoly_eval_tables, *tables, num_pieces=pp.num_pieces,
                                     degree=pp.degree, uniform=pp.uniform, interpret=interpret,
                                     **config))


def xla_fn(pp: PiecewisePolynomial):
    return jax.jit(functools.partial(ppoly_eval_reference, pp.breakpoints, pp.coeffs,
                                     uniform=pp.uniform))


# (block_rows, ctas_per_sm, depth, sub_rows, vec) launches of the Mosaic GPU kernel timed
# per lookup (ctas_per_sm 0: one CTA per tile); a CTA's SMEM is 2 * depth * block_rows *
# 512 bytes of x and y tiles plus the table, at most 227 KB. The guided lookup (concrete
# breakpoints) takes all, the searched one the first two, the uniform one the first.
MOSAIC_LAUNCHES = [(32, 4, 2, 32, 4), (16, 4, 4, 16, 4), (32, 4, 2, 16, 2), (16, 4, 4, 8, 1),
                   (16, 6, 2, 16, 4)]


def mosaic_cases(rec: Recorder) -> None:
    """The Mosaic GPU kernel at N = 2^26 float32 (P = 256, D = 3) beside the public
    call's other backends, all as fractions of the in-run copy bandwidth."""
    reason = mosaic_unavailable_reason()
    if reason:
        print(f"[piecewise] Mosaic GPU cases skipped: they need {reason}")
        return
    from gpustat.pallas._mosaic_piecewise import pack_tables, ppoly_eval_mosaic
    from gpustat.reference.piecewise import guide_tables, side_rows

    rec.measure_copy(1 << 30)
    n, nbytes = BIG, BIG * 8
    with x64_for(jnp.float32):
        x = points(n, jnp.float32, 1)
        for uniform in (False, True):
            pp = make_pp(uniform, np.float32)
            bp, coeffs = np.asarray(pp.breakpoints), np.asarray(pp.coeffs)
            expected = xla_fn(pp)(x)
            keys, rows, params = kernel_tables(bp, coeffs, uniform)
            guide = None if uniform else guide_tables(bp)
            lookups = {"uniform": (None, None)} if uniform else {"search": (None, None)}
            if guide is not None:
                lookups["guided"] = (guide, side_rows(guide[2], rows, DEGREE))
            for kind, (g, sides) in lookups.items():
                table = pack_tables(keys, rows, params, g, sides)
                launches = MOSAIC_LAUNCHES[:{"guided": None, "search": 2, "uniform": 1}[kind]]
                for block_rows, ctas, depth, sub_rows, vec in launches:
                    fn = jax.jit(functools.partial(
                        ppoly_eval_mosaic, table, lookup_kind=kind, num_pieces=NUM_PIECES,
                        degree=DEGREE, buckets=0 if g is None else g[0].shape[0],
                        block_rows=block_rows, ctas_per_sm=ctas, depth=depth,
                        sub_rows=sub_rows, vec=vec))
                    name = (f"{kind}_f32_N2^26/mosaic"
                            f"[{block_rows},{ctas},{depth},{sub_rows},{vec}]")
                    try:
                        err = device_check(name, fn(x), expected, rtol=2e-6, atol=2e-3)
                    except Exception as exc:  # a launch that fails is a finding, not a stop
                        print(f"[piecewise] {name}: {type(exc).__name__}: {str(exc)[:300]}")
                        continue
                    rec.record(name, shape=(n,), dtype="float32", backend="mosaic",
                               timing=time_fn(fn, [(x,)]), bytes_moved=nbytes, items=n,
                               item_name="points",
                               extra={"block_rows": block_rows, "ctas_per_sm": ctas,
                                      "depth": depth, "sub_rows": sub_rows, "vec": vec,
                                      "lookup": kind,
                                      "max_rel_error": err})
            backends = ["auto", "mosaic"] + (["triton"] if triton_installed() else [])
            for backend in backends:  # the public call inside jit (constant pp)
                fn = jax.jit(lambda v, pp=pp, b=backend: pp(v, backend=b))
                name = f"{'uniform' if uniform else 'search'}_f32_N2^26/public_{backend}"
                try:
                    err = device_check(name, fn(x), expected, rtol=2e-6, atol=2e-3)
                except Exception as exc:  # recorded, the other backends still run
                    print(f"[piecewise] {name}: {type(exc).__name__}: {str(exc)[:300]}")
                    continue
                rec.record(name, shape=(n,), dtype="float32", backend=backend,
                           timing=time_fn(fn, [(x,)]), bytes_moved=nbytes, items=n,
                           item_name="points", extra={"max_rel_error": err})


def run(quick: bool = True, out: Path | None = None) -> None:
    on_gpu = cuda_gpu_available()
    interpret = not on_gpu
    big = BIG if on_gpu else 1 << 12
    small = TORCHPACE_N if on_gpu else 3000
    rec = Recorder("piecewise", out)
    copy_gbs = rec.measure_copy(1 << 30 if on_gpu else 1 << 22)
    mosaic_cases(rec)
    summary = []

    def streaming_case(name, pp, x_dtype, n, variants, compare_torch):
        with x64_for(x_dtype):  # float64 cases only: see x64_for
            x = points(n, x_dtype, 1)
            nbytes = n * 2 * jnp.dtype(x_dtype).itemsize
            rtol = 1e-12 if jnp.dtype(x_dtype) == jnp.float64 else 2e-6
            xla = xla_fn(pp)
            expected = xla(x)
            # f32 rounding differs between FMA (kernel) and not: absolute floor at the
            # size of the terms (|c| * 8.5^3 ~ 1e3 -> 1e3 * rtol)
            results = {}
            for config in variants:
                block_n, warps, gather, chunks, stages = config
                fn = kernel_fn(pp, interpret, block_n=block_n, num_warps=warps, gather=gather,
                               chunks=chunks, num_stages=stages)
                check = check_close if config == variants[0] else device_check
                err = check(f"{name}{list(config)}", fn(x), expected,
                            rtol=rtol if x_dtype != jnp.bfloat16 else 1e-2,
                            atol=1e3 * rtol if x_dtype != jnp.bfloat16 else 8.0)
                timing = time_fn(fn, [(x,)])
                results[config] = (timing, err)
            xla_timing = time_fn(xla, [(x,)])
            rec.record(f"{name}/xla_reference", shape=(n,), dtype=jnp.dtype(x_dtype).name,
                       backend="xla", timing=xla_timing, bytes_moved=nbytes, items=n,
                       item_name="points")
            torch_ms = None
            if compare_torch and (peer := torch_peer(pp)) is not None:
                torch, evaluate, to_torch = peer
                xt = to_torch(x)
                check_close(f"{name}/torch", np.asarray(evaluate(xt).cpu()), expected, rtol=rtol,
                            atol=1e3 * rtol)
                t = time_torch(torch, evaluate, [(xt,)])
                torch_ms = t.median_ms
                rec.record(f"{name}/torch_bucketize", shape=(n,), dtype=jnp.dtype(x_dtype).name,
                           backend="torch", timing=t, bytes_moved=nbytes, items=n,
                           item_name="points")
            best = min(results, key=lambda k: results[k][0].median_ms)
            for config, (timing, err) in results.items():
                extra = {"block_n": config[0], "num_warps": config[1], "gather": config[2],
                         "chunks": config[3], "num_stages": config[4], "max_rel_error": err,
                         "uniform": pp.uniform,
                         "speedup_vs_xla": xla_timing.median_ms / timing.median_ms,
                         "best_variant": config == best}
                if torch_ms is not None:
                    extra["speedup_vs_torch"] = torch_ms / timing.median_ms
                row = rec.record(f"{name}/pallas", shape=(n,), dtype=jnp.dtype(x_dtype).name,
                                 backend="pallas" if on_gpu else "interpret", timing=timing,
                                 bytes_moved=nbytes, items=n, item_name="points",
                                 baseline=f"{name}/xla_reference", extra=extra)
                if config == variants[0] or config == best:
                    summary.append(row)
            return results[best][0]

    def variants(kind):
        return VARIANTS[kind] if on_gpu else VARIANTS[kind][:1]

    pp32 = make_pp(False, np.float32)
    streaming_case("search_f32_N2^26", pp32, jnp.float32, big, variants("f32"), True)
    streaming_case("uniform_f32_N2^26", make_pp(True, np.float32), jnp.float32, big,
                   variants("f32"), True)
    streaming_case("search_bf16_N2^26", pp32, jnp.bfloat16, big, variants("bf16"), False)
    streaming_case("uniform_bf16_N2^26", make_pp(True, np.float32), jnp.bfloat16, big,
                   variants("bf16"), False)
    streaming_case("search_f64_N2^26", make_pp(False, np.float64), jnp.float64, big,
                   variants("f64"), True)
    streaming_case("uniform_f64_N2^26", make_pp(True, np.float64), jnp.float64, big,
                   variants("f64"), False)

    # torchPACE's shape: 16 MB sits in L2, so rotate buffers and issue calls back to back.
    for uniform in (False, True):
        with x64_for(jnp.float32):
            pp = make_pp(uniform, np.float32)
            name = f"{'uniform' if uniform else 'search'}_f32_N2e6"
            sets = rotating_copies(lambda i: (points(small, jnp.float32, 10 + i),), small * 4,
                                   l2_bytes=(64 << 20) if on_gpu else (1 << 16))
            # the public call as a user writes it inside jit (constant pp: host-built tables)
            fn = jax.jit(lambda v, pp=pp: pp(v, backend="pallas" if on_gpu else "interpret"))
            check_close(name, fn(sets[0][0]), xla_fn(pp)(sets[0][0]), rtol=2e-6, atol=2e-3)
            timing = time_fn(fn, sets, calls_per_repeat=10)
            axpb = jax.jit(lambda v: 1.5 * v + 0.25)
            axpb_timing = time_fn(axpb, sets, calls_per_repeat=10)
            xla_timing = time_fn(xla_fn(pp), sets, calls_per_repeat=10)
            nbytes = small * 8
            rec.record(f"{name}/axpb", shape=(small,), dtype="float32", backend="xla",
                       timing=axpb_timing, bytes_moved=nbytes, items=small, item_name="points")
            rec.record(f"{name}/xla_reference", shape=(small,), dtype="float32", backend="xla",
                       timing=xla_timing, bytes_moved=nbytes, items=small, item_name="points")
            extra = {"ratio_vs_axpb": timing.median_ms / axpb_timing.median_ms,
                     "speedup_vs_xla": xla_timing.median_ms / timing.median_ms,
                     "buffers": len(sets), "uniform": uniform}
            if (peer := torch_peer(pp)) is not None:
                torch, evaluate, to_torch = peer
                tsets = [(to_torch(s[0]),) for s in sets]
                t = time_torch(torch, evaluate, tsets, calls_per_repeat=10)
                rec.record(f"{name}/torch_bucketize", shape=(small,), dtype="float32",
                           backend="torch", timing=t, bytes_moved=nbytes, items=small,
                           item_name="points")
                extra["speedup_vs_torch"] = t.median_ms / timing.median_ms
            summary.append(rec.record(f"{name}/pallas", shape=(small,), dtype="float32",
                                      backend="pallas" if on_gpu else "interpret", timing=timing,
                                      bytes_moved=nbytes, items=small, item_name="points",
                                      baseline=f"{name}/axpb", extra=extra))

    print(f"\ncopy bandwidth {copy_gbs:.0f} GB/s")
    print(f"{'case':28s} {'config':20s} {'ms':>9s} {'GB/s':>7s} {'roof':>6s} {'xla x':>7s} "
          f"{'torch x':>8s} {'axpb r':>7s}")
    for row in summary:
        keys = ("block_n", "num_warps", "gather", "chunks", "num_stages")
        config = ",".join(str(row.get(k, "-")) for k in keys)
        print(f"{row['case']:28s} {config:20s} {row['median_ms']:9.4f} {row['gbs']:7.0f} "
              f"{row.get('roofline_fraction', 0):6.2f} {row.get('speedup_vs_xla', 0):7.1f} "
              f"{row.get('speedup_vs_torch', 0):8.1f} {row.get('ratio_vs_axpb', 0):7.2f}")


if __name__ == "__main__":
    main_from_args(run, "piecewise")
