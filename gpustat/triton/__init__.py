"""jax-triton backend: Triton-language twins of the hottest Pallas kernels.

``backend="triton"`` runs kernels written directly in the Triton language and
called through ``jax_triton.triton_call``, a second GPU path that does not
depend on the (deprecated) Pallas Triton lowering:

* :mod:`gpustat.triton.piecewise`: ``ppoly_eval`` (all dtypes, uniform and
  searched breakpoints, every extrapolate mode, trailing axes);
* :mod:`gpustat.triton.factorization`: ``ffm_predict`` and ``fwfm_predict`` scores;
* :mod:`gpustat.triton.border`: ``solve_batched_border``, one fused program per atom.
* :mod:`gpustat.triton.mixture`: the mixture E-step at ``precision="f16x3"`` (``suff_stats``,
  ``fit_em``), float16-split tensor-core GEMMs over quadratic features.

Nothing here imports ``triton`` or ``jax_triton`` until a Triton kernel is
called: gpustat imports and works without them (``pip install 'gpustat[triton]'``
adds jax-triton 0.3.1, the line that matches triton 3.6).

``backend="auto"`` on a CUDA GPU takes, per capability and shape class, the
faster GPU path in the committed benchmarks (``benchmarks/results/*/triton.jsonl``):
:data:`AUTO_WINNERS` lists the classes where the Triton kernel won; every
other class keeps the Pallas kernel (``docs/triton.md`` has the table).
"""

from __future__ import annotations

import functools
import importlib.util

import numpy as np

__all__ = [
    "AUTO_WINNERS",
    "auto_path",
    "border_shape_class",
    "factorization_shape_class",
    "piecewise_shape_class",
    "triton_installed",
]

# Points above which a piecewise evaluation is a streaming (HBM-bound) call.
_STREAMING_POINTS = 1 << 22

# (capability, shape class) -> "triton" where the Triton kernel (default settings) beat
# the Pallas one by more than 10% and XLA too, measured in the same run; ties within 10%
# and losses keep the Pallas kernel. Piecewise: the H100 run of commit b638935
# (benchmarks/results/nvidia-h100-80gb-hbm3/triton.jsonl; P = 256, D = 3; streaming =
# 2^26 points, cached = 2e6; ms XLA / Pallas / Triton). A streaming 16-bit x is
# evaluated through its 65,536-value table (gpustat.piecewise), so the bfloat16
# classes time that table's kernel plus the lookup. FFM: the H200 run
# (benchmarks/results/nvidia-h200/triton.jsonl, commit 7c9e2bc).
AUTO_WINNERS: dict[tuple[str, str], str] = {
    ("piecewise", "search/float32/streaming"): "triton",  # 8.32 / 0.335 / 0.272
    ("piecewise", "search/bfloat16/streaming"): "triton",  # table: 0.120 (Pallas kernel 0.299)
    ("piecewise", "uniform/bfloat16/streaming"): "triton",  # table: 0.117 (Pallas kernel 0.262)
    ("piecewise", "search/float64/streaming"): "triton",  # 9.21 / 0.775 / 0.571
    # uniform float32: 0.482 / 0.299 / 0.274 (a tie) at b638935; 0.485 / 0.302 / 0.261
    # in the sweep of commit a57f9e1, same file
    ("piecewise", "uniform/float32/streaming"): "triton",
    ("piecewise", "uniform/float64/streaming"): "triton",  # 0.790 / 0.704 / 0.473
    ("factorization", "ffm/float64"): "triton",  # 0.977 vs 1.276 ms, 2^18 rows
    # Border: the H100 run of commit 9c57cce (benchmarks/results/nvidia-h100-80gb-hbm3/
    # border.jsonl; ms Pallas / Triton): float64, k_a in [4, 12], 100k atoms 3.345 / 1.420.
    # Kept on Pallas: float32 on the same batch 1.764 / 2.018; float64 with k_a in
    # [17, 30] (K = 32), 30k atoms 4.452 / 7.484.
    ("border", "float64/k16"): "triton",
}


@functools.cache
def triton_installed() -> bool:
    """True when ``triton`` and ``jax_triton`` can be imported (checked without importing)."""
    return all(importlib.util.find_spec(m) is not None for m in ("triton", "jax_triton"))


def piecewise_shape_class(uniform: bool, x_dtype, num_points: int) -> str:
    """``"<uniform|search>/<x dtype>/<streaming|cached>"`` of a ``ppoly_eval`` call."""
    size = "streaming" if num_points > _STREAMING_POINTS else "cached"
    return f"{'uniform' if uniform else 'search'}/{np.dtype(x_dtype).name}/{size}"


def factorization_shape_class(model: str, dtype) -> str:
    """``"<model>/<compute dtype>"`` of an ``ffm_predict``/``fwfm_predict`` call."""
    return f"{model}/{np.dtype(dtype).name}"


def border_shape_class(dtype, max_border: int) -> str:
    """``"<compute dtype>/k<16|32>"`` of a ``solve_batched_border`` call: the widest padded
    border (the kernels pad ``k_a`` to 16 or 32; the Triton one needs a spare column, so
    ``k_a = 16`` counts as 32)."""
    return f"{np.dtype(dtype).name}/k{16 if max_border < 16 else 32}"


def auto_path(path: str, backend: str, capability: str, shape_class: str) -> str:
    """The path to run once ``resolve_backend`` chose ``path`` for the user's ``backend``.

    Only ``backend="auto"`` that resolved to the Pallas kernel changes: to
    ``"triton"`` where :data:`AUTO_WINNERS` says the Triton kernel is faster and
    jax-triton is installed.
    """
    if (backend == "auto" and path == "pallas"
            and AUTO_WINNERS.get((capability, shape_class)) == "triton" and triton_installed()):
        return "triton"
    return path
