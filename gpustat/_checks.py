"""Argument checks shared by the public modules."""

from __future__ import annotations

import math
import numbers

__all__ = ["check_int", "check_real", "is_int"]


def is_int(value) -> bool:
    """An integer (Python or numpy), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_int(value, name: str, minimum: int) -> int:
    """``value`` as an ``int``; ``ValueError`` naming ``name`` unless it is an integer
    (not a bool) >= ``minimum``."""
    if not is_int(value) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {name}={value!r}")
    return int(value)


def check_real(value, name: str, low: float, high: float = math.inf, *,
               low_open: bool = False) -> float:
    """``value`` as a ``float``; ``ValueError`` naming ``name`` unless it is a finite real
    number >= ``low`` (> ``low`` with ``low_open``) and < ``high``."""
    ok = isinstance(value, numbers.Real) and math.isfinite(value) and value < high and (
        value > low if low_open else value >= low)
    if not ok:
        if high == math.inf:
            bound = f"{'>' if low_open else '>='} {low}"
        else:
            bound = f"in {'(' if low_open else '['}{low}, {high})"
        raise ValueError(f"{name} must be a finite number {bound}, got {name}={value!r}")
    return float(value)
