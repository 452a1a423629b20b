"""The command line: info, demo (and its clear errors), bench argument and device checks."""

import os
import subprocess
import sys

import pytest

from gpustat import __main__ as cli
from gpustat._backend import cuda_gpu_available


def _run(*args, env=None):
    return subprocess.run([sys.executable, "-m", "gpustat", *args], capture_output=True,
                          text=True, timeout=300, env=env)


def test_info_lists_versions_devices_and_kernels():
    text = cli.info()
    assert "jax " in text and "available backends:" in text
    assert "numerics" in text.splitlines()[-1]


def test_demo_table_for_numerics():
    result = _run("demo", "--only", "numerics")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split()[:4] == ["capability", "case", "backend", "max"]
    backends = {line.split()[3] for line in lines[2:] if line.startswith("numerics")}
    assert backends == ({"pallas"} if cuda_gpu_available() else {"reference", "interpret"})


@pytest.mark.skipif(cuda_gpu_available(), reason="this machine has a GPU")
def test_demo_pallas_without_gpu_is_a_clear_error():
    result = _run("demo", "--backend", "pallas")
    assert result.returncode == 2
    assert result.stderr.strip().startswith("error: demo: backend='pallas' needs a CUDA GPU")
    assert "Traceback" not in result.stderr


def test_bench_unknown_module():
    with pytest.raises(SystemExit, match="no benchmarks for"):
        cli.bench(["nosuchmodule"], quick=True, out=None)


def test_demo_unknown_capability_is_an_argument_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["demo", "--only", "numerics", "nosuchmodule"])
    assert exit_info.value.code == 2
    assert "argument --only: invalid choice: 'nosuchmodule'" in capsys.readouterr().err


@pytest.mark.skipif(cuda_gpu_available(), reason="this machine has a GPU")
def test_bench_without_gpu_exits_before_running_or_recording(tmp_path):
    with pytest.raises(SystemExit, match=r"benchmarks of \['piecewise'\] need a CUDA GPU"):
        cli.bench(["piecewise"], quick=True, out=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_demo_without_x64_skips_the_float64_capabilities_and_says_so():
    result = _run("demo", "--only", "border", "numerics", env={**os.environ, "GPUSTAT_X32": "1"})
    assert result.returncode == 0, result.stderr
    assert "skipping border: float64 only" in result.stderr
    rows = [line.split()[0] for line in result.stdout.splitlines()[2:] if line.strip()]
    assert "numerics" in rows and "border" not in rows
