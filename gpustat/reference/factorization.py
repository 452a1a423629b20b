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

**Range.** FM's pair term is computed per factor ``t`` as
:math:`\tfrac12 [(\sum_i u_{it})^2 - \sum_i u_{it}^2]` on :math:`u_{it} = V_{it} x_i`
scaled by a power of two :math:`2^{-e_t}` near the row's largest :math:`|u_{it}|`
(:func:`fm_pair_sum`) and scaled back by :math:`4^{e_t}`: the squares, which hold the
diagonal terms :math:`u_{it}^2` that the identity subtracts again, cannot overflow
where each factor's pair term fits (``x`` near 1e20 in float32), and power-of-two
scaling changes no rounding (short of subnormals). FFM and FwFM multiply each factor
by its value before the dot, :math:`\langle V x_i, V x_j\rangle`, so large values
times small factors neither overflow nor underflow on the way to a representable
pair term.

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
    "fm_pair_sum",
    "fm_row",
    "fm_scores",
    "fwfm_row",
    "fwfm_scores",
    "pow2",
    "scale_exponent",
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


def pow2(n: Array, dtype) -> Array:
    """``2**n`` exactly in ``dtype`` (float32 or float64), built from its exponent bits.

    ``n`` must lie in the dtype's normal range (``[-126, 127]`` for float32); a bit
    pattern, unlike ``exp2``, is exact on every backend and lowers in Pallas kernels.
    """
    if jnp.dtype(dtype) == jnp.float64:
        return jax.lax.bitcast_convert_type((n.astype(jnp.int64) + 1023) << 52, jnp.float64)
    return jax.lax.bitcast_convert_type((n.astype(jnp.int32) + 127) << 23, jnp.float32)


def scale_exponent(m: Array) -> Array:
    """``e`` with ``m * 2**-e < 2``: the binary exponent of ``m >= 0`` clipped to
    ``[0, emax - 1]`` (float32 ``[0, 126]``), so ``2**-e`` and ``2**e`` are normal
    numbers and values below 2 are never scaled up. ``inf`` stays ``inf``."""
    if m.dtype == jnp.float64:
        bits = jax.lax.bitcast_convert_type(m, jnp.int64)
        e = jax.lax.shift_right_logical(bits, jnp.int64(52)) - 1023
        return jnp.clip(e, 0, 1022).astype(jnp.int32)
    bits = jax.lax.bitcast_convert_type(m.astype(jnp.float32), jnp.int32)
    e = jax.lax.shift_right_logical(bits, jnp.int32(23)) - 127
    return jnp.clip(e, 0, 126)


def fm_pair_sum(vx: Float[Array, "*batch k"], axis: int) -> Array:
    """``sum_{i<j} <u_i, u_j>`` over ``axis`` (the row's entries) of ``u = v x``, last axis k.

    Computed as ``1/2 sum_t [(sum_i u_it)^2 - sum_i u_it^2]`` with ``u_it`` scaled
    by ``2**-e_t``, ``e_t`` the :func:`scale_exponent` of ``max_i |u_it|``, and the
    result by ``4**e_t``: exact scaling, and no overflow where each factor's pair term
    fits. The identity's rounding error stays eps times ``sum_i u_it**2``.
    Returns ``vx``'s shape without ``axis`` and ``k``.
    """
    e = scale_exponent(jnp.max(jnp.abs(vx), axis=axis, keepdims=True))
    u = vx * pow2(-e, vx.dtype)
    q = jnp.sum(u, axis=axis, keepdims=True)
    half = 0.5 * (q * q - jnp.sum(u * u, axis=axis, keepdims=True))
    up = pow2(e, vx.dtype)
    return jnp.sum(jnp.squeeze(half * up * up, axis), axis=-1)


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
    return w0 + linear + fm_pair_sum(vx, axis=0)


def _pair_sum(A: Float[Array, "w w"], x: Float[Array, " w"]) -> Float[Array, ""]:
    """``sum_{i<j} A_ij`` over the entries with ``x != 0`` (``A`` holds the values already)."""
    width = x.shape[0]
    i = jnp.arange(width)
    mask = (i[:, None] < i[None, :]) & (x[:, None] != 0) & (x[None, :] != 0)
    return jnp.sum(jnp.where(mask, A, 0))


def ffm_row(cols: Int[Array, " w"], x: Float[Array, " w"], field_ids: Int[Array, " p"], w0,
            w: Float[Array, " p"], V: Float[Array, "p f k"]) -> Float[Array, ""]:
    """FFM score of one padded row: all pairs ``i < j``, same-field pairs included."""
    mask = x != 0
    fields = field_ids[cols]
    cross = V[cols[:, None], fields[None, :]] * x[:, None, None]  # (w, w, k): V[c_i, f_j] x_i
    A = jnp.sum(cross * jnp.swapaxes(cross, 0, 1), axis=-1)  # <V[c_i, f_j] x_i, V[c_j, f_i] x_j>
    return w0 + jnp.sum(jnp.where(mask, w[cols], 0) * x) + _pair_sum(A, x)


def fwfm_row(cols: Int[Array, " w"], x: Float[Array, " w"], field_ids: Int[Array, " p"], w0,
             w: Float[Array, " p"], V: Float[Array, "p k"], R: Float[Array, "f f"]
             ) -> Float[Array, ""]:
    """FwFM score of one padded row; ``R``'s lower triangle is never read."""
    mask = x != 0
    fields = field_ids[cols]
    u = jnp.where(mask[:, None], V[cols], 0) * x[:, None]
    gram = jnp.matmul(u, u.T, precision=_HIGHEST)  # <v_i x_i, v_j x_j>
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
