"""Every public name is documented: a docstring and a mention in a docs page; the
benchmarks page is the one ``benchmarks/report.py`` renders from the committed results."""

from pathlib import Path

import pytest

import gpustat
from benchmarks import report

DOCS = Path(__file__).resolve().parent.parent / "docs"
TEXT = "\n".join(p.read_text() for p in DOCS.glob("*.md"))


@pytest.mark.parametrize("name", sorted(gpustat.__all__))
def test_public_name_is_documented(name):
    obj = getattr(gpustat, name)
    assert (obj.__doc__ or "").strip(), f"gpustat.{name} has no docstring"
    assert f"gpustat.{name}" in TEXT or f"`{name}`" in TEXT, (
        f"gpustat.{name} appears in no page under docs/")


@pytest.mark.parametrize("module", ["numerics", "testing"])
def test_namespace_members_have_docstrings(module):
    mod = getattr(gpustat, module)
    for name in mod.__all__:
        assert (getattr(mod, name).__doc__ or "").strip(), f"gpustat.{module}.{name}"


def test_benchmarks_page_is_rendered_from_the_committed_results():
    page = (DOCS / "benchmarks.md").read_text()
    assert page == report.render(report.load()), (
        "docs/benchmarks.md is stale: run `make bench-report` after committing results")


def test_benchmark_table_leaves_missing_ratios_empty():
    row = {"case": "fm", "shape": [4, 2], "dtype": "float32", "backend": "pallas",
           "median_ms": 1.5, "speedup_vs_xla": None, "speedup_vs_cpu": 12.0}
    assert report.table([row]).splitlines()[-1] == (
        "| fm | 4x2 | float32 | pallas | 1.5 |  |  |  | 12 |  |")
