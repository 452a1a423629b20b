"""The docs are tested: every public name is documented (a docstring and a mention in a
docs page), every ```python block of README.md and docs/*.md runs as written, and the
benchmarks page is the one ``benchmarks/report.py`` renders from the committed results.

A block fenced as ```python gpu needs a CUDA GPU and is skipped elsewhere; keep such
blocks rare. The blocks of one page run in order in one namespace (a later block may use
an earlier one's names), starting from JAX's default configuration (64-bit types off),
as a reader's fresh interpreter would.
"""

import re
from pathlib import Path

import jax
import pytest

import gpustat
from benchmarks import report
from gpustat._backend import cuda_gpu_available

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
TEXT = "\n".join(p.read_text() for p in DOCS.glob("*.md"))
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
# a fenced block: ```python or ```python gpu at the start of a line, up to the closing ```
BLOCK = re.compile(r"^```python( gpu)?[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)


def code_blocks(page: Path) -> list[tuple[int, bool, str]]:
    """(first line number, needs a GPU, source) of each ```python block of ``page``."""
    text = page.read_text()
    return [(text.count("\n", 0, m.start(2)) + 1, bool(m.group(1)), m.group(2))
            for m in BLOCK.finditer(text)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_code_blocks_run_as_written(page, monkeypatch):
    blocks = code_blocks(page)
    if page.name not in ("benchmarks.md", "design.md"):
        assert blocks, f"{page.name} has no runnable ```python example"
    monkeypatch.setenv("MPLBACKEND", "Agg")
    x64 = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", False)
    namespace = {"__name__": f"docs_{page.stem}"}
    try:
        for line, gpu, source in blocks:
            if gpu and not cuda_gpu_available():
                continue
            exec(compile(source, f"{page.relative_to(ROOT)}:{line}", "exec"), namespace)
    finally:
        jax.config.update("jax_enable_x64", x64)


def test_fenced_python_blocks_are_all_found():
    """Every ```python fence opens a block the runner sees (no typo'd info strings)."""
    for page in PAGES:
        fences = re.findall(r"^```python.*$", page.read_text(), re.M)
        assert len(fences) == len(code_blocks(page)), (page.name, fences)
        assert all(f.strip() in ("```python", "```python gpu") for f in fences), fences


# a commit hash: 7-40 hex digits with at least one letter and one digit (not 1000000000000)
# (a float literal's mantissa digits such as 8.5777706184603153e-01 are not one)
COMMIT = re.compile(r"(?<![.\w])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![-+.\w])")


def test_no_commit_hashes_in_user_docs_or_code():
    """README.md, docs/ and the package state rules, not run history (benchmarks.md is
    generated from the results)."""
    sources = [p for p in PAGES if p.name != "benchmarks.md"]
    sources += sorted((ROOT / "gpustat").rglob("*.py"))
    for source in sources:
        found = COMMIT.findall(source.read_text())
        assert not found, f"{source.relative_to(ROOT)} names commits {found}"


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


def test_readme_performance_table_is_rendered_from_the_committed_results():
    readme = (ROOT / "README.md").read_text()
    assert report.headline_table(report.load()) in readme, (
        "README.md's performance table differs from benchmarks.report.headline_table: "
        "paste its output after committing results")


def test_benchmark_table_leaves_missing_ratios_empty():
    row = {"case": "fm", "shape": [4, 2], "dtype": "float32", "backend": "pallas",
           "median_ms": 1.5, "speedup_vs_xla": None, "speedup_vs_cpu": 12.0}
    assert report.table([row]).splitlines()[-1] == (
        "| fm | 4x2 | float32 | pallas | 1.5 |  |  |  | 12 |  |")
