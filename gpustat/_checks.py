"""Argument checks shared by the public modules."""

from __future__ import annotations

import numbers

__all__ = ["check_int", "is_int"]


def is_int(value) -> bool:
    """An integer (Python or numpy), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_int(value, name: str, minimum: int) -> int:
    """``value`` as an ``int``; ``ValueError`` naming ``name`` unless it is an integer
    (not a bool) >= ``minimum``."""
    if not is_int(value) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {name}={value!r}")
    return int(value)
