"""gpustat.distributed: sharded results equal unsharded ones on 4 (CPU) devices.

The pytest process has already initialised JAX with one CPU device, so the
multi-device checks run in one subprocess started with
``XLA_FLAGS=--xla_force_host_platform_device_count=4`` and ``JAX_PLATFORMS=cpu``
(:mod:`tests.oracles.distributed_checks`); each test below asserts on one
check's JSON line. Single-device behaviour (validation, a 1-device mesh under
``jit``) is tested in-process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gpustat import distributed
from gpustat.piecewise import PiecewisePolynomial, ppoly_eval

ROOT = Path(__file__).resolve().parent.parent
CHECKS = ["mesh", "ppoly_eval", "factorization", "suff_stats", "fit_em", "fit_gibbs",
          "bms_joint", "bms_rows", "border", "fm_training"]


def _run_checks(interpret: bool) -> dict:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT),
           "GPUSTAT_DISTRIBUTED_INTERPRET": "1" if interpret else "0"}
    env.pop("XLA_FLAGS", None)
    proc = subprocess.run([sys.executable, "-m", "tests.oracles.distributed_checks", *CHECKS],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    results = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            results[row["name"]] = row
    if not results:
        raise AssertionError(f"the check process printed no results (rc={proc.returncode}):\n"
                             f"{proc.stderr[-4000:]}")
    return results


def _assert_all_passed(results: dict) -> None:
    missing = [name for name in CHECKS if name not in results]
    failed = {name: row["detail"] for name, row in results.items() if not row["ok"]}
    assert not missing and not failed, f"missing: {missing}\n" + "\n".join(
        f"--- {name}\n{detail}" for name, detail in failed.items())


def test_sharded_equals_unsharded():
    """Every check of tests.oracles.distributed_checks on 4 devices, reference backends.

    One test (not one per check) so that pytest-xdist starts the subprocess once.
    """
    _assert_all_passed(_run_checks(interpret=False))


@pytest.mark.slow
def test_sharded_kernels_in_interpret_mode():
    _assert_all_passed(_run_checks(interpret=True))


def test_one_device_mesh_under_jit():
    mesh = distributed.make_mesh(1)
    pp = PiecewisePolynomial(np.linspace(0.0, 1.0, 5), np.arange(12.0).reshape(3, 4))
    x = jnp.linspace(-0.5, 1.5, 7)
    got = jax.jit(lambda x: distributed.ppoly_eval(pp, x, mesh, backend="reference"))(x)
    np.testing.assert_allclose(got, ppoly_eval(pp, x, backend="reference"), rtol=0, atol=1e-14)
    # the psum pattern is a plain sum over rows on one device
    total = distributed.sum_rows(lambda rows, _: jnp.sum(rows, axis=0), mesh, x)
    np.testing.assert_allclose(total, np.sum(np.asarray(x)), rtol=1e-14)


def test_bad_input():
    mesh = distributed.make_mesh(1)
    with pytest.raises(ValueError, match="n_devices"):
        distributed.make_mesh(len(jax.devices()) + 1)
    with pytest.raises(TypeError, match="axis_name"):
        distributed.make_mesh(axis_name=0)
    with pytest.raises(TypeError, match="mesh must be"):
        distributed.shard_rows(jnp.ones(3), mesh="rows")
    two_d = jax.sharding.Mesh(np.asarray(jax.devices()[:1]).reshape(1, 1), ("a", "b"))
    with pytest.raises(ValueError, match="1-D"):
        distributed.shard_rows(jnp.ones(3), two_d)
    with pytest.raises(ValueError, match="leading"):
        distributed.shard_rows({"a": jnp.ones(3), "b": jnp.ones(2)}, mesh)
    with pytest.raises(ValueError, match="share their leading axis"):
        distributed.map_rows(lambda rows, _: rows, mesh, (jnp.ones(3), jnp.ones(2)))
    with pytest.raises(TypeError, match="X must be"):
        distributed.shard_csr(np.ones((2, 2)), mesh)
    with pytest.raises(TypeError, match="BorderBatch"):
        distributed.shard_border_batch(np.ones(3), mesh)
    with pytest.raises(TypeError, match="ShardedBorderBatch"):
        distributed.solve_batched_border(np.ones(3), 0.0, 0.0, mesh)
    with pytest.raises(TypeError, match="BmsRows"):
        distributed.shard_bms_rows(np.ones(3), mesh)
    with pytest.raises(TypeError, match="RowDerivatives"):
        distributed.joint_gradient(np.ones(3), np.ones((3, 1)), np.ones((3, 1)), mesh)
