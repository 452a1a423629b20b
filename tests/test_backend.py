"""The dispatch contract of gpustat._backend."""

import pytest

import gpustat
from gpustat._backend import cuda_gpu_available, resolve_backend

GPU = cuda_gpu_available()


def test_auto_picks_pallas_only_on_a_cuda_gpu():
    assert resolve_backend("auto", op="t") == ("pallas" if GPU else "reference")
    assert resolve_backend("auto", op="t", kernel_supports=False) == "reference"
    assert resolve_backend("auto", op="t", auto_prefers_kernel=False) == "reference"


def test_explicit_backends():
    assert resolve_backend("reference", op="t") == "reference"
    assert resolve_backend("interpret", op="t") == "interpret"


def test_explicit_kernel_on_unsupported_call_raises():
    with pytest.raises(ValueError, match="cannot run this call: too big"):
        resolve_backend("interpret", op="t", kernel_supports=False, unsupported_reason="too big")


@pytest.mark.skipif(GPU, reason="this machine has a CUDA GPU")
def test_pallas_and_triton_without_gpu_raise_naming_the_machine():
    with pytest.raises(gpustat.BackendUnavailableError, match=r"op_x: backend='pallas'.*'cpu'"):
        resolve_backend("pallas", op="op_x")
    with pytest.raises(gpustat.BackendUnavailableError, match="needs a CUDA GPU"):
        resolve_backend("triton", op="op_x", has_triton=True)


def test_unknown_and_unoffered_backends_raise():
    with pytest.raises(ValueError, match="backend must be one of"):
        resolve_backend("gpu", op="t")
    with pytest.raises(ValueError, match="backend must be one of"):
        resolve_backend("triton", op="t", has_triton=False)


def test_available_backends():
    names = gpustat.available_backends()
    assert names[-2:] == ("reference", "interpret")
    assert ("pallas" in names) == GPU
