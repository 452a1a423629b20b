"""Every registered Pallas kernel call lowers for CUDA on this CPU machine (PALLAS.md)."""

import importlib
import pkgutil

import pytest

import gpustat.pallas
from gpustat.pallas._common import LOWERING_CASES
from tests.helpers import assert_lowers_for_cuda

KERNEL_MODULES = sorted(m.name for m in pkgutil.iter_modules(gpustat.pallas.__path__)
                        if not m.name.startswith("_"))
for _name in KERNEL_MODULES:
    importlib.import_module(f"gpustat.pallas.{_name}")


@pytest.mark.parametrize("module", KERNEL_MODULES)
def test_every_kernel_module_registers_cases(module):
    assert any(case.module == module for case in LOWERING_CASES), (
        f"gpustat/pallas/{module}.py registers no lowering case")


@pytest.mark.parametrize("case", LOWERING_CASES, ids=lambda c: f"{c.module}:{c.name}")
def test_lowers_for_cuda(case):
    assert_lowers_for_cuda(case.fn, case.args)
