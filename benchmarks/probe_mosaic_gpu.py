"""Probe what Pallas Mosaic GPU (``jax.experimental.pallas.mosaic_gpu``) lowers and how fast.

Each probe runs on its own: a failure (lowering, compilation, wrong result) is
recorded and the next probe runs. One JSON line per probe is printed and appended
to ``<out>/mosaic_probe.jsonl``: name, stage reached, error text (first 300
characters), maximum error against a jax.numpy computation, time in microseconds,
GB/s or TFLOP/s, and the same-run baseline (a jnp copy or a jnp matmul).

Run from the repository root on an sm_90 GPU::

    PYTHONPATH=. python3 benchmarks/probe_mosaic_gpu.py --out $OUT

``--lower-only`` lowers every kernel for CUDA without a device (on a CPU machine:
what the Mosaic GPU lowering rejects shows up there; ptxas does not run).
``--small`` shrinks every size.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from benchmarks.harness import time_fn, x64_for

try:
    # ``pl.pallas_call`` has no Mosaic GPU lowering rule in jax 0.11.2 (its GPU
    # lowering asserts on ``plgpu.CompilerParams``); JAX's own tests go through this
    # shim, a ``plgpu.kernel`` over the parallel grid wrapping ``emit_pipeline``.
    from jax._src.pallas.mosaic_gpu.pallas_call import pallas_call as mgpu_pallas_call
    from jax.experimental.pallas import mosaic_gpu as plgpu
except ImportError as exc:  # pragma: no cover - recorded by every probe
    plgpu = None
    _IMPORT_ERROR = repr(exc)
else:
    _IMPORT_ERROR = ""

PROBES: list[tuple[str, Callable[[dict], dict]]] = []
LOWER_ONLY = False


def probe(name: str):
    def register(fn):
        PROBES.append((name, fn))
        return fn
    return register


def _timed_us(fn, *args) -> float:
    return time_fn(fn, [args], repeats=20).median_ms * 1e3


class _Stage(Exception):
    def __init__(self, stage: str, exc: Exception):
        super().__init__(f"{stage}: {type(exc).__name__}: {exc}")
        self.stage = stage
        self.exc = exc


def _lower_for_cuda(fn, *args):
    """Deviceless lowering for an sm_90 CUDA device (works on a CPU machine)."""
    device = jax.sharding.AbstractDevice("NVIDIA H100", 132, "cuda")
    mesh = jax.sharding.AbstractMesh((1,), ("x",), abstract_device=device)
    structs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args]
    with jax.sharding.use_abstract_mesh(mesh):
        return jax.jit(fn).trace(*structs).lower(lowering_platforms=("cuda",))


def _compile(fn, *args):
    """jit, lower and compile; returns the compiled callable (raises with the stage).

    With ``LOWER_ONLY`` (``--lower-only``) it lowers for CUDA without a device and
    returns ``None``.
    """
    if LOWER_ONLY:
        try:
            _lower_for_cuda(fn, *args)
        except Exception as exc:
            raise _Stage("lower", exc) from exc
        return None
    jitted = jax.jit(fn)
    try:
        lowered = jitted.lower(*args)
    except Exception as exc:
        raise _Stage("lower", exc) from exc
    try:
        compiled = lowered.compile()
    except Exception as exc:
        raise _Stage("compile", exc) from exc
    return compiled


def _measure(kernel, reference, args, *, nbytes: float | None = None,
             flops: float | None = None, baseline=None, baseline_name: str = "",
             tol: float | None = None) -> dict:
    """Compile, run, compare and time ``kernel`` against ``reference`` (and ``baseline``)."""
    rec: dict = {}
    compiled = _compile(kernel, *args)
    rec["lowered"] = True
    if compiled is None:
        return rec
    out = jax.block_until_ready(compiled(*args))
    rec["ran"] = True
    ref = jax.block_until_ready(jax.jit(reference)(*args))
    err = float(jnp.max(jnp.abs(jnp.asarray(out, jnp.float32) - jnp.asarray(ref, jnp.float32))))
    scale = float(jnp.max(jnp.abs(jnp.asarray(ref, jnp.float32)))) or 1.0
    rec["max_abs_err"] = err
    rec["max_rel_err"] = err / scale
    if tol is not None:
        rec["correct"] = bool(err <= tol * scale)
    us = _timed_us(compiled, *args)
    rec["us"] = us
    if nbytes is not None:
        rec["GBps"] = nbytes / (us * 1e-6) / 1e9
    if flops is not None:
        rec["TFLOPs"] = flops / (us * 1e-6) / 1e12
    ref_us = _timed_us(jax.jit(reference), *args)
    rec["jnp_us"] = ref_us
    rec["speedup_vs_jnp"] = ref_us / us
    if baseline is not None:
        b_us = _timed_us(jax.jit(baseline), *args)
        rec[f"{baseline_name or 'baseline'}_us"] = b_us
        rec[f"ratio_to_{baseline_name or 'baseline'}"] = b_us / us
    return rec


# ----------------------------------------------------------------------------- helpers

def _whole(spec, grid_rank: int):
    """``spec`` itself when it is a BlockSpec, else a whole-array SMEM block of that shape."""
    del grid_rank
    if isinstance(spec, pl.BlockSpec):
        return spec
    zeros = (0,) * len(spec)
    return plgpu.BlockSpec(spec, lambda *_: zeros)


def _stream_call(body, out_dtype, arrays, *, rows: int, cols: int, block_rows: int,
                 n_par: int | None, mcs: int, extra_specs=(), extra=()):
    """Stream (rows, cols) arrays in (block_rows, cols) blocks through ``body``.

    ``n_par=None``: a one-dimensional parallel grid (one CTA per block). Otherwise a
    (n_par, steps) grid, the second dimension sequential and pipelined ``mcs``
    deep inside each CTA (``n_par`` is reduced to a divisor of the block count).
    """
    nblocks = rows // block_rows
    if n_par is None:
        grid = (nblocks,)
        spec = plgpu.BlockSpec((block_rows, cols), lambda i: (i, 0))
        params = plgpu.CompilerParams()
        extra_specs = [_whole(s, 1) for s in extra_specs]
    else:
        n_par = math.gcd(n_par, nblocks)
        steps = nblocks // n_par
        grid = (n_par, steps)
        spec = plgpu.BlockSpec((block_rows, cols), lambda i, j: (i * steps + j, 0))
        params = plgpu.CompilerParams(dimension_semantics=["parallel", "sequential"],
                                      max_concurrent_steps=mcs)
        extra_specs = [_whole(s, 2) for s in extra_specs]
    return mgpu_pallas_call(
        body, grid=grid,
        in_specs=[spec] * len(arrays) + list(extra_specs),
        out_specs=spec,
        out_shape=jax.ShapeDtypeStruct((rows, cols), out_dtype),
        compiler_params=params,
    )(*arrays, *extra)


def _ew_math(x):
    return jnp.exp(-x) * x + jnp.log(x * x + 1.0)


def _smem_gather(table_ref, idx, layout):
    """``table_ref.reshape(-1)[idx]`` elementwise, written with inline Mosaic GPU.

    One scalar load per element (``ld.shared`` for an SMEM table, ``ld.global``
    through L1 for a GMEM one). A 2-D (rows, 128) table is indexed as row
    ``idx >> 7``, column ``idx & 127`` (TMA copies at most 256 elements along a
    dimension, so an SMEM table of more than 256 entries is stored 2-D).
    """
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import arith, memref

    two_d = len(table_ref.shape) == 2

    @plgpu.inline_mgpu(
        arg_types=(plgpu.RefType(), layout),
        return_type=plgpu.ShapeDtypeStruct(idx.shape, table_ref.dtype, layout=layout),
    )
    def gather(ctx, ref, idx_fa):
        del ctx
        index = ir.IndexType.get()
        i32 = ir.IntegerType.get_signless(32)

        def load(v, _):
            if two_d:
                row = arith.shrui(v, arith.constant(i32, 7))
                col = arith.andi(v, arith.constant(i32, 127))
                return memref.load(ref, [arith.index_cast(index, row),
                                         arith.index_cast(index, col)])
            return memref.load(ref, [arith.index_cast(index, v)])

        return idx_fa.foreach(load, create_array=True)

    return gather(table_ref, idx)


def _table(values: np.ndarray, where: str):
    """(array, spec) of a lookup table in SMEM (2-D, zero padded) or GMEM (1-D)."""
    if where == "gmem":
        return jnp.asarray(values), plgpu.BlockSpec(memory_space=plgpu.GMEM)
    rows = -(-values.size // 128)
    padded = np.zeros(rows * 128, values.dtype)
    padded[:values.size] = values
    return jnp.asarray(padded.reshape(rows, 128)), (rows, 128)


# ----------------------------------------------------------------------------- probes

@probe("copy_jnp_f32")
def _copy_jnp(cfg):
    x = jnp.arange(cfg["n"], dtype=jnp.float32)
    us = _timed_us(jax.jit(lambda v: v * 2.0), x)
    cfg["copy_us_f32"] = us
    return {"us": us, "GBps": 8 * cfg["n"] / (us * 1e-6) / 1e9, "lowered": True, "ran": True}


def _ew_probe(dtype, block_rows, n_par, mcs, cols=128, body_kind="math"):
    def run(cfg):
        n = cfg["n"]
        rows = n // cols
        x = (jax.random.uniform(jax.random.key(0), (rows, cols), jnp.float32) + 0.5).astype(dtype)
        compute = jnp.promote_types(dtype, jnp.float32)

        def body(x_ref, o_ref):
            v = x_ref[...]
            if body_kind == "copy":
                o_ref[...] = v
            else:
                o_ref[...] = _ew_math(v.astype(compute)).astype(dtype)

        def kernel(x):
            return _stream_call(body, dtype, (x,), rows=rows, cols=cols, block_rows=block_rows,
                                n_par=n_par, mcs=mcs)

        def reference(x):
            if body_kind == "copy":
                return x
            return _ew_math(x.astype(compute)).astype(dtype)

        itemsize = jnp.dtype(dtype).itemsize
        return _measure(kernel, reference, (x,), nbytes=2 * n * itemsize,
                        baseline=lambda v: v * 2, baseline_name="copy",
                        tol=1e-2 if itemsize == 2 else 1e-5)
    return run


for _dt, _dn in ((jnp.float32, "f32"), (jnp.bfloat16, "bf16")):
    for _br, _np_, _mcs in ((32, None, 1), (32, 256, 2), (64, 128, 2), (16, 256, 4)):
        _tag = "par" if _np_ is None else f"p{_np_}s{_mcs}"
        probe(f"ew_{_dn}_b{_br}_{_tag}")(_ew_probe(_dt, _br, _np_, _mcs))
for _br, _np_, _mcs in ((32, None, 1), (32, 256, 2), (16, 256, 4)):
    _tag = "par" if _np_ is None else f"p{_np_}s{_mcs}"
    probe(f"copy_pallas_f32_b{_br}_{_tag}")(_ew_probe(jnp.float32, _br, _np_, _mcs,
                                                       body_kind="copy"))


def _f64_probe(block_rows, n_par, mcs):
    inner = _ew_probe(jnp.float64, block_rows, n_par, mcs)

    def run(cfg):
        with x64_for(jnp.float64):
            return inner(dict(cfg, n=cfg["n"] // 2))
    return run


probe("ew_f64_b16_par_tma")(_f64_probe(16, None, 1))


@probe("ew_f64_tma_as_int64")
def _f64_as_int64(cfg):
    """float64 through TMA bitcast as int64 (TMA takes 64-bit integers, not float64):
    XLA's f64 <-> i64 bitcasts are free, the kernel bitcasts in registers."""
    with x64_for(jnp.float64):
        n, cols, block_rows = cfg["n"] // 2, 128, 16
        rows = n // cols
        x = jax.random.uniform(jax.random.key(0), (rows, cols), jnp.float64) + 0.5

        def body(x_ref, o_ref):
            v = jax.lax.bitcast_convert_type(x_ref[...], jnp.float64)
            o_ref[...] = jax.lax.bitcast_convert_type(_ew_math(v), jnp.int64)

        def kernel(x):
            bits = jax.lax.bitcast_convert_type(x, jnp.int64)
            out = _stream_call(body, jnp.int64, (bits,), rows=rows, cols=cols,
                               block_rows=block_rows, n_par=None, mcs=1)
            return jax.lax.bitcast_convert_type(out, jnp.float64)

        return _measure(kernel, _ew_math, (x,), nbytes=16 * n, tol=1e-12,
                        baseline=lambda v: v * 2, baseline_name="copy")


@probe("ew_f64_gmem_load")
def _f64_gmem(cfg):
    """float64 without TMA: each CTA loads its rows from GMEM into registers."""
    with x64_for(jnp.float64):
        n, cols, block_rows = cfg["n"] // 2, 128, 16
        rows = n // cols
        x = jax.random.uniform(jax.random.key(0), (rows, cols), jnp.float64) + 0.5
        layout = plgpu.Layout.WG_STRIDED((block_rows, cols), vec_size=1)

        def body(x_gmem, o_gmem):
            i = jax.lax.axis_index("b")
            v = plgpu.load(x_gmem.at[pl.ds(i * block_rows, block_rows)], layout=layout,
                           optimized=False)
            o_gmem.at[pl.ds(i * block_rows, block_rows)][...] = _ew_math(v)

        kernel = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct(x.shape, x.dtype),
                              grid=(rows // block_rows,), grid_names=("b",))
        return _measure(kernel, _ew_math, (x,), nbytes=16 * n, tol=1e-12,
                        baseline=lambda v: v * 2, baseline_name="copy")


def _per_sm_rows(cfg, cols: int, block_rows: int):
    """(SM count, rows each SM streams, a multiple of block_rows; x of (SMs x rows, cols))."""
    num_sms = cfg["num_sms"]
    per_sm = cfg["n"] // cols // num_sms // block_rows * block_rows
    x = jax.random.uniform(jax.random.key(1), (per_sm * num_sms, cols), jnp.float32)
    return num_sms, per_sm, x


def _per_sm_pipelined_copy(cfg, emit, **kernel_kw):
    """out = 2 x: ``plgpu.kernel`` over the SMs, each streaming its rows in (32, 128)
    float32 tiles 4 deep through the pipeline ``emit`` (``plgpu.emit_pipeline`` or a
    configured ``emit_pipeline_warp_specialized``)."""
    cols, block_rows = 128, 32
    num_sms, per_sm, x = _per_sm_rows(cfg, cols, block_rows)

    def body(x_gmem, o_gmem):
        sm = jax.lax.axis_index("sm")

        def step(_, x_s, o_s):
            o_s[...] = x_s[...] * 2.0

        emit(
            step, grid=(per_sm // block_rows,),
            in_specs=[plgpu.BlockSpec((block_rows, cols), lambda j: (j, 0))],
            out_specs=[plgpu.BlockSpec((block_rows, cols), lambda j: (j, 0))],
            max_concurrent_steps=4,
        )(x_gmem.at[pl.ds(sm * per_sm, per_sm)], o_gmem.at[pl.ds(sm * per_sm, per_sm)])

    kernel = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          grid=(num_sms,), grid_names=("sm",), **kernel_kw)
    return _measure(kernel, lambda v: v * 2.0, (x,), nbytes=2 * x.size * 4, tol=0.0)


@probe("emit_pipeline_copy_f32")
def _emit_pipeline_copy(cfg):
    """Each SM streams its rows through emit_pipeline (TMA)."""
    return _per_sm_pipelined_copy(cfg, plgpu.emit_pipeline)


@probe("emit_pipeline_ws_copy_f32")
def _emit_pipeline_ws_copy(cfg):
    """Warp specialisation: one memory warpgroup issues the TMA copies, one computes
    (128 KB of shared memory)."""
    emit = functools.partial(plgpu.emit_pipeline_warp_specialized, memory_registers=40,
                             wg_axis="wg", num_compute_wgs=1)
    return _per_sm_pipelined_copy(cfg, emit, num_threads=2, thread_name="wg")


def _gather_probe(mode: str, table_size: int, where: str = "smem"):
    """out = table[floor(x * B)] with data-dependent indices into an SMEM/GMEM table."""
    def run(cfg):
        n, cols, block_rows = cfg["n"], 128, 64
        rows = n // cols
        x = jax.random.uniform(jax.random.key(2), (rows, cols), jnp.float32)
        values = np.cos(np.arange(table_size, dtype=np.float32))
        table, tspec = _table(values, where)
        flat = jnp.asarray(values)

        def body(x_ref, t_ref, o_ref):
            if mode == "wgmma":
                v = plgpu.load(x_ref, layout=plgpu.Layout.WGMMA, optimized=False)
            else:
                v = x_ref[...]
            idx = jnp.clip((v * table_size).astype(jnp.int32), 0, table_size - 1)
            if mode == "native":
                o_ref[...] = t_ref[idx]
            elif mode == "wgmma":
                o_ref[...] = _smem_gather(t_ref, idx, plgpu.Layout.WGMMA)
            else:
                layout = plgpu.Layout.WG_STRIDED((block_rows, cols), vec_size=1)
                idx = plgpu.layout_cast(idx, layout)
                o_ref[...] = _smem_gather(t_ref, idx, layout)

        def kernel(x, t):
            return _stream_call(body, jnp.float32, (x,), rows=rows, cols=cols,
                                block_rows=block_rows, n_par=256, mcs=2,
                                extra_specs=[tspec], extra=(t,))

        def reference(x, t):
            del t
            return flat[jnp.clip((x * table_size).astype(jnp.int32), 0, table_size - 1)]

        return _measure(kernel, reference, (x, table), nbytes=8 * n,
                        baseline=lambda v, t: v * 2, baseline_name="copy", tol=0.0)
    return run


probe("gather_native_ref_index_B256")(_gather_probe("native", 256))
probe("gather_inline_strided_smem_B256")(_gather_probe("strided", 256))
probe("gather_inline_strided_gmem_B256")(_gather_probe("strided", 256, "gmem"))
probe("gather_inline_wgmma_smem_B256")(_gather_probe("wgmma", 256))


def _piecewise_tables(num_pieces: int):
    rng = np.random.default_rng(3)
    inner = np.sort(rng.uniform(0.0, 1.0, num_pieces - 1))
    bp = np.concatenate([[0.0], inner, [1.0]]).astype(np.float32)
    coeffs = rng.standard_normal((4, num_pieces)).astype(np.float32)
    return bp, coeffs


def _piecewise_probe(num_pieces: int, layout_kind: str, where: str = "smem"):
    """Searched cubic lookup: branch-free binary search + 4 coefficient gathers, Horner."""
    def run(cfg):
        n, cols, block_rows = cfg["n"], 128, 64
        rows = n // cols
        bp, coeffs = _piecewise_tables(num_pieces)
        x = jax.random.uniform(jax.random.key(4), (rows, cols), jnp.float32)
        # keys padded to a power of two with +inf so every probed index is in range
        size = 1 << math.ceil(math.log2(num_pieces))
        keys = np.full(size, np.inf, np.float32)
        keys[:num_pieces] = bp[:num_pieces]
        keys[0] = -np.inf
        tables, tspec = _table(np.concatenate([keys, coeffs.reshape(-1)]), where)

        def body(x_ref, t_ref, o_ref):
            if layout_kind == "wgmma":
                layout = plgpu.Layout.WGMMA
                v = plgpu.load(x_ref, layout=layout, optimized=False)
            else:
                layout = plgpu.Layout.WG_STRIDED((block_rows, cols), vec_size=1)
                v = plgpu.layout_cast(x_ref[...], layout)
            lo = (v * 0.0).astype(jnp.int32)
            step = size // 2
            while step >= 1:
                cand = lo + step
                key = _smem_gather(t_ref, cand, layout)
                lo = jnp.where(key <= v, cand, lo)
                step //= 2
            left = _smem_gather(t_ref, lo, layout)
            left = jnp.where(lo == 0, 0.0, left)
            t = v - left
            acc = _smem_gather(t_ref, lo + size, layout)
            for d in range(1, 4):
                acc = acc * t + _smem_gather(t_ref, lo + (size + d * num_pieces), layout)
            o_ref[...] = acc

        def kernel(x, tables):
            return _stream_call(body, jnp.float32, (x,), rows=rows, cols=cols,
                                block_rows=block_rows, n_par=256, mcs=2,
                                extra_specs=[tspec], extra=(tables,))

        bp_j, c_j = jnp.asarray(bp), jnp.asarray(coeffs)

        def reference(x, tables):
            del tables
            i = jnp.clip(jnp.searchsorted(bp_j, x, side="right") - 1, 0, num_pieces - 1)
            t = x - bp_j[i]
            return ((c_j[0, i] * t + c_j[1, i]) * t + c_j[2, i]) * t + c_j[3, i]

        rec = _measure(kernel, reference, (x, tables), nbytes=8 * n,
                       baseline=lambda v, t: v * 2, baseline_name="copy", tol=1e-4)
        if LOWER_ONLY:
            return rec
        try:
            from gpustat.piecewise import PiecewisePolynomial
            pp = PiecewisePolynomial(bp_j, c_j)
            rec["gpustat_auto_us"] = _timed_us(jax.jit(lambda v: pp(v)), x)
            rec["ratio_to_gpustat_auto"] = rec["gpustat_auto_us"] / rec["us"]
        except Exception as exc:
            rec["gpustat_auto_error"] = f"{type(exc).__name__}: {exc}"[:300]
        return rec
    return run


for _b in (64, 1024):
    probe(f"piecewise_search_strided_smem_B{_b}")(_piecewise_probe(_b, "strided"))
probe("piecewise_search_strided_gmem_B64")(_piecewise_probe(64, "strided", "gmem"))
probe("piecewise_search_wgmma_smem_B64")(_piecewise_probe(64, "wgmma"))


@probe("atomic_add_smem_f32")
def _atomic(cfg):
    """Two warpgroups per CTA atomically add their (64, 128) GMEM rows into one SMEM tile."""
    n, cols, block_rows = cfg["n"] // 16, 128, 64
    rows = n // cols
    nctas = rows // (2 * block_rows)
    x = jax.random.uniform(jax.random.key(5), (rows, cols), jnp.float32)
    layout = plgpu.Layout.WG_STRIDED((block_rows, cols), vec_size=2)

    def body(x_gmem, o_gmem, smem, barrier):
        cta = jax.lax.axis_index("b")
        wg = jax.lax.axis_index("wg")

        @pl.when(wg == 0)
        def _():
            smem[...] = jnp.zeros((block_rows, cols), jnp.float32)

        plgpu.barrier_arrive(barrier)
        plgpu.barrier_wait(barrier)
        start = (2 * cta + wg) * block_rows
        plgpu.atomic_add(smem, plgpu.load(x_gmem.at[pl.ds(start, block_rows)], layout=layout,
                                          optimized=False))
        plgpu.barrier_arrive(barrier)
        plgpu.barrier_wait(barrier)

        @pl.when(wg == 0)
        def _():
            o_gmem.at[pl.ds(cta * block_rows, block_rows)][...] = smem[...]

    kernel = plgpu.kernel(
        body, out_type=jax.ShapeDtypeStruct((nctas * block_rows, cols), jnp.float32),
        grid=(nctas,), grid_names=("b",), num_threads=2, thread_name="wg",
        scratch_types=[plgpu.SMEM((block_rows, cols), jnp.float32),
                       plgpu.Barrier(num_arrivals=2)])

    def reference(x):
        return x.reshape(nctas, 2, block_rows, cols).sum(1).reshape(-1, cols)

    return _measure(kernel, reference, (x,), nbytes=4 * n * 1.5, tol=1e-5,
                    baseline=lambda v: v * 2, baseline_name="copy")


@probe("rowsum_f32_wgmma_layout")
def _rowsum(cfg):
    n, cols, block_rows = cfg["n"] // 2, 64, 64
    rows = n // cols
    x = jax.random.uniform(jax.random.key(6), (rows, cols), jnp.float32)

    def body(x_ref, o_ref):
        v = plgpu.load(x_ref, layout=plgpu.Layout.WGMMA, optimized=False)
        o_ref[...] = jnp.sum(v, axis=1)

    def kernel(x):
        return mgpu_pallas_call(
            body, grid=(rows // block_rows,),
            in_specs=[plgpu.BlockSpec((block_rows, cols), lambda i: (i, 0))],
            out_specs=plgpu.BlockSpec((block_rows,), lambda i: (i,)),
            out_shape=jax.ShapeDtypeStruct((rows,), jnp.float32),
        )(x)

    return _measure(kernel, lambda x: x.sum(1), (x,), nbytes=4 * n, tol=1e-5,
                    baseline=lambda v: v * 2, baseline_name="copy")


def _swizzled(dtype, minor: int):
    """Tiling + swizzle transforms for an SMEM operand whose minor dimension is ``minor``."""
    swizzle = plgpu.find_swizzle(minor * jnp.dtype(dtype).itemsize * 8)
    elems = swizzle // jnp.dtype(dtype).itemsize
    return (plgpu.TilingTransform((8, elems)), plgpu.SwizzleTransform(swizzle))


def _mixture_operands(cfg, dtype, features):
    n, k = cfg["n_points"], 256
    f = jax.random.normal(jax.random.key(7), (n, features), jnp.float32) * 0.3
    w = jax.random.normal(jax.random.key(8), (k, features), jnp.float32) * 0.3
    return f.astype(dtype), w.astype(dtype)


def _gemm_probe(dtype, epilogue: str):
    """(n, F) @ (k, F)^T on the tensor cores, F = 153 quadratic features padded to 160.

    ``epilogue="store"`` writes the (n, k) float32 scores; ``"lse"`` reduces each row
    to its logsumexp over the k = 256 components in registers (the E-step's
    normaliser) and writes n floats.
    """
    def run(cfg):
        features = 160
        f, w = _mixture_operands(cfg, dtype, features)
        n, k = f.shape[0], w.shape[0]
        tile_m = 64
        tile_n = 256 if epilogue == "lse" else 128
        transforms = _swizzled(dtype, features)
        # DEFAULT: TF32 for float32 operands on the GPU, the tensor-core rate wgmma runs at
        precision = jax.lax.Precision.DEFAULT

        def body(f_ref, w_ref, o_ref):
            def scope(acc_ref):
                plgpu.wgmma(acc_ref, f_ref, w_ref.transpose((1, 0)))
                return acc_ref[...]
            acc = pl.run_scoped(scope, plgpu.ACC((tile_m, tile_n), jnp.float32))
            if epilogue == "lse":
                m = jnp.max(acc, axis=1)
                o_ref[...] = m + jnp.log(jnp.sum(jnp.exp(acc - m[:, None]), axis=1))
            else:
                o_ref[...] = acc

        if epilogue == "lse":
            grid = (n // tile_m,)
            in_specs = [plgpu.BlockSpec((tile_m, features), lambda i: (i, 0),
                                        transforms=transforms),
                        plgpu.BlockSpec((tile_n, features), lambda i: (0, 0),
                                        transforms=transforms)]
            out_specs = plgpu.BlockSpec((tile_m,), lambda i: (i,))
            out_shape = jax.ShapeDtypeStruct((n,), jnp.float32)
        else:
            grid = (n // tile_m, k // tile_n)
            in_specs = [plgpu.BlockSpec((tile_m, features), lambda i, j: (i, 0),
                                        transforms=transforms),
                        plgpu.BlockSpec((tile_n, features), lambda i, j: (j, 0),
                                        transforms=transforms)]
            out_specs = plgpu.BlockSpec((tile_m, tile_n), lambda i, j: (i, j))
            out_shape = jax.ShapeDtypeStruct((n, k), jnp.float32)

        def kernel(f, w):
            return mgpu_pallas_call(body, grid=grid, in_specs=in_specs, out_specs=out_specs,
                                    out_shape=out_shape)(f, w)

        def scores(f, w):
            return jax.lax.dot_general(f, w, (((1,), (1,)), ((), ())), precision=precision,
                                       preferred_element_type=jnp.float32)

        def reference(f, w):
            s = scores(f, w)
            if epilogue == "lse":
                return jax.nn.logsumexp(s, axis=1)
            return s

        def exact(f, w):
            s = jax.lax.dot_general(f.astype(jnp.float32), w.astype(jnp.float32),
                                    (((1,), (1,)), ((), ())),
                                    precision=jax.lax.Precision.HIGHEST)
            return jax.nn.logsumexp(s, axis=1)

        rec = _measure(kernel, reference, (f, w), flops=2.0 * n * k * features,
                       baseline=scores, baseline_name="jnp_gemm_only", tol=2e-2)
        if epilogue == "lse" and not LOWER_ONLY:
            out = jax.jit(kernel)(f, w)
            rec["lse_err_vs_f32_highest"] = float(jnp.max(jnp.abs(out - jax.jit(exact)(f, w))))
        return rec
    return run


for _dt, _dn in ((jnp.float32, "tf32"), (jnp.bfloat16, "bf16"), (jnp.float16, "f16")):
    probe(f"wgmma_{_dn}_store_scores")(_gemm_probe(_dt, "store"))
    probe(f"wgmma_{_dn}_fused_logsumexp")(_gemm_probe(_dt, "lse"))


@probe("hopper_matmul_ws_bf16_4096")
def _hopper_matmul(cfg):
    """JAX's own warp-specialised Hopper matmul example (emit_pipeline_warp_specialized)."""
    from jax.experimental.pallas.ops.gpu import hopper_matmul_mgpu as hm
    size = cfg["matmul_size"]
    a = jax.random.normal(jax.random.key(9), (size, size), jnp.bfloat16)
    b = jax.random.normal(jax.random.key(10), (size, size), jnp.bfloat16)
    config = hm.TuningConfig(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=4,
                             epi_tile_n=64, epi_tile_m=64)

    def kernel(a, b):
        return hm.matmul(a, b, None, config)

    def reference(a, b):
        return jnp.dot(a, b, preferred_element_type=jnp.float32).astype(jnp.bfloat16)

    return _measure(kernel, reference, (a, b), flops=2.0 * size ** 3, tol=2e-2)


@probe("dot_inside_kernel_f32_highest")
def _dot_highest(cfg):
    """jnp.dot with precision=HIGHEST inside a Mosaic GPU kernel."""
    m, kk, nn = 64, 64, 128
    a = jax.random.normal(jax.random.key(11), (m, kk), jnp.float32)
    b = jax.random.normal(jax.random.key(12), (kk, nn), jnp.float32)

    def body(a_ref, b_ref, o_ref):
        o_ref[...] = jnp.dot(a_ref[...], b_ref[...], precision=jax.lax.Precision.HIGHEST)

    def kernel(a, b):
        return mgpu_pallas_call(body, out_shape=jax.ShapeDtypeStruct((m, nn), jnp.float32))(a, b)

    return _measure(kernel, lambda a, b: jnp.dot(a, b, precision="highest"), (a, b),
                    tol=1e-5)


# ----------------------------------------------------------------------------- driver

def main() -> None:
    global LOWER_ONLY
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".", help="folder for mosaic_probe.jsonl")
    parser.add_argument("--small", action="store_true", help="tiny sizes")
    parser.add_argument("--lower-only", action="store_true",
                        help="lower each kernel for CUDA without a device, run nothing")
    parser.add_argument("--only", default="", help="comma-separated substrings of probe names")
    parser.add_argument("--budget-s", type=float, default=220.0,
                        help="skip the remaining probes after this many seconds")
    args = parser.parse_args()
    LOWER_ONLY = args.lower_only
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "mosaic_probe.jsonl"
    dev = jax.devices()[0]
    num_sms = getattr(dev, "core_count", 132) or 132
    cfg = {"n": 1 << 26, "n_points": 1 << 20, "matmul_size": 4096, "num_sms": num_sms}
    if args.small or args.lower_only:
        cfg = {"n": 1 << 16, "n_points": 1 << 12, "matmul_size": 256, "num_sms": 4}
    header = {"name": "_env", "device": dev.device_kind, "platform": dev.platform,
              "jax": jax.__version__, "num_sms": num_sms, "mosaic_import_error": _IMPORT_ERROR,
              "lower_only": LOWER_ONLY, **cfg}
    print(json.dumps(header), flush=True)
    only = [s for s in args.only.split(",") if s]
    start = time.perf_counter()
    with path.open("a") as fh:
        fh.write(json.dumps(header) + "\n")
        for name, fn in PROBES:
            if only and not any(s in name for s in only):
                continue
            rec: dict = {"name": name, "lowered": False, "ran": False}
            if time.perf_counter() - start > args.budget_s:
                rec["error"] = "skipped: probe time budget spent"
            elif plgpu is None and not name.startswith("copy_jnp"):
                rec["error"] = f"import: {_IMPORT_ERROR}"[:300]
            else:
                t0 = time.perf_counter()
                try:
                    rec.update(fn(cfg))
                except _Stage as exc:
                    rec["stage"] = exc.stage
                    rec["error"] = str(exc)[:300]
                    rec["error_tail"] = str(exc)[-300:]
                except Exception as exc:
                    rec["error"] = f"{type(exc).__name__}: {exc}"[:300]
                    rec["error_tail"] = f"{exc}"[-300:]
                    rec["where"] = traceback.format_exc().splitlines()[-3][:200]
                rec["wall_s"] = round(time.perf_counter() - t0, 2)
            if "copy_us_f32" in cfg and "GBps" in rec:
                copy_gbps = 8 * cfg["n"] / (cfg["copy_us_f32"] * 1e-6) / 1e9
                rec.setdefault("fraction_of_copy_bw", rec["GBps"] / copy_gbps)
            line = json.dumps(rec, default=str)
            print(line, flush=True)
            fh.write(line + "\n")
            fh.flush()


if __name__ == "__main__":
    main()
