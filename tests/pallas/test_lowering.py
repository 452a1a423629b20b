"""Every Pallas kernel module's cases lower for CUDA on this CPU machine (PALLAS.md)."""

import pkgutil

import pytest

import gpustat.pallas
from tests.helpers import assert_lowers_for_cuda
from tests.pallas.lowering_cases import all_cases

CASES = all_cases()
KERNEL_MODULES = sorted(m.name for m in pkgutil.iter_modules(gpustat.pallas.__path__)
                        if not m.name.startswith("_"))


@pytest.mark.parametrize("module", KERNEL_MODULES)
def test_every_kernel_module_has_cases(module):
    assert any(case.module == module for case in CASES), (
        f"gpustat/pallas/{module}.py has no lowering case in tests/pallas/lowering_cases.py")


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.module}:{c.name}")
def test_lowers_for_cuda(case):
    assert_lowers_for_cuda(case.fn, case.args)
