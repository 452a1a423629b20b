"""The kernel registry (gpustat._backend.KERNELS) against the kernel modules' code, what
removing JAX's deprecated Pallas Triton lowering would cost, and gpustat leaving the user's
warning filters alone."""

import ast
import functools
import operator
import subprocess
import sys
from pathlib import Path

import pytest

import gpustat
from gpustat._backend import KERNELS, LOWERINGS, ops_losing_gpu_kernels

ROOT = Path(__file__).resolve().parent.parent
KERNEL_TREES = ("pallas", "triton")
# how a kernel module launches: Pallas (pallas_call), jax-triton (launch -> triton_call)
LAUNCHES = {"pallas_call", "launch", "triton_call"}


@functools.cache
def _module_graph(path: Path):
    """(top-level function names, name -> names each function or class refers to, the
    module's ``from X import Y`` map) of one kernel module; methods count under their name."""
    tree = ast.parse(path.read_text())
    defs = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            defs[node.name] = node
            if isinstance(node, ast.ClassDef):
                for m in node.body:
                    if isinstance(m, ast.FunctionDef):
                        defs.setdefault(m.name, m)
    refs = {name: {s.id if isinstance(s, ast.Name) else s.attr for s in ast.walk(node)
                   if isinstance(s, ast.Name | ast.Attribute)} for name, node in defs.items()}
    imports = {alias.asname or alias.name: node.module for node in tree.body
               if isinstance(node, ast.ImportFrom) for alias in node.names}
    functions = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
    return functions, refs, imports


def _reached(path: Path, name: str) -> set[str]:
    """Every name that function ``name`` refers to, directly or through the module's own
    functions and classes."""
    _, refs, _ = _module_graph(path)
    seen, todo, names = set(), [name], set()
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        names |= refs[current]
        todo += [n for n in refs[current] if n in refs]
    return names


def _derived_lowering(tree: str, path: Path, name: str) -> str | None:
    """The lowering a kernel function goes through, read from its code: a Pallas kernel
    that uses Mosaic GPU's API (``plgpu`` / ``mosaic_gpu``) lowers through Mosaic GPU; one
    launched by ``gpustat.pallas._common.pallas_call`` (Triton compiler params) through
    Pallas Triton; the jax-triton tree launches through ``_common.launch`` (``triton_call``).
    None: the function launches no kernel."""
    names = _reached(path, name)
    mosaic_launch = tree == "pallas" and {"plgpu", "kernel"} <= names  # plgpu.kernel(...)
    if not names & LAUNCHES and not mosaic_launch:
        return None
    _, _, imports = _module_graph(path)
    if tree == "pallas" and names & {"plgpu", "mosaic_gpu"}:
        return "mosaic-gpu"
    if tree == "pallas" and imports.get("pallas_call") == "gpustat.pallas._common":
        return "pallas-triton"
    if tree == "triton" and imports.get("launch") == "gpustat.triton._common":
        return "jax-triton"
    return "unknown"


def kernel_entry_points() -> dict[str, str]:
    """``"<tree>.<module>.<function>"`` -> derived lowering, for every public function of a
    kernel module that launches a kernel."""
    found = {}
    for tree in KERNEL_TREES:
        # public kernel modules, and the Mosaic GPU ones (private: only dispatch calls them)
        paths = [p for p in (ROOT / "gpustat" / tree).glob("*.py")
                 if not p.stem.startswith("_") or p.stem.startswith("_mosaic")]
        for path in sorted(paths):
            functions, _, _ = _module_graph(path)
            for name in functions:
                if not name.startswith("_"):
                    lowering = _derived_lowering(tree, path, name)
                    if lowering:
                        found[f"{tree}.{path.stem}.{name}"] = lowering
    return found


def test_registry_lists_every_kernel_entry_point():
    derived = kernel_entry_points()
    registered = [k.function for k in KERNELS]
    assert len(registered) == len(set(registered)), "a kernel is registered twice"
    missing = sorted(set(derived) - set(registered))
    stale = sorted(set(registered) - set(derived))
    assert not missing, f"kernels without an entry in gpustat._backend.KERNELS: {missing}"
    assert not stale, f"KERNELS entries that launch no kernel: {stale}"


def test_registered_lowering_is_the_one_the_code_uses():
    derived = kernel_entry_points()
    assert set(LOWERINGS.values()) <= {"pallas-triton", "jax-triton", "mosaic-gpu"}
    for kernel in KERNELS:
        assert kernel.lowering == derived[kernel.function], kernel


def test_registered_ops_are_public_callables():
    for kernel in KERNELS:
        for op in kernel.ops:
            assert callable(operator.attrgetter(op)(gpustat)), (kernel.function, op)


def test_what_removing_the_pallas_triton_lowering_would_cost():
    """The statement of what depends on the deprecated lowering: these ops lose every GPU
    kernel ("all") or the kernels of some calls ("partly") without it. A kernel moved to
    jax-triton or Mosaic GPU shortens this list; update it with the move."""
    assert ops_losing_gpu_kernels("pallas-triton") == {
        "GaussianMixture.fit": "partly",  # jax-triton E-step at precision="f16x3" only
        "bms.cell_moments": "all",
        "bms.fit": "all",
        "bms.joint_dense": "all",
        "bms.joint_diagonal": "all",
        "bms.joint_hvp": "all",
        "bms.row_derivatives": "all",
        "estimators.FFMClassifier.fit": "all",
        "estimators.FFMRegressor.fit": "all",
        "estimators.FMClassifier.fit": "all",
        "estimators.FMRegressor.fit": "all",
        "estimators.FwFMClassifier.fit": "all",
        "estimators.FwFMRegressor.fit": "all",
        "fm_predict": "all",
        "mixture.fit_em": "partly",
        "mixture.fit_gibbs": "all",
        "mixture.gibbs_sweep": "all",
        "mixture.log_prob": "all",
        "mixture.mvn_logpdf": "all",
        "mixture.online_em_step": "partly",
        "mixture.responsibilities": "all",
        "mixture.sample_labels": "all",
        "mixture.suff_stats": "partly",
        "mixture.suff_stats_from_labels": "all",
        "numerics.erfc": "all",
        "numerics.erfcx": "all",
        "numerics.log_ndtr": "all",
        "numerics.log_ndtr_and_mills": "all",
        "numerics.ndtr": "all",
        "numerics.probit_curvature": "all",
        "solve_batched_border": "partly",  # jax-triton border kernel: d <= 8 only
    }
    # ffm_predict, fwfm_predict and ppoly_eval keep their jax-triton kernels
    assert ops_losing_gpu_kernels("jax-triton") == {}


@pytest.mark.parametrize("lowering", ["pallas-triton", "jax-triton"])
def test_ops_losing_gpu_kernels_from_the_registry(lowering):
    """Against a direct reading of KERNELS: an op is lost entirely when all its kernels use
    ``lowering``, partly when its other kernels each serve only some calls."""
    ops = {op for k in KERNELS for op in k.ops}
    expected = {}
    for op in ops:
        mine = [k for k in KERNELS if op in k.ops and k.lowering == lowering]
        rest = [k for k in KERNELS if op in k.ops and k.lowering != lowering]
        if mine and not rest:
            expected[op] = "all"
        elif mine and not any(k.when == "" for k in rest):
            expected[op] = "partly"
    assert ops_losing_gpu_kernels(lowering) == expected


_WARNINGS_PROBE = """
import sys, warnings
import jax, jax.numpy as jnp

calls = []  # (calling module, function, args) of every filter change made through warnings
for fname in ("filterwarnings", "simplefilter", "resetwarnings"):
    def record(*args, _f=getattr(warnings, fname), _name=fname, **kwargs):
        calls.append((sys._getframe(1).f_globals.get("__name__", ""), _name, args))
        return _f(*args, **kwargs)
    setattr(warnings, fname, record)

import gpustat
for name in gpustat.__all__:
    getattr(gpustat, name)
from gpustat import numerics
from gpustat.pallas.numerics import KERNELS, elementwise
imported = list(warnings.filters)  # third-party imports (scipy, ...) may add their own
numerics.ndtr(jnp.linspace(-3.0, 3.0, 7), backend="interpret").block_until_ready()

# lowering a Pallas Triton kernel for CUDA: JAX's deprecation reaches the user unfiltered
sys.path.insert(0, sys.argv[1])
from tests.helpers import assert_lowers_for_cuda
fn, count = KERNELS["ndtr"]
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    assert_lowers_for_cuda(lambda x: elementwise(x, fn=fn, num_outputs=count),
                           [jax.ShapeDtypeStruct((256,), jnp.float32)])
    assert warnings.filters[0][0] == "always", "a filter was added while lowering"
ours = [c for c in calls if c[0].startswith("gpustat")]
assert not ours, f"gpustat changed warning filters: {ours}"
assert warnings.filters == imported, "running or lowering a kernel changed warnings.filters"
messages = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
assert any("Pallas Triton backend is deprecated" in m for m in messages), messages
print("ok")
"""


def test_gpustat_leaves_the_users_warning_filters_alone():
    """No process-wide (or scoped) warning filter: ``import gpustat`` with every public
    name, a kernel run and a kernel's CUDA lowering make no filter change from gpustat's
    code and leave ``warnings.filters`` as the imports left it, and JAX's Pallas Triton
    deprecation reaches a user who records warnings."""
    out = subprocess.run([sys.executable, "-c", _WARNINGS_PROBE, str(ROOT)],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("ok")


_WITHOUT_PALLAS_TRITON = """
import sys
sys.modules["jax.experimental.pallas.triton"] = None  # as in a JAX that removed the lowering
import jax
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp
import gpustat
from gpustat import _backend, numerics
from gpustat.demos import demo_modules

reason = _backend.pallas_unavailable_reason()
assert "Pallas Triton lowering" in reason, reason
assert "pallas" not in gpustat.available_backends()
assert "interpret" not in gpustat.available_backends()
for backend in ("pallas", "interpret"):
    try:
        numerics.ndtr(jnp.zeros(8), backend=backend)
    except gpustat.BackendUnavailableError as err:
        assert "Pallas Triton lowering" in str(err), err
    else:
        raise AssertionError(f"backend={backend!r} ran without the lowering")
from gpustat.__main__ import demo
rows = demo("auto", None, small=True)  # every capability, end to end
assert {r.backend for r in rows} == {"reference"}, {r.backend for r in rows}
assert {r.capability for r in rows} == {m.CAPABILITY for m in demo_modules()}
failed = [r for r in rows if r.max_error != r.max_error]  # NaN: the demo's own check failed
assert not failed, failed
print("ok")
"""


def test_every_capability_runs_without_the_pallas_triton_lowering():
    """The day JAX removes its Pallas Triton lowering (deprecated in 0.11), gpustat still
    imports and ``make demo``'s run of every capability passes (on the reference: no
    interpret mode); ``"pallas"`` and ``"interpret"`` raise ``BackendUnavailableError``
    naming the lowering."""
    out = subprocess.run([sys.executable, "-c", _WITHOUT_PALLAS_TRITON], capture_output=True,
                         text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("ok")
