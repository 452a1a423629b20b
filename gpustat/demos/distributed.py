"""Demo: sharded piecewise evaluation and EM on every visible device, against one device.

On a one-device machine the mesh has one device (the ``shard_map`` path still
runs); start Python with ``XLA_FLAGS=--xla_force_host_platform_device_count=4``
to see the rows split over four CPU devices.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from gpustat import distributed, mixture
from gpustat.demos import DemoRow, max_rel_error, timed
from gpustat.piecewise import PiecewisePolynomial, ppoly_eval

CAPABILITY = "distributed"


def run(backend: str, small: bool) -> list[DemoRow]:
    mesh = distributed.make_mesh()
    devices = distributed.mesh_size(mesh)
    rng = np.random.default_rng(0)
    n = 4_000 if small else 1_000_000
    pp = PiecewisePolynomial(np.linspace(-3.0, 3.0, 17), rng.normal(size=(4, 16)))
    x = distributed.shard_rows(jnp.asarray(rng.normal(size=n)), mesh)
    f = jax.jit(lambda x: distributed.ppoly_eval(pp, x, mesh, backend=backend))
    got, seconds = timed(f, x)
    rows = [DemoRow(CAPABILITY, "ppoly_eval sharded", backend,
                    max_rel_error(got, ppoly_eval(pp, x, backend="reference")), seconds,
                    f"n={n}, {devices} device(s), vs one-device reference")]
    k, p = 3, 2
    centres = rng.normal(0, 4, (k, p))
    X = jnp.asarray(centres[rng.integers(0, k, n)] + rng.normal(size=(n, p)))
    init = mixture.MixtureParams.from_covariances(jnp.full((k,), 1.0 / k), jnp.asarray(centres),
                                                  jnp.broadcast_to(jnp.eye(p), (k, p, p)))
    em = jax.jit(lambda X: distributed.fit_em(X, init, mesh, max_iter=10, tol=0.0,
                                              backend=backend))
    fit, seconds = timed(em, distributed.shard_rows(X, mesh))
    ref = mixture.fit_em(X, init, max_iter=10, tol=0.0, backend="reference")
    rows.append(DemoRow(CAPABILITY, "fit_em sharded", backend,
                        max_rel_error(fit.params.means, ref.params.means), seconds,
                        f"n={n}, k={k}, 10 iterations, {devices} device(s), vs one device"))
    return rows
