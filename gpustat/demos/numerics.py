"""Demo: probit numerics on a grid spanning both tails, against scipy.special on the host."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import scipy.special as sps

from gpustat import numerics
from gpustat.demos import DemoRow, max_rel_error, timed

CAPABILITY = "numerics"


def run(backend: str, small: bool) -> list[DemoRow]:
    n = 100_000 if small else 10_000_000
    x = jnp.linspace(-30.0, 30.0, n, dtype=jnp.float64)
    x_host = np.asarray(x)
    rows = []
    cases = {
        "log_ndtr f64": (numerics.log_ndtr, sps.log_ndtr),
        "erfc f64": (numerics.erfc, sps.erfc),
    }
    for case, (fn, oracle) in cases.items():
        f = jax.jit(lambda v, fn=fn: fn(v, backend=backend))
        got, seconds = timed(f, x)
        rows.append(DemoRow(CAPABILITY, case, backend, max_rel_error(got, oracle(x_host)), seconds,
                            f"n={n}, vs scipy.special"))
    x32 = x.astype(jnp.float32)
    f32 = jax.jit(lambda v: numerics.log_ndtr_and_mills(v, backend=backend))
    (log_cdf, mills), seconds = timed(f32, x32)
    ref_log, ref_mills = jax.jit(lambda v: numerics.log_ndtr_and_mills(v, backend="reference"))(x)
    rows.append(DemoRow(CAPABILITY, "log_ndtr_and_mills f32", backend,
                        max_rel_error((log_cdf, mills), (ref_log, ref_mills)), seconds,
                        "vs float64 reference"))
    return rows
