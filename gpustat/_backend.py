"""Backend choice: the one place that decides reference / XLA / Pallas / Triton.

Every public op takes ``backend="auto" | "pallas" | "reference" | "interpret"`` (and
``"triton"`` where a jax-triton kernel exists, ``"mosaic"`` where a Mosaic GPU kernel
exists) and calls :func:`resolve_backend` once, at trace time, before dispatching:

* ``"auto"``: on a CUDA GPU, the path that :data:`AUTO_RULES` names for the call's
  capability and shape class (the first matching row), else the Pallas kernel when it
  supports the call (dtype, shape); the reference elsewhere.
* ``"pallas"`` / ``"triton"`` / ``"mosaic"``: the compiled kernel; raises
  :class:`BackendUnavailableError` on a machine that cannot run it (``"mosaic"``:
  no CUDA GPU, a GPU older than sm_90, or a jaxlib without the Mosaic GPU
  bindings; ``"pallas"``: also a JAX without its Pallas Triton lowering, which JAX
  0.11 deprecated). Never falls back.
* ``"interpret"``: the Pallas kernel body under ``interpret=True`` on any platform (tests;
  it needs the Pallas Triton lowering's module as well).
* ``"reference"``: the pure ``jax.numpy`` definition of the op, compiled by XLA.

Without the Pallas Triton lowering ``"auto"`` takes the jax-triton or Mosaic GPU kernel
where a row names one, else the reference: every op keeps working.

Shape classes are strings built by the ``*_shape_class`` helpers below; rows of
:data:`AUTO_RULES` match them with shell-style wildcards (``fnmatch``).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import importlib
import importlib.util

import jax
import numpy as np

__all__ = [
    "AUTO_RULES",
    "BACKENDS",
    "KERNELS",
    "LOWERINGS",
    "AutoRule",
    "BackendUnavailableError",
    "Kernel",
    "available_backends",
    "border_shape_class",
    "cuda_gpu_available",
    "factorization_shape_class",
    "mosaic_unavailable_reason",
    "ops_losing_gpu_kernels",
    "pallas_unavailable_reason",
    "piecewise_shape_class",
    "resolve_backend",
    "triton_installed",
]

BACKENDS = ("auto", "pallas", "reference", "interpret", "triton", "mosaic")


class BackendUnavailableError(RuntimeError):
    """A backend was requested explicitly but this machine cannot run it."""


@dataclasses.dataclass(frozen=True)
class AutoRule:
    """One row of the ``"auto"`` table: on a CUDA GPU, calls of ``capability`` whose shape
    class matches ``shape_class`` run ``choice``; ``benchmark`` names the committed
    benchmark case (``benchmarks/bench_<capability>.py``) that justifies it."""

    capability: str
    shape_class: str
    choice: str
    reason: str
    benchmark: str


#: What ``"auto"`` runs on a CUDA GPU, first matching row wins; calls no row matches run
#: the Pallas kernel when it supports them. A ``"triton"`` row needs jax-triton installed;
#: without it the call runs the Pallas kernel (or the reference where none exists). A
#: ``"mosaic"`` row applies on sm_90+ GPUs where the Mosaic GPU kernel takes the call;
#: elsewhere the next matching row does (so the Triton kernels serve older GPUs).
AUTO_RULES: tuple[AutoRule, ...] = (
    AutoRule("piecewise", "uniform/*/small/*", "reference",
             "an O(1) lookup and Horner step: XLA's fusion of the reference ties the kernel "
             "up to 2^21 points", "bench_piecewise: uniform cases"),
    AutoRule("piecewise", "search/float32/streaming/single", "mosaic",
             "the Mosaic GPU kernel (TMA-pipelined x and y, guided lookup) streams x "
             "1.09-1.12x faster than the jax-triton one, with the polynomial constant or "
             "traced", "bench_piecewise: search_f32_N2^26/public_mosaic"),
    AutoRule("piecewise", "uniform/float32/streaming/single", "mosaic",
             "the Mosaic GPU kernel streams x 1.13-1.17x faster than the jax-triton one for "
             "a constant polynomial (a traced one ties)",
             "bench_piecewise: uniform_f32_N2^26/public_mosaic"),
    AutoRule("piecewise", "search/float32/streaming/single", "triton",
             "the jax-triton search streams x at a higher fraction of copy bandwidth",
             "bench_triton: piecewise search float32 2^26"),
    AutoRule("piecewise", "search/float64/streaming/single", "triton",
             "the jax-triton search streams x faster", "bench_triton: piecewise search float64"),
    AutoRule("piecewise", "search/bfloat16/streaming/single", "triton",
             "16-bit x is read through its 65,536-value table, built faster by jax-triton",
             "bench_triton: piecewise search bfloat16"),
    AutoRule("piecewise", "uniform/bfloat16/streaming/single", "triton",
             "16-bit x is read through its 65,536-value table, built faster by jax-triton",
             "bench_triton: piecewise uniform bfloat16"),
    AutoRule("piecewise", "uniform/float32/streaming/single", "triton",
             "the jax-triton lookup streams x at least as fast",
             "bench_triton: piecewise uniform float32"),
    AutoRule("piecewise", "uniform/float64/streaming/single", "triton",
             "the jax-triton lookup streams x faster", "bench_triton: piecewise uniform float64"),
    AutoRule("factorization", "ffm/float64", "triton",
             "the jax-triton FFM program keeps a row's field pairs in registers",
             "bench_triton: ffm float64 2^18 rows"),
    AutoRule("border", "float64/k16/d8", "triton",
             "one fused jax-triton program per atom for borders padded to 16",
             "bench_border: fused Triton vs Pallas, float64, k_a in [4, 12]"),
    AutoRule("border", "float64/*/d32", "reference",
             "rows of 17 to 32 dimensions: XLA's batched Cholesky outruns the looped row "
             "factorisation", "bench_border: summary_d32"),
    AutoRule("mixture", "f16x3/*", "triton",
             "precision='f16x3' is the jax-triton E-step's tensor-core path",
             "bench_mixture: EM iteration f16x3"),
    AutoRule("estimators", "scatter", "reference",
             "XLA's scatter-add of the sparse gradient ties the Pallas kernel at CTR shapes",
             "bench_estimators: epoch cases"),
    AutoRule("numerics", "*", "reference",
             "standalone elementwise probit functions are compute-bound; XLA fuses the same "
             "code as well as the kernel (the kernel-safe forms pay inside other kernels)",
             "bench_numerics"),
)

# x above this many points streams from HBM (piecewise shape classes)
_STREAMING_POINTS = 1 << 22
# up to this many points a uniform lookup is XLA's
_SMALL_POINTS = 1 << 21


@functools.cache
def cuda_gpu_available() -> bool:
    """True when JAX's default backend is an NVIDIA (CUDA) GPU."""
    if jax.default_backend() != "gpu":
        return False
    device = jax.devices()[0]
    return "cuda" in device.client.platform_version.lower()


def _machine_description() -> str:
    devices = jax.devices()
    kinds = sorted({f"{d.platform}:{d.device_kind}" for d in devices})
    return f"JAX default backend {jax.default_backend()!r} with devices {kinds}"


def _triton_missing() -> list[str]:
    return [m for m in ("triton", "jax_triton") if importlib.util.find_spec(m) is None]


@functools.cache
def triton_installed() -> bool:
    """True when ``triton`` and ``jax_triton`` can be imported (checked without importing)."""
    return not _triton_missing()


@functools.cache
def mosaic_unavailable_reason() -> str:
    """Why Mosaic GPU kernels cannot run here ('' when they can): they need a CUDA GPU
    of compute capability 9.0 or later and jaxlib's Mosaic GPU bindings."""
    if not cuda_gpu_available():
        return f"a CUDA GPU, but this machine has {_machine_description()}"
    capability = getattr(jax.devices()[0], "compute_capability", "0.0")
    if float(capability) < 9.0:
        return (f"an sm_90 or later GPU, but {jax.devices()[0].device_kind} has compute "
                f"capability {capability}")
    try:
        importlib.import_module("jax.experimental.mosaic.gpu")
        importlib.import_module("jax.experimental.pallas.mosaic_gpu")
    except ImportError as exc:
        return f"jaxlib's Mosaic GPU bindings, which do not import: {exc}"
    return ""


@functools.cache
def pallas_unavailable_reason() -> str:
    """Why the Pallas kernels cannot be built here, on any platform ('' when they can):
    they lower through JAX's Pallas Triton backend, deprecated in JAX 0.11 and to be
    removed."""
    try:
        importlib.import_module("jax.experimental.pallas.triton")
    except ImportError as exc:
        return (f"JAX's Pallas Triton lowering (jax.experimental.pallas.triton), which does "
                f"not import in jax {jax.__version__}: {exc}")
    return ""


def available_backends() -> tuple[str, ...]:
    """Backends that can run on this machine, in the order "auto" prefers them."""
    pallas = not pallas_unavailable_reason()
    names = []
    if cuda_gpu_available():
        if pallas:
            names.append("pallas")
        if triton_installed():
            names.append("triton")
        if not mosaic_unavailable_reason():
            names.append("mosaic")
    names.append("reference")
    if pallas:
        names.append("interpret")
    return tuple(names)


def piecewise_shape_class(uniform: bool, x_dtype, num_points: int, single: bool) -> str:
    """``"<uniform|search>/<x dtype>/<small|cached|streaming>/<single|multi>"`` of a
    ``ppoly_eval`` call (``single``: one polynomial, no trailing axes)."""
    size = ("streaming" if num_points > _STREAMING_POINTS
            else "small" if num_points <= _SMALL_POINTS else "cached")
    kind = "uniform" if uniform else "search"
    return f"{kind}/{np.dtype(x_dtype).name}/{size}/{'single' if single else 'multi'}"


def factorization_shape_class(model: str, dtype) -> str:
    """``"<model>/<compute dtype>"`` of an ``fm/ffm/fwfm_predict`` call."""
    return f"{model}/{np.dtype(dtype).name}"


def border_shape_class(dtype, max_border: int, d: int = 1) -> str:
    """``"<compute dtype>/k<16|32>/d<8|16|32>"`` of a ``solve_batched_border`` launch group:
    the widest padded border (the kernels pad ``k_a`` to 16 or 32; the Triton one needs a
    spare column, so ``k_a = 16`` counts as 32) and the row dimension class (``d <= 8``
    unrolled, larger ``d`` the Pallas kernel's looped row factorisation, up to 16 or 32)."""
    d_class = 8 if d <= 8 else 16 if d <= 16 else 32
    return f"{np.dtype(dtype).name}/k{16 if max_border < 16 else 32}/d{d_class}"


def _auto_rule(capability: str, shape_class: str, skip: tuple[str, ...] = ()) -> AutoRule | None:
    """The first row matching the call whose choice is not in ``skip``."""
    for rule in AUTO_RULES:
        if (rule.capability == capability and rule.choice not in skip
                and fnmatch.fnmatchcase(shape_class, rule.shape_class)):
            return rule
    return None


def resolve_backend(
    backend: str,
    *,
    op: str,
    capability: str = "",
    shape_class: str = "",
    kernels: tuple[str, ...] = ("pallas",),
    kernel_supports: bool = True,
    unsupported_reason: str = "",
    unsupported: dict[str, str] | None = None,
) -> str:
    """Turn a user's ``backend=`` argument into the concrete path to run.

    Args:
        backend: the user's request, one of :data:`BACKENDS`.
        op: public name of the op, used in error messages.
        capability: the row key of :data:`AUTO_RULES` (the module name).
        shape_class: the call's class (a ``*_shape_class`` helper's string).
        kernels: the GPU kernels this call has (``"pallas"``, ``"triton"``,
            ``"mosaic"``); ``"interpret"`` runs the Pallas one.
        kernel_supports: whether the kernels handle this call (dtype, shape).
            ``"auto"`` uses the reference when False; an explicit kernel backend
            raises ``ValueError`` with ``unsupported_reason``.
        unsupported_reason: why the kernels do not handle the call.
        unsupported: per kernel name, why that kernel alone cannot run this call
            (``"auto"`` then skips it: a ``"mosaic"`` row gives way to the next
            matching row, another kernel to the Pallas one; an explicit request
            raises ``ValueError`` with the reason).

    Returns:
        One of ``"pallas"``, ``"interpret"``, ``"reference"``, ``"triton"``, ``"mosaic"``.

    Raises:
        ValueError: unknown backend name, or a kernel asked for a call it cannot do.
        BackendUnavailableError: ``"pallas"``/``"triton"``/``"mosaic"`` requested on a
            machine that cannot run it.
    """
    unsupported = unsupported or {}
    offered = ["auto", *(k for k in ("pallas", "triton", "mosaic") if k in kernels),
               "reference"]
    if "pallas" in kernels:
        offered.append("interpret")
    if backend not in offered:
        raise ValueError(f"{op}: backend must be one of {offered}, got {backend=!r}")
    if backend == "auto":
        if not (cuda_gpu_available() and kernel_supports):
            return "reference"
        # a "mosaic" row that cannot run here gives way to the next matching row
        mosaic_runs = ("mosaic" in kernels and "mosaic" not in unsupported
                       and not mosaic_unavailable_reason())
        rule = _auto_rule(capability, shape_class, skip=() if mosaic_runs else ("mosaic",))
        choice = rule.choice if rule else "pallas"
        if (choice == "triton" and not triton_installed()) or choice in unsupported:
            choice = "pallas"
        if choice == "pallas" and pallas_unavailable_reason():
            choice = "reference"
        return choice if choice in (*kernels, "reference") else "reference"
    if backend in ("pallas", "interpret") and pallas_unavailable_reason():
        raise BackendUnavailableError(
            f"{op}: backend={backend!r} needs {pallas_unavailable_reason()}. Use "
            f"backend='auto' or 'reference'."
        )
    if backend in ("pallas", "triton") and not cuda_gpu_available():
        raise BackendUnavailableError(
            f"{op}: backend={backend!r} needs a CUDA GPU, but this machine has "
            f"{_machine_description()}. Use backend='auto', 'reference' or 'interpret'."
        )
    if backend == "mosaic" and mosaic_unavailable_reason():
        raise BackendUnavailableError(
            f"{op}: backend='mosaic' (Mosaic GPU kernels) needs "
            f"{mosaic_unavailable_reason()}. Use backend='auto', 'pallas' or 'reference'."
        )
    if backend == "triton" and _triton_missing():
        raise BackendUnavailableError(
            f"{op}: backend='triton' needs the packages {_triton_missing()} "
            "(pip install 'gpustat[triton]'), which are not installed."
        )
    if backend != "reference" and not kernel_supports:
        raise ValueError(f"{op}: backend={backend!r} cannot run this call: {unsupported_reason}")
    if backend in unsupported:
        raise ValueError(f"{op}: backend={backend!r} cannot run this call: {unsupported[backend]}")
    return backend


# -- kernel registry: which lowering each GPU kernel goes through -----------------------------

#: The compiler stack behind each kernel ``backend=`` name. JAX 0.11 deprecated the Pallas
#: Triton lowering ("will be removed in a future JAX version"); jax-triton calls Triton
#: kernels through the official Triton bindings.
LOWERINGS: dict[str, str] = {
    "pallas": "pallas-triton",
    "triton": "jax-triton",
    "mosaic": "mosaic-gpu",
}


@dataclasses.dataclass(frozen=True)
class Kernel:
    """One GPU kernel entry point: a public function of a kernel module that launches a
    kernel, the ``backend=`` name that runs it (its lowering is :data:`LOWERINGS` of that
    name), the public ops (dotted names under ``gpustat``) whose dispatch reaches it, and,
    where it serves only part of those ops' calls, which part (``when``)."""

    function: str
    backend: str
    ops: tuple[str, ...]
    when: str = ""

    @property
    def lowering(self) -> str:
        return LOWERINGS[self.backend]


_FM_FITS = tuple(f"estimators.{m}{t}.fit" for m in ("FM", "FFM", "FwFM")
                 for t in ("Classifier", "Regressor"))
_NUMERICS = tuple(f"numerics.{f}" for f in ("erfc", "erfcx", "log_ndtr", "log_ndtr_and_mills",
                                           "ndtr", "probit_curvature"))
_EM = ("mixture.suff_stats", "mixture.fit_em", "mixture.online_em_step", "GaussianMixture.fit")
_GIBBS = ("mixture.gibbs_sweep", "mixture.fit_gibbs")

#: Every kernel entry point of ``gpustat/pallas/`` and ``gpustat/triton/``
#: (tests/test_kernel_registry.py checks this against the kernel modules' code).
KERNELS: tuple[Kernel, ...] = (
    Kernel("pallas.bms.cell_moments", "pallas", ("bms.cell_moments",)),
    Kernel("pallas.bms.row_derivatives", "pallas", ("bms.row_derivatives", "bms.fit")),
    Kernel("pallas.bms.joint_hvp", "pallas", ("bms.joint_hvp",)),
    Kernel("pallas.bms.joint_dense", "pallas", ("bms.joint_dense",)),
    Kernel("pallas.bms.joint_diagonal", "pallas", ("bms.joint_diagonal",)),
    Kernel("pallas.border.solve_border_pallas", "pallas", ("solve_batched_border",)),
    Kernel("triton.border.solve_border_triton", "triton", ("solve_batched_border",),
           "rows of d <= 8 (the Pallas kernel takes d <= 32)"),
    Kernel("pallas.estimators.scatter_add_rows", "pallas", _FM_FITS),
    Kernel("pallas.factorization.fm_scores", "pallas", ("fm_predict",)),
    Kernel("pallas.factorization.ffm_scores", "pallas", ("ffm_predict",)),
    Kernel("pallas.factorization.fwfm_scores", "pallas", ("fwfm_predict",)),
    Kernel("pallas.factorization.fwfm_slot_scores", "pallas", ("fwfm_predict",)),
    Kernel("triton.factorization.scores_forward", "triton", ("ffm_predict", "fwfm_predict")),
    Kernel("triton.factorization.ffm_scores", "triton", ("ffm_predict",)),
    Kernel("triton.factorization.fwfm_scores", "triton", ("fwfm_predict",)),
    Kernel("pallas.mixture.mvn_logpdf", "pallas",
           ("mixture.mvn_logpdf", "mixture.responsibilities")),
    Kernel("pallas.mixture.log_prob", "pallas", ("mixture.log_prob",)),
    Kernel("pallas.mixture.suff_stats", "pallas", _EM),
    Kernel("pallas.mixture.sample_labels", "pallas", ("mixture.sample_labels",)),
    Kernel("pallas.mixture.sample_labels_with_stats", "pallas", _GIBBS),
    Kernel("pallas.mixture.suff_stats_from_labels", "pallas", ("mixture.suff_stats_from_labels",)),
    Kernel("pallas.mixture.label_stats", "pallas", ("mixture.suff_stats_from_labels", *_GIBBS)),
    Kernel("triton.mixture.suff_stats", "triton", _EM, "precision='f16x3'"),
    Kernel("triton.mixture.log_prob", "triton", ()),
    Kernel("pallas.numerics.elementwise", "pallas", _NUMERICS),
    Kernel("pallas.piecewise.ppoly_eval_tables", "pallas", ("ppoly_eval",)),
    Kernel("pallas.piecewise.ppoly_eval_pallas", "pallas", ("ppoly_eval",)),
    Kernel("triton.piecewise.ppoly_eval_triton", "triton", ("ppoly_eval",)),
    Kernel("pallas._mosaic_piecewise.ppoly_eval_mosaic", "mosaic", ("ppoly_eval",),
           "float32, one polynomial, sm_90+ ('auto' at streaming sizes)"),
    Kernel("pallas._mosaic_mixture.suff_stats", "mosaic", _EM,
           "precision='f16x3', sm_90+, jax 0.11 (backend='mosaic' only)"),
    Kernel("pallas._mosaic_mixture.log_prob", "mosaic", ()),
)


def ops_losing_gpu_kernels(lowering: str = "pallas-triton") -> dict[str, str]:
    """What removing ``lowering`` would cost: each public op with a kernel of that lowering,
    mapped to ``"all"`` (no kernel of another lowering: every call runs the reference) or
    ``"partly"`` (another lowering's kernels serve only some calls, see :attr:`Kernel.when`).
    Ops whose other kernels serve every call are not listed."""
    lost = {}
    for op in sorted({op for k in KERNELS if k.lowering == lowering for op in k.ops}):
        others = [k for k in KERNELS if op in k.ops and k.lowering != lowering]
        if not others:
            lost[op] = "all"
        elif all(k.when for k in others):
            lost[op] = "partly"
    return lost
