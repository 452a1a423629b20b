r"""FM / FFM / FwFM scores in pure ``jax.numpy``: the meaning of the scoring kernels.

A row is the list of its nonzeros (feature ``c_i``, value ``x_i``) padded to
its bucket width with ``x = 0``; a padded or exactly-zero entry is masked out
(its parameters are never read), so dense input behaves like CSR input.
With ``f(i)`` the field of feature ``i`` and ``Z`` the nonzero set of a row:

* FM (Rendle 2010): :math:`s = w_0 + \sum_i w_i x_i + \tfrac12 \sum_t
  [(\sum_i V_{it} x_i)^2 - \sum_i V_{it}^2 x_i^2]`.
* FFM (Juan et al. 2016), ``V`` of shape ``(p, F, k)``: :math:`s = w_0 + \sum_i w_i x_i
  + \sum_{i<j \in Z} \langle V_{i, f(j)}, V_{j, f(i)} \rangle x_i x_j`
  (same-field pairs included, bias and linear term kept).
* FwFM (Pan et al. 2018), ``V`` of shape ``(p, k)`` and ``R`` of shape ``(F, F)``
  of which the upper triangle (diagonal included) is read: :math:`s = w_0 +
  \sum_i w_i x_i + \sum_{i<j} r_{f(i) f(j)} \langle v_i, v_j \rangle x_i x_j`,
  :math:`r_{ab} = R_{\min(a,b), \max(a,b)}`.

Each ``*_row`` function scores one padded row; ``*_scores`` vmaps it over every
bucket of a :class:`~gpustat.csr.CSR` and scatters the scores back to row order.
Empty rows score ``w0``. These functions are differentiated by ``jax.grad`` in
the tests to check the hand-written gradient rules of :mod:`gpustat.factorization._vjp`.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from gpustat._arrays import compute_dtype
from gpustat.csr import CSR

__all__ = [
    "assemble_scores",
    "bucket_tiles",
    "ffm_row",
    "ffm_scores",
    "fm_row",
    "fm_scores",
    "fwfm_row",
    "fwfm_scores",
    "score_dtype",
    "symmetric_field_weights",
]

_HIGHEST = jax.lax.Precision.HIGHEST


def score_dtype(*arrays) -> jnp.dtype:
    """Compute/output dtype: float64 if any input is float64, else float32."""
    return compute_dtype(jnp.result_type(*arrays))


def bucket_tiles(X: CSR, rows: Int[Array, " b"], width: int, dtype
                 ) -> tuple[Int[Array, "b w"], Float[Array, "b w"], Int[Array, "b w"]]:
    """Gather rows ``rows`` of ``X`` as ``(b, width)`` tiles, padded with ``x = 0``.

    Returns:
        ``(cols, x, pos)``: feature ids (0 where padded), values in ``dtype``
        (0 where padded) and positions in ``X.data`` (``nnz`` where padded).
    """
    start = X.indptr[rows]
    end = X.indptr[rows + 1]
    pos = start[:, None] + jnp.arange(width, dtype=start.dtype)[None, :]
    valid = pos < end[:, None]
    pos = jnp.where(valid, pos, X.nnz)
    safe = jnp.minimum(pos, X.nnz - 1)
    cols = jnp.where(valid, X.indices[safe], 0)
    x = jnp.where(valid, X.data[safe].astype(dtype), 0)
    return cols, x, pos


def assemble_scores(X: CSR, w0: Float[Array, ""],
                    bucket_scores: list[Float[Array, " b"]]) -> Float[Array, " n"]:
    """Put per-bucket scores back in row order; rows in no bucket (empty) score ``w0``."""
    n = X.shape[0]
    if X.buckets.in_order:
        return bucket_scores[0][:n]
    out = jnp.full((n,), w0, dtype=jnp.result_type(w0, *bucket_scores))
    for rows, scores in zip(X.bucket_rows, bucket_scores, strict=True):
        out = out.at[rows].set(scores[: rows.shape[0]])
    return out


def symmetric_field_weights(R: Float[Array, "f f"]) -> Float[Array, "f f"]:
    """``r_ab = R[min(a, b), max(a, b)]``: the upper triangle mirrored (lower ignored)."""
    a = jnp.arange(R.shape[0])
    return jnp.where(a[:, None] <= a[None, :], R, R.T)


def fm_row(cols: Int[Array, " w"], x: Float[Array, " w"], w0, w: Float[Array, " p"],
           V: Float[Array, "p k"]) -> Float[Array, ""]:
    """FM score of one padded row (entries with ``x == 0`` are skipped)."""
    mask = x != 0
    linear = jnp.sum(jnp.where(mask, w[cols], 0) * x)
    vx = jnp.where(mask[:, None], V[cols], 0) * x[:, None]  # (w, k): v_i x_i
    q = jnp.sum(vx, axis=0)
    return w0 + linear + 0.5 * (jnp.sum(q * q) - jnp.sum(vx * vx))


def _pair_sum(A: Float[Array, "w w"], x: Float[Array, " w"]) -> Float[Array, ""]:
    """``sum_{i<j} A_ij x_i x_j`` over the entries with ``x != 0``."""
    width = x.shape[0]
    i = jnp.arange(width)
    mask = (i[:, None] < i[None, :]) & (x[:, None] != 0) & (x[None, :] != 0)
    return jnp.sum(jnp.where(mask, A, 0) * x[:, None] * x[None, :])


def ffm_row(cols: Int[Array, " w"], x: Float[Array, " w"], field_ids: Int[Array, " p"], w0,
            w: Float[Array, " p"], V: Float[Array, "p f k"]) -> Float[Array, ""]:
    """FFM score of one padded row: all pairs ``i < j``, same-field pairs included."""
    mask = x != 0
    fields = field_ids[cols]
    cross = V[cols[:, None], fields[None, :]]  # (w, w, k): V[c_i, f(c_j)]
    A = jnp.sum(cross * jnp.swapaxes(cross, 0, 1), axis=-1)  # <V[c_i, f_j], V[c_j, f_i]>
    return w0 + jnp.sum(jnp.where(mask, w[cols], 0) * x) + _pair_sum(A, x)


def fwfm_row(cols: Int[Array, " w"], x: Float[Array, " w"], field_ids: Int[Array, " p"], w0,
             w: Float[Array, " p"], V: Float[Array, "p k"], R: Float[Array, "f f"]
             ) -> Float[Array, ""]:
    """FwFM score of one padded row; ``R``'s lower triangle is never read."""
    mask = x != 0
    fields = field_ids[cols]
    v = jnp.where(mask[:, None], V[cols], 0)
    gram = jnp.matmul(v, v.T, precision=_HIGHEST)  # <v_i, v_j>
    r = symmetric_field_weights(R)[fields[:, None], fields[None, :]]
    return w0 + jnp.sum(jnp.where(mask, w[cols], 0) * x) + _pair_sum(r * gram, x)


def _scores(X: CSR, w0, row_fn: Callable, params: tuple, dtype) -> Float[Array, " n"]:
    """vmap ``row_fn(cols, x, *params)`` over every bucket and assemble row order."""
    w0 = jnp.asarray(w0, dtype)
    params = tuple(jnp.asarray(p, dtype) if jnp.issubdtype(jnp.result_type(p), jnp.floating)
                   else jnp.asarray(p) for p in params)
    per_bucket = []
    for rows, width in zip(X.bucket_rows, X.buckets.widths, strict=True):
        cols, x, _ = bucket_tiles(X, rows, width, dtype)
        per_bucket.append(jax.vmap(lambda c, v: row_fn(c, v, *params))(cols, x) + w0)
    return assemble_scores(X, w0, per_bucket)


def fm_scores(X: CSR, w0: Float[Array, ""], w: Float[Array, " p"], V: Float[Array, "p k"]
              ) -> Float[Array, " n"]:
    """FM scores of every row of ``X`` (reference)."""
    dtype = score_dtype(X.data, w0, w, V)
    return _scores(X, w0, lambda c, x, w, V: fm_row(c, x, 0, w, V), (w, V), dtype)


def ffm_scores(X: CSR, field_ids: Int[Array, " p"], w0: Float[Array, ""],
               w: Float[Array, " p"], V: Float[Array, "p f k"]) -> Float[Array, " n"]:
    """FFM scores of every row of ``X`` (reference)."""
    dtype = score_dtype(X.data, w0, w, V)
    return _scores(X, w0, lambda c, x, fid, w, V: ffm_row(c, x, fid, 0, w, V),
                   (field_ids, w, V), dtype)


def fwfm_scores(X: CSR, field_ids: Int[Array, " p"], w0: Float[Array, ""],
                w: Float[Array, " p"], V: Float[Array, "p k"], R: Float[Array, "f f"]
                ) -> Float[Array, " n"]:
    """FwFM scores of every row of ``X`` (reference)."""
    dtype = score_dtype(X.data, w0, w, V, R)
    return _scores(X, w0, lambda c, x, fid, w, V, R: fwfm_row(c, x, fid, 0, w, V, R),
                   (field_ids, w, V, R), dtype)
