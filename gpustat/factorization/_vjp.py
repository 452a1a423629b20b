r"""Hand-written gradient rules of the FM / FFM / FwFM scores (the custom VJP training calls).

:func:`scores_with_vjp` wraps any forward (a Pallas kernel or the reference)
in a ``jax.custom_vjp`` whose backward is the closed form of the spec, evaluated
per row (vmapped over each bucket) and scatter-added into parameter-shaped
gradients. For a row with nonzeros ``x_i`` (feature ``c_i``, field ``f_i``)
and cotangent ``g`` of its score:

* all models: :math:`\partial s/\partial w_0 = 1`, :math:`\partial s/\partial w_{c_i} = x_i`;
* FM: :math:`\partial s/\partial V_{c_i} = x_i q - V_{c_i} x_i^2`, :math:`q = \sum_j V_{c_j} x_j`;
  :math:`\partial s/\partial x_i = w_{c_i} + \langle V_{c_i}, q\rangle - |V_{c_i}|^2 x_i`;
* FFM: each pair adds :math:`x_i x_j V_{c_j, f_i}` to :math:`V_{c_i, f_j}` (and the mirror);
  :math:`\partial s/\partial x_i = w_{c_i} + \sum_{j\ne i}
  \langle V_{c_i,f_j}, V_{c_j,f_i}\rangle x_j`;
* FwFM: :math:`\partial s/\partial v_{c_i} = x_i \sum_{j \ne i} r_{f_i f_j} v_{c_j} x_j`,
  :math:`\partial s/\partial R_{ab}` (``a <= b``) sums :math:`\langle v_i, v_j\rangle x_i x_j`
  over the pairs with fields ``{a, b}``; the lower triangle of ``R`` gets zero.

Gradients with respect to ``X`` flow to its stored values ``X.data`` only
(entries equal to zero get zero, like every other masked entry).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from gpustat.csr import CSR
from gpustat.reference.factorization import bucket_tiles, symmetric_field_weights

__all__ = ["scores_with_vjp"]

_HIGHEST = jax.lax.Precision.HIGHEST


def _fm_row_grads(cols, x, field_ids, w, V, R):
    """(ds/dx, ds/dw at cols, ds/dV at cols) of one padded row."""
    mask = x != 0
    v = jnp.where(mask[:, None], V[cols], 0)
    q = jnp.sum(v * x[:, None], axis=0)
    d_x = jnp.where(mask, w[cols], 0) + jnp.sum(v * q, axis=1) - jnp.sum(v * v, axis=1) * x
    d_v = x[:, None] * q[None, :] - v * (x * x)[:, None]
    return d_x, d_v, None


def _off_diagonal_pairs(x):
    """(w, w) mask of pairs ``i != j`` of entries with ``x != 0``."""
    i = jnp.arange(x.shape[0])
    return (i[:, None] != i[None, :]) & (x[:, None] != 0) & (x[None, :] != 0)


def _ffm_row_grads(cols, x, field_ids, w, V, R):
    """(ds/dx, ds/dw at cols, ds/dV at [cols_i, field_j] (w, w, k)) of one padded row."""
    fields = field_ids[cols]
    pairs = _off_diagonal_pairs(x)
    cross = jnp.where(pairs[:, :, None], V[cols[:, None], fields[None, :]], 0)  # V[c_i, f_j]
    A = jnp.sum(cross * jnp.swapaxes(cross, 0, 1), axis=-1)
    d_x = jnp.where(x != 0, w[cols], 0) + jnp.sum(A * x[None, :], axis=1)
    d_v = (x[:, None] * x[None, :])[:, :, None] * jnp.swapaxes(cross, 0, 1)  # x_i x_j V[c_j, f_i]
    return d_x, d_v, None


def _fwfm_row_grads(cols, x, field_ids, w, V, R):
    """(ds/dx, ds/dw at cols, ds/dV at cols, ds/dR per pair (w, w)) of one padded row."""
    fields = field_ids[cols]
    pairs = _off_diagonal_pairs(x)
    v = jnp.where((x != 0)[:, None], V[cols], 0)
    gram = jnp.matmul(v, v.T, precision=_HIGHEST)
    r = jnp.where(pairs, symmetric_field_weights(R)[fields[:, None], fields[None, :]], 0)
    d_x = jnp.where(x != 0, w[cols], 0) + jnp.sum(r * gram * x[None, :], axis=1)
    d_v = x[:, None] * jnp.matmul(r * x[None, :], v, precision=_HIGHEST)
    i = jnp.arange(x.shape[0])
    upper = pairs & (i[:, None] < i[None, :])
    d_r = jnp.where(upper, gram * x[:, None] * x[None, :], 0)
    return d_x, d_v, d_r


_ROW_GRADS = {"fm": _fm_row_grads, "ffm": _ffm_row_grads, "fwfm": _fwfm_row_grads}


def _backward(model: str, X: CSR, field_ids, params, g):
    """Cotangents of (X.data, w0, w, V, R) for score cotangents ``g`` (n,)."""
    # residuals are the primals as given: numpy arrays cannot be indexed by traced ids
    field_ids = None if field_ids is None else jnp.asarray(field_ids)
    w0, w, V, R = (None if a is None else jnp.asarray(a) for a in params)
    dtype = g.dtype
    d_data = jnp.zeros((X.nnz + 1,), dtype)  # slot nnz absorbs the padding
    d_w = jnp.zeros(w.shape, dtype)
    d_V = jnp.zeros(V.shape, dtype)
    d_R = None if R is None else jnp.zeros(R.shape, dtype)
    row_grads = functools.partial(_ROW_GRADS[model], field_ids=field_ids,
                                  w=w.astype(dtype), V=V.astype(dtype),
                                  R=None if R is None else R.astype(dtype))
    for rows, width in zip(X.bucket_rows, X.buckets.widths, strict=True):
        cols, x, pos = bucket_tiles(X, rows, width, dtype)
        gr = g[rows]
        d_x, d_v, d_pair = jax.vmap(lambda c, v: row_grads(c, v))(cols, x)
        d_data = d_data.at[pos].add(gr[:, None] * d_x)
        d_w = d_w.at[cols].add(gr[:, None] * x)
        if model == "ffm":
            fields = field_ids[cols]
            d_V = d_V.at[cols[:, :, None], fields[:, None, :]].add(gr[:, None, None, None] * d_v)
        else:
            d_V = d_V.at[cols].add(gr[:, None, None] * d_v)
        if d_pair is not None:
            fields = field_ids[cols]
            fa, fb = fields[:, :, None], fields[:, None, :]
            d_R = d_R.at[jnp.minimum(fa, fb), jnp.maximum(fa, fb)].add(gr[:, None, None] * d_pair)
    d_X = CSR.tree_unflatten(X.tree_flatten()[1], (d_data[: X.nnz].astype(X.data.dtype), None,
                                                   None, (None,) * len(X.bucket_rows), None))
    return (d_X, None, _cast_like(jnp.sum(g), w0), _cast_like(d_w, w), _cast_like(d_V, V),
            _cast_like(d_R, R))


def _cast_like(grad, param):
    return None if param is None else grad.astype(param.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _scores(model: str, forward: Callable, X: CSR, field_ids, w0, w, V, R):
    return forward(X, field_ids, w0, w, V, R)


def _scores_fwd(model, forward, X, field_ids, w0, w, V, R):
    return forward(X, field_ids, w0, w, V, R), (X, field_ids, (w0, w, V, R))


def _scores_bwd(model, forward, residuals, g):
    X, field_ids, params = residuals
    return _backward(model, X, field_ids, params, g)


_scores.defvjp(_scores_fwd, _scores_bwd)


def scores_with_vjp(model: str, forward: Callable, X: CSR, field_ids: Int[Array, " p"] | None,
                    w0: Float[Array, ""], w: Float[Array, " p"],
                    V: Float[Array, "p k"] | Float[Array, "p f k"],
                    R: Float[Array, "f f"] | None = None) -> Float[Array, " n"]:
    """Scores ``forward(X, field_ids, w0, w, V, R)`` with the closed-form backward above.

    This is the differentiable entry point training builds on: ``jax.grad`` /
    ``jax.vjp`` of the result with respect to ``w0, w, V, R`` (and ``X.data``)
    run the per-row closed forms, never autodiff through a kernel.

    Args:
        model: ``"fm"``, ``"ffm"`` or ``"fwfm"``.
        forward: hashable callable computing the ``(n,)`` scores (kernel or reference).
        X: the rows, a :class:`~gpustat.csr.CSR`.
        field_ids: ``(p,)`` int field of each feature (``None`` for FM).
        w0: bias ``()``.
        w: linear weights ``(p,)``.
        V: factors ``(p, k)`` (FFM: ``(p, f, k)``).
        R: FwFM field weights ``(f, f)``; ``None`` for FM and FFM.
    """
    return _scores(model, forward, X, field_ids, w0, w, V, R)
