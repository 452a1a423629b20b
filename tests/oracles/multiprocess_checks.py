"""One process of a multi-process run of the sharded entry points (``jax.distributed``).

``python -m gpustat.distributed.launch --num-processes 2 --devices-per-process 2 --
python -m tests.oracles.multiprocess_checks OUT_DIR`` runs this module in 2 processes of
2 CPU devices each. Every process calls :func:`gpustat.distributed.initialize`, builds
the global mesh over the 4 devices and, from the same host data (:func:`cases`), its
own shards of the global arrays; it runs the sharded EM, FM / FFM scoring on a sharded
CSR and the border solve, gathers the row-sharded outputs with ``process_allgather``
and writes them to ``OUT_DIR/process<i>.npz``. ``tests/test_distributed_multiprocess.py``
compares both processes' files with the single-device ops run in the pytest process.

Importing this module touches no JAX state: :func:`cases` is shared with the test.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

EM_ITER = 6
RIDGE_BETA = 0.1


def cases() -> dict:
    """Host data of every check (numpy, float64), the same in every process."""
    import scipy.sparse as sp

    from tests.oracles.border_fixtures import random_batch

    rng = np.random.default_rng(11)
    n, p = 29, 3  # 29 rows: blocks of 8, 8, 8, 5 (padding on the last device)
    X = np.concatenate([rng.normal(size=(n // 2, p)), rng.normal(size=(n - n // 2, p)) + 2.5])
    csr = sp.random(23, 10, density=0.3, random_state=5, format="csr")
    csr.data[csr.indptr[3]:csr.indptr[4]] = 0  # an empty row
    csr.eliminate_zeros()
    sizes = [(3, 2), (1, 1), (3, 2), (5, 0), (2, 3), (3, 2), (1, 1)]
    return {
        "X": X, "weights": rng.uniform(0.5, 2.0, n),
        "init_weights": np.array([0.4, 0.6]), "init_means": np.array([[0.5] * p, [1.5] * p]),
        "init_covs": np.stack([np.eye(p)] * 2),
        "csr": csr, "fields": np.arange(10) % 3, "w0": 0.3, "w": rng.normal(size=10),
        "V": rng.normal(size=(10, 4)), "Vf": rng.normal(size=(10, 3, 4)),
        "atoms": random_batch(7, sizes, d=2), "ridge_t": np.linspace(0.0, 0.3, len(sizes)),
    }


def main(out_dir: str) -> int:
    from gpustat import distributed

    distributed.initialize()  # first: from the GPUSTAT_* variables the launcher sets

    import jax
    import jax.numpy as jnp
    from jax.experimental import multihost_utils

    from gpustat import border, mixture

    jax.config.update("jax_enable_x64", True)
    c = cases()
    mesh = distributed.make_mesh()
    out = {"process_count": jax.process_count(), "device_count": jax.device_count(),
           "local_device_count": jax.local_device_count(),
           "mesh_processes": len({d.process_index for d in mesh.devices.flat})}

    # EM: host X in, and X placed by shard_rows (29 rows: padded to 32 with weight 0)
    init = mixture.MixtureParams.from_covariances(
        jnp.asarray(c["init_weights"]), jnp.asarray(c["init_means"]), jnp.asarray(c["init_covs"]))
    fit = distributed.fit_em(c["X"], init, mesh, sample_weight=c["weights"], max_iter=EM_ITER,
                             tol=0.0, backend="reference")
    out.update(em_weights=fit.params.weights, em_means=fit.params.means,
               em_prec_chol=fit.params.precisions_cholesky, em_lower_bounds=fit.lower_bounds,
               em_n_iter=fit.n_iter, em_status=fit.status)

    # FM / FFM scores of a sharded CSR: row-sharded global outputs, gathered
    Xs = distributed.shard_csr(c["csr"], mesh)
    fm = distributed.fm_predict(Xs, c["w0"], c["w"], c["V"], mesh, backend="reference")
    ffm = jax.jit(lambda Xs: distributed.ffm_predict(Xs, c["fields"], c["w0"], c["w"], c["Vf"],
                                                     mesh, backend="reference"))(Xs)
    out["fm_sharded_rows"] = not fm.is_fully_addressable
    out.update(fm=multihost_utils.process_allgather(fm, tiled=True),
               ffm=multihost_utils.process_allgather(ffm, tiled=True))

    # border: atoms dealt to the 4 devices, solved, reassembled in the packed order
    batch = border.BorderBatch.from_atoms(*(list(a) for a in zip(*c["atoms"], strict=True)))
    sharded = distributed.shard_border_batch(batch, mesh)
    sol = distributed.solve_batched_border(sharded, c["ridge_t"], RIDGE_BETA, mesh,
                                           backend="reference").gather()
    for name in ("delta_t", "delta_beta", "log_det", "status", "row", "bump"):
        out[f"border_{name}"] = multihost_utils.process_allgather(getattr(sol, name), tiled=True)

    host = {k: np.asarray(v) for k, v in out.items()}
    np.savez(Path(out_dir) / f"process{jax.process_index()}.npz", **host)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
