"""`make demo` installs only the core dependencies: every third-party module that gpustat
imports at module level must be one of them (gpustat.triton, loaded lazily by
backend="triton", needs the optional Triton stack and is left out)."""

import ast
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# import name -> distribution name where they differ
DISTRIBUTIONS = {"sklearn": "scikit-learn"}


def module_level_imports(path: Path) -> set[str]:
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_core_dependencies_cover_the_package_imports():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {re.split(r"[<>=\[ ]", req, maxsplit=1)[0].lower()
                for req in project["dependencies"]}
    package = ROOT / "gpustat"
    imported = set()
    for path in package.rglob("*.py"):
        if (package / "triton") not in path.parents:
            imported |= module_level_imports(path)
    third_party = imported - set(sys.stdlib_module_names) - {"gpustat"}
    missing = {DISTRIBUTIONS.get(name, name) for name in third_party} - declared
    assert not missing, f"imported by gpustat but not in [project] dependencies: {missing}"


def test_distribution_name_and_command_do_not_clash_with_the_gpu_monitor():
    """``gpustat`` on the package index is NVIDIA's GPU monitor (with a ``gpustat`` command)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == "gpustat-jax"
    assert "gpustat" not in project.get("scripts", {})


def test_import_gpustat_loads_no_capability_until_used():
    import subprocess

    code = ("import sys, gpustat; heavy = ['jax', 'sklearn', 'optax', 'scipy', "
            "'jax.experimental.pallas', 'gpustat.mixture']; "
            "print([m for m in heavy if m in sys.modules]); "
            "gpustat.GaussianMixture; print('gpustat.mixture' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout.split("\n")
    assert out[:2] == ["[]", "True"], out


def test_ci_tests_the_lower_end_of_the_jax_range():
    """`make test` runs pytest at JAX_MIN of the Makefile: the range's lower bound, the same
    for jax and jaxlib (the newest end is what pip resolves in .venv)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    bounds = {}
    for req in project["dependencies"]:
        name, spec = re.match(r"([a-z]+)(.*)", req).groups()
        if name in ("jax", "jaxlib"):
            bounds[name] = re.fullmatch(r">=([\d.]+),<([\d.]+)", spec).group(1)
    jax_min = re.search(r"^JAX_MIN := ([\d.]+)$", (ROOT / "Makefile").read_text(), re.M)
    assert bounds == {"jax": jax_min.group(1), "jaxlib": jax_min.group(1)}, bounds
