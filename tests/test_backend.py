"""The dispatch contract of gpustat._backend."""

import numpy as np
import pytest

import gpustat
from gpustat import _backend
from gpustat._backend import cuda_gpu_available, resolve_backend

GPU = cuda_gpu_available()


def test_auto_picks_pallas_only_on_a_cuda_gpu():
    assert resolve_backend("auto", op="t") == ("pallas" if GPU else "reference")
    assert resolve_backend("auto", op="t", kernel_supports=False) == "reference"
    assert resolve_backend("auto", op="t", capability="numerics") == "reference"


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
        resolve_backend("triton", op="op_x", kernels=("pallas", "triton"))


def test_unknown_and_unoffered_backends_raise():
    with pytest.raises(ValueError, match="backend must be one of"):
        resolve_backend("gpu", op="t")
    with pytest.raises(ValueError, match="backend must be one of"):
        resolve_backend("triton", op="t")
    with pytest.raises(ValueError, match="backend must be one of"):
        resolve_backend("interpret", op="t", kernels=("triton",))


def test_available_backends():
    names = gpustat.available_backends()
    assert names[-2:] == ("reference", "interpret")
    assert ("pallas" in names) == GPU


def _on_a_gpu(monkeypatch, triton: bool):
    monkeypatch.setattr(_backend, "cuda_gpu_available", lambda: True)
    monkeypatch.setattr(_backend, "triton_installed", lambda: triton)


def test_auto_follows_the_first_matching_rule(monkeypatch):
    _on_a_gpu(monkeypatch, triton=True)
    both = ("pallas", "triton")
    small = _backend.piecewise_shape_class(True, "float32", 1000, True)
    assert small == "uniform/float32/small/single"
    assert resolve_backend("auto", op="t", capability="piecewise", shape_class=small,
                           kernels=both) == "reference"
    streaming = _backend.piecewise_shape_class(False, "float32", 1 << 26, True)
    assert resolve_backend("auto", op="t", capability="piecewise", shape_class=streaming,
                           kernels=both) == "triton"
    multi = _backend.piecewise_shape_class(False, "float32", 1 << 26, False)
    assert resolve_backend("auto", op="t", capability="piecewise", shape_class=multi,
                           kernels=both) == "pallas"
    # an explicit request is never redirected by the table
    assert resolve_backend("pallas", op="t", capability="piecewise", shape_class=streaming,
                           kernels=both) == "pallas"
    assert resolve_backend("auto", op="t", capability="estimators",
                           shape_class="scatter") == "reference"


def test_auto_without_jax_triton_takes_the_pallas_kernel_or_the_reference(monkeypatch):
    _on_a_gpu(monkeypatch, triton=False)
    streaming = _backend.piecewise_shape_class(False, "float32", 1 << 26, True)
    assert resolve_backend("auto", op="t", capability="piecewise", shape_class=streaming,
                           kernels=("pallas", "triton")) == "pallas"
    assert resolve_backend("auto", op="t", capability="mixture", shape_class="f16x3/p4",
                           kernels=("triton",)) == "reference"


def test_a_mosaic_row_runs_where_mosaic_takes_the_call_and_gives_way_elsewhere(monkeypatch):
    """float32 streaming piecewise calls take the Mosaic GPU kernel on an sm_90+ GPU; where
    it is unavailable or cannot take the call, the next matching row (jax-triton) runs."""
    _on_a_gpu(monkeypatch, triton=True)
    kernels = ("pallas", "triton", "mosaic")
    for uniform in (False, True):
        streaming = _backend.piecewise_shape_class(uniform, "float32", 1 << 26, True)
        monkeypatch.setattr(_backend, "mosaic_unavailable_reason", lambda: "")

        def auto(unsupported=None, streaming=streaming):
            return resolve_backend("auto", op="t", capability="piecewise",
                                   shape_class=streaming, kernels=kernels,
                                   unsupported=unsupported)

        assert auto() == "mosaic"
        assert auto({"mosaic": "n must be a multiple of 128"}) == "triton"
        monkeypatch.setattr(_backend, "mosaic_unavailable_reason", lambda: "an sm_90 GPU")
        assert auto() == "triton"
    float64 = _backend.piecewise_shape_class(False, "float64", 1 << 26, True)
    monkeypatch.setattr(_backend, "mosaic_unavailable_reason", lambda: "")
    assert resolve_backend("auto", op="t", capability="piecewise", shape_class=float64,
                           kernels=kernels) == "triton"


def test_auto_without_the_pallas_triton_lowering_takes_other_kernels_or_the_reference(
        monkeypatch):
    """A JAX without its (deprecated) Pallas Triton lowering: "auto" on a GPU takes a
    jax-triton row, and the reference where the Pallas kernel would have run; an explicit
    "pallas" or "interpret" raises naming the lowering."""
    _on_a_gpu(monkeypatch, triton=True)
    monkeypatch.setattr(_backend, "pallas_unavailable_reason",
                        lambda: "JAX's Pallas Triton lowering (removed)")
    both = ("pallas", "triton")
    streaming = _backend.piecewise_shape_class(False, "float32", 1 << 26, True)
    multi = _backend.piecewise_shape_class(False, "float32", 1 << 26, False)
    assert resolve_backend("auto", op="t", capability="piecewise", shape_class=streaming,
                           kernels=both) == "triton"
    assert resolve_backend("auto", op="t", capability="piecewise", shape_class=multi,
                           kernels=both) == "reference"
    for backend in ("pallas", "interpret"):
        with pytest.raises(gpustat.BackendUnavailableError, match="Pallas Triton lowering"):
            resolve_backend(backend, op="t", capability="piecewise", shape_class=multi,
                            kernels=both)
    assert "pallas" not in _backend.available_backends()


def test_border_classes_pad_the_spare_column(monkeypatch):
    """The fused kernel pads k_a plus its spare column: k_a <= 15 is the K = 16 class."""
    _on_a_gpu(monkeypatch, triton=True)
    assert _backend.border_shape_class(np.float64, 15) == "float64/k16/d8"
    assert _backend.border_shape_class(np.float64, 16) == "float64/k32/d8"
    assert _backend.border_shape_class(np.float64, 15, 9) == "float64/k16/d16"
    assert _backend.border_shape_class(np.float64, 15, 17) == "float64/k16/d32"
    for shape_class, path in [("float64/k16/d8", "triton"), ("float64/k32/d8", "pallas"),
                              ("float32/k16/d8", "pallas"), ("float64/k16/d16", "pallas"),
                              ("float64/k32/d32", "reference"), ("float32/k16/d32", "pallas")]:
        assert resolve_backend("auto", op="t", capability="border", shape_class=shape_class,
                               kernels=("pallas", "triton")) == path


def test_every_rule_names_a_known_capability_path_and_benchmark():
    import pathlib

    benches = pathlib.Path(__file__).parents[1] / "benchmarks"
    for rule in _backend.AUTO_RULES:
        assert rule.choice in ("reference", "pallas", "triton", "mosaic"), rule
        assert rule.reason and (benches / f"{rule.benchmark.split(':')[0]}.py").exists(), rule
