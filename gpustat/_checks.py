"""Argument checks shared by the public modules."""

from __future__ import annotations

import math
import numbers

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["as_array", "check_float64_enabled", "check_int", "check_real", "is_int"]


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


def check_float64_enabled(name: str, x) -> None:
    """``TypeError`` naming ``name`` if ``x`` is float64 while ``jax_enable_x64`` is off
    (``jnp.asarray`` would silently round it to float32)."""
    if getattr(x, "dtype", None) == np.float64 and not jax.config.jax_enable_x64:
        raise TypeError(f"{name} is float64 but jax_enable_x64 is off: call "
                        f"jax.config.update('jax_enable_x64', True) first, or pass float32")


def as_array(value, name: str, *, op: str = "") -> jax.Array:
    """``value`` as a JAX array; ``TypeError`` naming ``name`` for object, string, bytes or
    structured data, which ``jnp.asarray`` would reject with an error about tracing (or
    accept element by element). ``op`` prefixes the message with the public function."""
    where = f"{op}: " if op else ""
    dtype = getattr(value, "dtype", None)
    if dtype is None:
        try:
            dtype = np.asarray(value).dtype
        except (TypeError, ValueError) as err:
            raise TypeError(f"{where}{name} must be an array of numbers, got "
                            f"{type(value).__name__}") from err
    dtype = np.dtype(dtype)
    if not (jnp.issubdtype(dtype, jnp.number) or dtype == np.bool_):  # bfloat16 is a number
        raise TypeError(f"{where}{name} must be an array of numbers, got {name}.dtype={dtype}")
    if isinstance(value, jax.Array):
        return value
    # a numpy array is moved as it is: jnp.asarray stages it through a program per shape
    return jax.device_put(value) if type(value) is np.ndarray else jnp.asarray(value)
