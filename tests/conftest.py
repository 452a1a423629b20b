"""Test configuration: float64 on, the gpu marker skipped without a CUDA GPU."""

import jax
import pytest

jax.config.update("jax_enable_x64", True)

from gpustat._backend import cuda_gpu_available  # noqa: E402


def pytest_collection_modifyitems(config, items):
    if cuda_gpu_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run `make gpu-check` on the GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drop JAX's compiled programs after each test module. Every XLA CPU executable keeps
    memory mappings; a worker that compiles the whole suite's thousands of programs would
    pass the kernel's limit on mappings per process (vm.max_map_count) and crash."""
    yield
    jax.clear_caches()
