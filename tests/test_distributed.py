"""gpustat.distributed: sharded results equal unsharded ones on 4 (CPU) devices.

The pytest process has already initialised JAX with one CPU device, so the
multi-device checks run in subprocesses started with
``XLA_FLAGS=--xla_force_host_platform_device_count=4`` and ``JAX_PLATFORMS=cpu``
(:mod:`tests.oracles.distributed_checks`), which print one JSON line per check.
Single-device behaviour (validation, a 1-device mesh under ``jit``) is tested
in-process.
"""

from __future__ import annotations

import json
import os
import re
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
# two groups of about equal compile time (about 40 s each on this 2-core machine),
# one subprocess each, so that pytest-xdist's two workers can run them side by side
CHECK_GROUPS = {
    "arrays": ["mesh", "ppoly_eval", "factorization", "suff_stats", "fit_em", "bms_rows",
               "fm_training"],
    "draws_and_solves": ["fit_gibbs", "bms_joint", "border", "fm_table"],
}
CHECKS = [name for group in CHECK_GROUPS.values() for name in group]
_DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"


def _run_checks(checks: list[str], interpret: bool) -> dict:
    # keep the caller's XLA flags (e.g. the test target's optimisation level) except a
    # device count: the subprocess sets its own
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
             if not f.startswith(_DEVICE_COUNT_FLAG)]
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT),
           "GPUSTAT_DISTRIBUTED_INTERPRET": "1" if interpret else "0",
           "XLA_FLAGS": " ".join(flags)}
    proc = subprocess.run([sys.executable, "-m", "tests.oracles.distributed_checks", *checks],
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


def _assert_all_passed(checks: list[str], results: dict) -> None:
    missing = [name for name in checks if name not in results]
    failed = {name: row["detail"] for name, row in results.items() if not row["ok"]}
    assert not missing and not failed, f"missing: {missing}\n" + "\n".join(
        f"--- {name}\n{detail}" for name, detail in failed.items())


@pytest.mark.parametrize("group", list(CHECK_GROUPS))
def test_sharded_equals_unsharded(group):
    """The checks of tests.oracles.distributed_checks on 4 devices, reference backends.

    One test per group of checks (not per check): each group starts one subprocess.
    """
    checks = CHECK_GROUPS[group]
    _assert_all_passed(checks, _run_checks(checks, interpret=False))


def test_check_groups_cover_every_check():
    # read, not imported: importing the module would set this process's XLA flags
    source = (ROOT / "tests" / "oracles" / "distributed_checks.py").read_text()
    defined = re.findall(r"^def check_(\w+)\(", source, flags=re.MULTILINE)
    assert sorted(CHECKS) == sorted(defined) and len(set(CHECKS)) == len(CHECKS)


@pytest.mark.slow
def test_sharded_kernels_in_interpret_mode():
    _assert_all_passed(CHECKS, _run_checks(CHECKS, interpret=True))


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


def test_value_checks_of_the_single_device_ops_run_before_sharding():
    # inside shard_map the single-device ops see tracers and skip their value checks
    # (an out-of-range field id then gathers a clamped field: wrong scores, no error)
    import scipy.sparse as sp

    from gpustat import mixture

    mesh = distributed.make_mesh(1)
    X = np.eye(4)
    fields, w, V = np.array([0, 1, 2, 3]), np.zeros(4), np.ones((4, 3, 2))  # f = 3 fields
    for rows in (X, sp.csr_matrix(X)):
        with pytest.raises(ValueError, match=r"field_ids must lie in \[0, f=3\)"):
            distributed.ffm_predict(rows, fields, 0.0, w, V, mesh, backend="reference")
    with pytest.raises(ValueError, match="w must be finite"):
        distributed.fm_predict(X, 0.0, np.array([0.0, np.nan, 0.0, 0.0]), V[:, 0], mesh,
                               backend="reference")
    params = mixture.MixtureParams.from_covariances(jnp.ones(1), jnp.zeros((1, 4)),
                                                    jnp.eye(4)[None])
    with pytest.raises(ValueError, match="sample_weight must be finite and non-negative"):
        distributed.suff_stats(X, params, mesh, -np.ones(4), backend="reference")
    with pytest.raises(ValueError, match="X contains 1 NaN"):
        distributed.suff_stats(X + np.diag([np.nan, 0, 0, 0]), params, mesh,
                               backend="reference")


def test_merge_requests_sums_every_request_of_a_row_at_its_first():
    from gpustat.distributed._fm_rows import merge_requests

    rng = np.random.default_rng(0)
    n_dev, capacity, n_rows = 3, 6, 10
    blocks = []
    for _ in range(n_dev):  # each block sorted, distinct ids, padded with n_rows
        ids = np.sort(rng.choice(n_rows, rng.integers(0, capacity + 1), replace=False))
        blocks.append(np.concatenate([ids, np.full(capacity - ids.size, n_rows)]))
    asked = np.stack(blocks).astype(np.int32)
    table = rng.normal(size=(n_dev * capacity, 2, 3))
    first, (summed,) = merge_requests(jnp.asarray(asked), [jnp.asarray(table)], n_rows)
    flat = asked.reshape(-1)
    expected_first = np.zeros(flat.size, bool)
    for row in np.unique(flat[flat < n_rows]):
        where = np.flatnonzero(flat == row)
        expected_first[where[0]] = True
        np.testing.assert_allclose(np.asarray(summed)[where[0]], table[where].sum(axis=0),
                                   rtol=1e-14, atol=1e-14)
    np.testing.assert_array_equal(np.asarray(first), expected_first)
    assert (np.bincount(flat[flat < n_rows]) > 1).any()  # the draw has repeated rows
