"""Multi-process runs through ``jax.distributed``: 2 processes x 2 CPU devices equal one device.

``python -m gpustat.distributed.launch`` starts :mod:`tests.oracles.multiprocess_checks`
as 2 processes of 2 CPU devices each (coordinator on 127.0.0.1, gloo collectives); each
process builds its shards of the global arrays over the 4-device mesh, runs the sharded
EM, FM / FFM scoring and the border solve, and writes its (gathered) results. They are
compared here with the single-device ops on the same data in this process, and the FM
scores with the FM formula in numpy. The launcher and :func:`gpustat.distributed.initialize`
are also tested on their own (environment, failure and timeout handling).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gpustat import border, distributed, factorization, mixture
from gpustat.distributed import _launch
from tests.oracles import multiprocess_checks as checks

ROOT = Path(__file__).resolve().parent.parent
# the run compiles the sharded programs in two processes; on an idle 2-core machine it
# takes well under a minute, the bound leaves room for a loaded CI runner
RUN_TIMEOUT_S = 300
RTOL = 1e-12


def _run_two_processes(out: Path) -> list[dict]:
    """Both processes' results; the launcher and its workers bounded by RUN_TIMEOUT_S."""
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
             if not f.startswith("--xla_force_host_platform_device_count")]
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT),
           "XLA_FLAGS": " ".join(flags)}
    for name in (_launch.ENV_COORDINATOR, _launch.ENV_NUM_PROCESSES, _launch.ENV_PROCESS_ID,
                 _launch.ENV_LOCAL_DEVICE_IDS):
        env.pop(name, None)
    cmd = [sys.executable, "-m", "gpustat.distributed.launch", "--num-processes", "2",
           "--devices-per-process", "2", "--timeout", str(RUN_TIMEOUT_S - 20), "--",
           sys.executable, "-m", "tests.oracles.multiprocess_checks", str(out)]
    # own process group: on a timeout the launcher and both workers are killed together
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        log, _ = proc.communicate()
        raise AssertionError(f"the 2-process run passed {RUN_TIMEOUT_S} s:\n{log[-4000:]}") from None
    assert proc.returncode == 0, f"launcher exit {proc.returncode}:\n{log[-4000:]}"
    return [dict(np.load(out / f"process{i}.npz")) for i in range(2)]


def _close(got, expected, name):
    got, expected = np.asarray(got, np.float64), np.asarray(expected, np.float64)
    scale = max(float(np.max(np.abs(expected), initial=0.0)), 1.0)
    np.testing.assert_allclose(got, expected, rtol=RTOL, atol=RTOL * scale, err_msg=name)


def test_two_processes_equal_one_device(tmp_path):
    """One run (one test, so that xdist workers never start it twice), every check on it."""
    runs = _run_two_processes(tmp_path)
    _check_global_mesh(runs)
    _check_em(runs)
    _check_fm_and_ffm_scores(runs)
    _check_border_solve(runs)


def _check_global_mesh(runs):
    for run in runs:
        assert int(run["process_count"]) == 2
        assert int(run["device_count"]) == 4 and int(run["local_device_count"]) == 2
        assert int(run["mesh_processes"]) == 2
        assert bool(run["fm_sharded_rows"])  # scores were a global row-sharded array


def _check_em(runs):
    c = checks.cases()
    init = mixture.MixtureParams.from_covariances(
        jnp.asarray(c["init_weights"]), jnp.asarray(c["init_means"]), jnp.asarray(c["init_covs"]))
    ref = mixture.fit_em(jnp.asarray(c["X"]), init, sample_weight=jnp.asarray(c["weights"]),
                         max_iter=checks.EM_ITER, tol=0.0, backend="reference")
    for run in runs:
        assert int(run["em_n_iter"]) == checks.EM_ITER == int(ref.n_iter)
        assert int(run["em_status"]) == int(ref.status) == mixture.STATUS_OK
        _close(run["em_weights"], ref.params.weights, "weights")
        _close(run["em_means"], ref.params.means, "means")
        _close(run["em_prec_chol"], ref.params.precisions_cholesky, "precisions_cholesky")
        _close(run["em_lower_bounds"], ref.lower_bounds, "lower_bounds")


def _check_fm_and_ffm_scores(runs):
    c = checks.cases()
    X, dense = c["csr"], c["csr"].toarray()
    fm = factorization.fm_predict(X, c["w0"], c["w"], c["V"], backend="reference")
    ffm = factorization.ffm_predict(X, c["fields"], c["w0"], c["w"], c["Vf"],
                                    backend="reference")
    # FM formula pair by pair: w0 + x.w + sum_{i<j} <v_i, v_j> x_i x_j
    V = c["V"]
    pair = np.einsum("ni,nj,ik,jk->n", dense, dense, V, V) - np.einsum("ni,ik->n", dense**2,
                                                                      V**2)
    formula = c["w0"] + dense @ c["w"] + 0.5 * pair
    for run in runs:
        assert run["fm"].shape == run["ffm"].shape == (X.shape[0],)
        _close(run["fm"], fm, "fm")
        _close(run["fm"], formula, "fm formula")
        _close(run["ffm"], ffm, "ffm")


def _check_border_solve(runs):
    c = checks.cases()
    batch = border.BorderBatch.from_atoms(*(list(a) for a in zip(*c["atoms"], strict=True)))
    ref = border.solve_batched_border(batch, c["ridge_t"], checks.RIDGE_BETA,
                                      backend="reference")
    for run in runs:
        for name in ("status", "row"):
            np.testing.assert_array_equal(run[f"border_{name}"], np.asarray(getattr(ref, name)))
        for name in ("delta_t", "delta_beta", "log_det", "bump"):
            _close(run[f"border_{name}"], getattr(ref, name), name)


def _clear_env(monkeypatch):
    for name in (_launch.ENV_COORDINATOR, _launch.ENV_NUM_PROCESSES, _launch.ENV_PROCESS_ID,
                 _launch.ENV_LOCAL_DEVICE_IDS):
        monkeypatch.delenv(name, raising=False)


def test_initialize_reads_the_environment(monkeypatch):
    calls = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: calls.append(kw))
    _clear_env(monkeypatch)
    distributed.initialize()  # nothing set: jax's own cluster detection
    monkeypatch.setenv(_launch.ENV_COORDINATOR, "127.0.0.1:4321")
    monkeypatch.setenv(_launch.ENV_NUM_PROCESSES, "3")
    monkeypatch.setenv(_launch.ENV_PROCESS_ID, "2")
    monkeypatch.setenv(_launch.ENV_LOCAL_DEVICE_IDS, "4,5")
    distributed.initialize(initialization_timeout=30)
    assert calls == [{}, {"coordinator_address": "127.0.0.1:4321", "num_processes": 3,
                          "process_id": 2, "local_device_ids": [4, 5],
                          "initialization_timeout": 30}]


@pytest.mark.parametrize(("env", "message"), [
    ({"GPUSTAT_COORDINATOR": "127.0.0.1:1"}, "missing GPUSTAT_NUM_PROCESSES, GPUSTAT_PROCESS_ID"),
    ({"GPUSTAT_COORDINATOR": "h:1", "GPUSTAT_NUM_PROCESSES": "two", "GPUSTAT_PROCESS_ID": "0"},
     "GPUSTAT_NUM_PROCESSES must be an integer >= 1, got 'two'"),
    ({"GPUSTAT_COORDINATOR": "h:1", "GPUSTAT_NUM_PROCESSES": "2", "GPUSTAT_PROCESS_ID": "2"},
     "GPUSTAT_PROCESS_ID must lie in [0, 1]"),
    ({"GPUSTAT_COORDINATOR": "h:1", "GPUSTAT_NUM_PROCESSES": "2", "GPUSTAT_PROCESS_ID": "0",
      "GPUSTAT_LOCAL_DEVICE_IDS": "0;1"}, "GPUSTAT_LOCAL_DEVICE_IDS must be comma-separated"),
])
def test_initialize_rejects_a_bad_environment(monkeypatch, env, message):
    monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: pytest.fail("called"))
    _clear_env(monkeypatch)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        distributed.initialize()


def test_launcher_environment_per_process():
    env = _launch._process_env({"XLA_FLAGS": "--xla_force_host_platform_device_count=8 --a=1"},
                               "127.0.0.1:99", 2, 1, 3)
    assert env[_launch.ENV_COORDINATOR] == "127.0.0.1:99"
    assert (env[_launch.ENV_NUM_PROCESSES], env[_launch.ENV_PROCESS_ID]) == ("2", "1")
    assert env[_launch.ENV_LOCAL_DEVICE_IDS] == "3,4,5"
    assert env["XLA_FLAGS"] == "--a=1 --xla_force_host_platform_device_count=3"
    plain = _launch._process_env({}, "127.0.0.1:99", 2, 0, None)
    assert _launch.ENV_LOCAL_DEVICE_IDS not in plain and "XLA_FLAGS" not in plain


_WORKER = ("import os, sys, time; pid = int(os.environ['GPUSTAT_PROCESS_ID']); "
           "time.sleep(60) if pid == 0 else sys.exit({code})")


def test_launcher_stops_the_others_when_one_fails():
    start = time.monotonic()
    assert _launch.launch([sys.executable, "-c", _WORKER.format(code=3)], 2, timeout=50) == 3
    assert time.monotonic() - start < 30  # process 0 (sleeping 60 s) was stopped


def test_launcher_timeout_and_arguments():
    start = time.monotonic()
    assert _launch.launch([sys.executable, "-c", _WORKER.format(code="time.sleep(60)")], 2,
                          timeout=1.0) == 124
    assert time.monotonic() - start < 30
    assert _launch.main(["--num-processes", "2", "--", sys.executable, "-c",
                         "import os; assert os.environ['GPUSTAT_NUM_PROCESSES'] == '2'"]) == 0
    with pytest.raises(ValueError, match="num_processes must be an integer >= 1"):
        _launch.launch([sys.executable, "-c", "pass"], 0)
    with pytest.raises(ValueError, match="command must name a program"):
        _launch.launch([], 2)
