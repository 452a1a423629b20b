"""End-to-end demos, one module per capability, collected by ``python -m gpustat demo``.

A demo module defines ``CAPABILITY`` (the module name it exercises) and
``run(backend: str, small: bool) -> list[DemoRow]``: it builds small synthetic
data, runs the capability through ``backend`` (``"reference"`` or a kernel
backend), compares with the reference or an oracle and times the call. A module
whose capability is float64 only sets ``FLOAT64_ONLY = True``: the demo skips it
(and says so) when 64-bit types are off.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import time
from collections.abc import Callable
from types import ModuleType

import jax
import numpy as np

__all__ = ["DemoRow", "demo_modules", "demo_names", "max_rel_error", "timed"]


@dataclasses.dataclass(frozen=True)
class DemoRow:
    """One line of the demo table."""

    capability: str
    case: str
    backend: str
    max_error: float
    seconds: float
    note: str = ""


def demo_names() -> list[str]:
    """Names of the demo modules in this package (their ``CAPABILITY``), sorted; imports none."""
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def demo_modules(names: list[str] | None = None) -> list[ModuleType]:
    """The demo modules called ``names`` (default: all), in name order."""
    chosen = [name for name in demo_names() if names is None or name in names]
    return [importlib.import_module(f"{__name__}.{name}") for name in chosen]


def timed(fn: Callable, *args, repeats: int = 3):
    """Run ``fn(*args)`` once to compile, then return (result, median seconds of repeats)."""
    result = jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return result, float(np.median(times))


def max_rel_error(actual, expected) -> float:
    """Largest |a - e| / max(|e|, 1) over all leaves (relative for |e| >= 1, absolute below).

    NaNs and infinities in the same places count as equal; a NaN on one side only
    gives NaN, so the table shows it.
    """
    worst = 0.0
    for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected), strict=True):
        a = np.asarray(a, dtype=np.float64)
        e = np.asarray(e, dtype=np.float64)
        both_nan = np.isnan(a) & np.isnan(e)
        same_inf = np.isinf(a) & (a == e)
        ok = both_nan | same_inf
        if np.any(np.isnan(a) & ~ok) or np.any(np.isnan(e) & ~ok):
            return float("nan")
        diff = np.where(ok, 0.0, np.abs(a - e))
        scale = np.maximum(np.abs(np.where(ok, 0.0, e)), 1.0)
        if diff.size:
            worst = max(worst, float(np.max(diff / scale)))
    return worst
