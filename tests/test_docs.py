"""Every public name is documented: a docstring and a mention in a docs page."""

from pathlib import Path

import pytest

import gpustat

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
