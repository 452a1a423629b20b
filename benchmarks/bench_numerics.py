"""Benchmarks of the probit numerics kernel vs XLA's fusion of the same reference.

Elementwise and memory-bound: each op reads x and writes one output (two for
log_ndtr_and_mills), so the ceiling is the in-run copy bandwidth.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from benchmarks.harness import Recorder, check_close, main_from_args, time_fn, x64_for
from gpustat import numerics
from gpustat.reference import numerics as ref

OPS = {"log_ndtr": 1, "log_ndtr_and_mills": 2, "probit_curvature": 1, "erfc": 1}


def run(quick: bool, out=None) -> None:
    rec = Recorder("numerics", out)
    rec.measure_copy()
    sizes = [1 << 26] if quick else [1 << 20, 1 << 24, 1 << 26]
    dtypes = [jnp.float32, jnp.float64]
    for n in sizes:
        for dtype in dtypes:
            with x64_for(dtype):
                x = jax.random.normal(jax.random.key(0), (n,), dtype) * 10.0
                itemsize = jnp.dtype(dtype).itemsize
                for op, outputs in OPS.items():
                    kernel = jax.jit(functools.partial(getattr(numerics, op), backend="pallas"))
                    xla = jax.jit(getattr(ref, op))
                    for got, exp in zip(jax.tree.leaves(kernel(x)), jax.tree.leaves(xla(x)),
                                        strict=True):
                        check_close(f"{op} {dtype.__name__}", got, exp,
                                    rtol=5e-6 if dtype == jnp.float32 else 1e-12)
                    moved = n * itemsize * (1 + outputs)
                    shape, name = (n,), jnp.dtype(dtype).name
                    t_xla = time_fn(xla, [(x,)])
                    rec.record(f"{op}", shape=shape, dtype=name, backend="xla", timing=t_xla,
                               bytes_moved=moved, items=n, item_name="elements")
                    t_kernel = time_fn(kernel, [(x,)])
                    rec.record(f"{op}", shape=shape, dtype=name, backend="pallas", timing=t_kernel,
                               bytes_moved=moved, items=n, item_name="elements", baseline="xla",
                               extra={"speedup_vs_xla": t_xla.median_ms / t_kernel.median_ms})


if __name__ == "__main__":
    main_from_args(run, "numerics")
