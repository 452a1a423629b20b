"""Optax transformations with lazy, touched-coordinate semantics (SGD, AdaGrad, Adam, FTRL).

Sparse models (FM, FFM, FwFM) touch a few coordinates per mini-batch. The
training contract of ``docs/estimators.md`` steps only those coordinates: an
untouched coordinate gets no update and no state change. optax has no such
masking and no FTRL, so these are written here as
:class:`optax.GradientTransformationExtraArgs` whose ``update`` takes the extra
keyword argument ``touched``: a pytree with the structure of the parameters
whose boolean leaves broadcast against the parameter leaves. ``touched=None``
means every coordinate is touched (dense semantics), which is also what any
plain optax transformation does.

Per coordinate, state starting at 0 (g is the gradient passed in):

* SGD: ``theta -= lr g``.
* AdaGrad: ``G += g^2; theta -= lr g / sqrt(G + eps)`` (eps = 1e-10).
* Adam: per-coordinate step count ``t`` that advances only when touched;
  ``m = b1 m + (1-b1) g``, ``v = b2 v + (1-b2) g^2``,
  ``theta -= lr m_hat / (sqrt(v_hat) + eps)`` with bias-corrected moments.
* FTRL-Proximal (McMahan et al., "Ad Click Prediction: a View from the
  Trenches", KDD 2013): ``sigma = (sqrt(n + g^2) - sqrt(n)) / alpha``,
  ``z += g - sigma theta``, ``n += g^2``, then ``theta = 0`` when
  ``|z| <= l1`` (exact zeros) else
  ``-(z - sign(z) l1) / ((beta + sqrt(n)) / alpha + l2)``. It reads the
  current parameters, so ``update`` needs ``params``.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from gpustat._checks import check_real

__all__ = ["RowwiseTransformation", "ftrl", "lazy_adagrad", "lazy_adam", "lazy_sgd"]


class RowwiseTransformation(optax.GradientTransformationExtraArgs):
    """A lazy transformation that acts on each coordinate alone.

    Its ``update`` takes ``touched`` and leaves untouched coordinates (and their
    state) unchanged, and its state is a ``NamedTuple`` whose fields are each
    a pytree shaped like the parameters (or empty). The estimators' training
    therefore steps a batch on the gathered rows of the features it touches
    (parameters and state alike) and scatters them back: nothing of size p is
    read or written per batch. Every transformation of this module is one.
    """

    __slots__ = ()


def _touched_tree(touched, params_like):
    """``touched`` as a full pytree (``None`` -> all True)."""
    if touched is None:
        return jax.tree.map(lambda _: True, params_like)
    return touched


def _check_number(name: str, value, low: float, high: float = math.inf, *,
                  low_open: bool = False) -> None:
    """:func:`~gpustat._checks.check_real` of a plain number; arrays pass unchecked
    (hyperparameters injected under a trace); anything else (a string, None, an optax
    schedule) is a ``TypeError`` naming ``name``, not a failure inside ``update``."""
    if isinstance(value, numbers.Real):
        check_real(value, name, low, high, low_open=low_open)
    elif not isinstance(value, jax.Array | np.ndarray):
        raise TypeError(f"{name} must be a real number or an array (schedules are not "
                        f"supported), got {name}={value!r}")


def _where(mask, new, old):
    return jnp.where(mask, new, old).astype(old.dtype)


def _step_ratio(numerator, denominator):
    """``numerator / denominator``, 0 where the denominator is 0.

    AdaGrad's ``G`` and Adam's ``v`` are 0 only while every gradient so far was 0
    (so the numerator is 0 too): with ``eps = 0`` the step is 0, not 0/0 = NaN.
    """
    return numerator / jnp.where(denominator > 0, denominator, 1)


class LazySgdState(NamedTuple):
    """SGD keeps no state."""


def lazy_sgd(learning_rate: float) -> RowwiseTransformation:
    """Plain SGD that leaves untouched coordinates alone.

    Args:
        learning_rate: step size ``lr``.

    Returns:
        An optax transformation; ``update(grads, state, params=None, touched=None)``.

    Raises:
        ValueError: ``learning_rate`` not a finite number > 0.
        TypeError: ``learning_rate`` neither a real number nor an array.
    """
    _check_number("learning_rate", learning_rate, 0, low_open=True)

    def init(params):
        del params
        return LazySgdState()

    def update(grads, state, params=None, *, touched=None, **extra):
        del params, extra
        touched = _touched_tree(touched, grads)
        updates = jax.tree.map(lambda g, t: _where(t, -learning_rate * g, jnp.zeros_like(g)),
                               grads, touched)
        return updates, state

    return RowwiseTransformation(init, update)


class LazyAdagradState(NamedTuple):
    """Per-coordinate sum of squared gradients ``G``."""

    sum_sq: Any


def lazy_adagrad(learning_rate: float, eps: float = 1e-10) -> RowwiseTransformation:
    """AdaGrad with the root outside eps: ``theta -= lr g / sqrt(G + eps)``, lazily.

    Args:
        learning_rate: step size ``lr``.
        eps: added inside the square root (modern_fm's 1e-10).

    Returns:
        An optax transformation; ``update(grads, state, params=None, touched=None)``.

    Raises:
        ValueError: ``learning_rate`` not a finite number > 0, or ``eps`` < 0.
        TypeError: a hyperparameter neither a real number nor an array.
    """
    _check_number("learning_rate", learning_rate, 0, low_open=True)
    _check_number("eps", eps, 0)

    def init(params):
        return LazyAdagradState(jax.tree.map(jnp.zeros_like, params))

    def update(grads, state, params=None, *, touched=None, **extra):
        del params, extra
        touched = _touched_tree(touched, grads)

        def one(g, s, t):
            s_new = s + g * g
            step = -learning_rate * _step_ratio(g, jnp.sqrt(s_new + eps))
            return _where(t, step, jnp.zeros_like(g)), \
                _where(t, s_new, s)

        out = jax.tree.map(one, grads, state.sum_sq, touched)
        updates = jax.tree.map(lambda _, o: o[0], grads, out)
        sum_sq = jax.tree.map(lambda _, o: o[1], grads, out)
        return updates, LazyAdagradState(sum_sq)

    return RowwiseTransformation(init, update)


class LazyAdamState(NamedTuple):
    """Per-coordinate first moment, second moment and step count."""

    mu: Any
    nu: Any
    count: Any


def lazy_adam(learning_rate: float, b1: float = 0.9, b2: float = 0.999,
              eps: float = 1e-8) -> RowwiseTransformation:
    """Adam with a per-coordinate step count that advances only when touched.

    ``theta -= lr m_hat / (sqrt(v_hat) + eps)``, ``m_hat = m / (1 - b1^t)``,
    ``v_hat = v / (1 - b2^t)``; eps outside the root.

    Args:
        learning_rate: step size ``lr``.
        b1: first-moment decay (``beta_1``).
        b2: second-moment decay (``beta_2``).
        eps: added to ``sqrt(v_hat)`` (``epsilon``).

    Returns:
        An optax transformation; ``update(grads, state, params=None, touched=None)``.

    Raises:
        ValueError: ``learning_rate`` not a finite number > 0, ``b1`` or ``b2`` outside
            ``[0, 1)``, or ``eps`` < 0.
        TypeError: a hyperparameter neither a real number nor an array.
    """
    _check_number("learning_rate", learning_rate, 0, low_open=True)
    for name, value in (("b1", b1), ("b2", b2)):
        _check_number(name, value, 0, 1)
    _check_number("eps", eps, 0)

    def init(params):
        # int32 step counts: a 16-bit count stops at 256 (bfloat16) or 2048 (float16)
        count = jax.tree.map(lambda p: jnp.zeros(jnp.shape(p), jnp.int32), params)
        return LazyAdamState(*(jax.tree.map(jnp.zeros_like, params) for _ in range(2)), count)

    def update(grads, state, params=None, *, touched=None, **extra):
        del params, extra
        touched = _touched_tree(touched, grads)

        def one(g, m, v, c, t):
            # 16-bit moments step in float32: in bfloat16 b2 = 0.999 rounds to 1, and
            # 1 - b2^t = 0 made every step 0
            dtype = jnp.promote_types(m.dtype, jnp.float32)
            gc = g.astype(dtype)
            c_new = c + 1
            m_new = b1 * m.astype(dtype) + (1 - b1) * gc
            v_new = b2 * v.astype(dtype) + (1 - b2) * gc * gc
            # untouched coordinates may have count 0; the max keeps their unused
            # branch finite
            steps = jnp.maximum(c_new, 1).astype(dtype)
            m_hat = m_new / (1 - b1**steps)
            v_hat = v_new / (1 - b2**steps)
            step = -learning_rate * _step_ratio(m_hat, jnp.sqrt(v_hat) + eps)
            return (_where(t, step, jnp.zeros_like(g)), _where(t, m_new, m),
                    _where(t, v_new, v), _where(t, c_new, c))

        out = jax.tree.map(one, grads, state.mu, state.nu, state.count, touched)
        pick = [jax.tree.map(lambda _, o, i=i: o[i], grads, out) for i in range(4)]
        return pick[0], LazyAdamState(pick[1], pick[2], pick[3])

    return RowwiseTransformation(init, update)


class FtrlState(NamedTuple):
    """FTRL-Proximal's per-coordinate ``z`` and ``n``."""

    z: Any
    n: Any


def _per_leaf(value, params):
    """A scalar for every leaf, or a pytree (prefix) of scalars matching ``params``."""
    if isinstance(value, int | float):
        return jax.tree.map(lambda _: value, params)
    return jax.tree.map(lambda v, p: jax.tree.map(lambda _: v, p), value, params)


def ftrl(learning_rate: float, beta: float = 1.0, l1: Any = 0.0,
         l2: Any = 0.0) -> RowwiseTransformation:
    """FTRL-Proximal (McMahan et al. 2013) with exact L1 zeros, lazy per coordinate.

    Feed it the pure data gradient: L1 and L2 are part of its closed-form step.
    The update it returns is ``theta_new - theta``, so ``optax.apply_updates``
    lands exactly on ``theta_new`` (in particular on exact zeros).

    Args:
        learning_rate: ``alpha``.
        beta: ``beta`` (``ftrl_beta``).
        l1: L1 strength; a float for every leaf, or a pytree prefix of the
            parameters (e.g. ``{"w0": 0.0, "w": 1e-3, "V": 1e-4}``).
        l2: L2 strength, same form as ``l1``.

    Returns:
        An optax transformation; ``update(grads, state, params, touched=None)``
        needs ``params``.

    Raises:
        ValueError: ``learning_rate`` not a finite number > 0, or ``beta``, ``l1`` or
            ``l2`` negative.
        TypeError: a hyperparameter (or a leaf of ``l1``, ``l2``) neither a real number
            nor an array.
    """
    _check_number("learning_rate", learning_rate, 0, low_open=True)
    _check_number("beta", beta, 0)
    for name, value in (("l1", l1), ("l2", l2)):
        for leaf in jax.tree.leaves(value):
            _check_number(name, leaf, 0)
    alpha = learning_rate

    def init(params):
        return FtrlState(*(jax.tree.map(jnp.zeros_like, params) for _ in range(2)))

    def update(grads, state, params=None, *, touched=None, **extra):
        del extra
        if params is None:
            raise ValueError("ftrl: update needs params (FTRL-Proximal reads the parameters)")
        touched = _touched_tree(touched, grads)
        l1_tree = _per_leaf(l1, params)
        l2_tree = _per_leaf(l2, params)

        def one(g, z, n, theta, t, lam1, lam2):
            n_new = n + g * g
            sigma = (jnp.sqrt(n_new) - jnp.sqrt(n)) / alpha
            z_new = z + g - sigma * theta
            shrunk = -(z_new - jnp.sign(z_new) * lam1) / ((beta + jnp.sqrt(n_new)) / alpha + lam2)
            theta_new = jnp.where(jnp.abs(z_new) <= lam1, jnp.zeros_like(theta), shrunk)
            return (_where(t, theta_new - theta, jnp.zeros_like(g)), _where(t, z_new, z),
                    _where(t, n_new, n))

        out = jax.tree.map(one, grads, state.z, state.n, params, touched, l1_tree, l2_tree)
        pick = [jax.tree.map(lambda _, o, i=i: o[i], grads, out) for i in range(3)]
        return pick[0], FtrlState(pick[1], pick[2])

    return RowwiseTransformation(init, update)
