r"""Pallas-Triton kernels for FM / FFM / FwFM scores of CSR rows.

One ``pallas_call`` per row bucket of the :class:`~gpustat.csr.CSR` (rows of
length in ``(width/2, width]``); each program scores ``block_rows`` rows and
reads their nonzeros straight from ``X.indices``/``X.data`` through
``X.indptr`` (no padded copy of the matrix is ever made). Tiling:

* a row's nonzeros are visited in chunks of ``block_w`` positions (masked past
  the row's end), so any row length works with a fixed register footprint;
* FM keeps ``q = sum_i v_i x_i`` (``block_rows x k``), the linear term and the
  sum of squares in registers across chunks: O(|Z| k) per row. ``q`` and the
  squares are held scaled by ``2**-e`` per row and factor, ``e`` following the
  largest ``|v x|`` seen so far (exact rescaling when a chunk raises it), so
  ``q**2`` cannot overflow where the score fits (the reference's ``fm_pair_sum``);
* FFM / FwFM loop over the left element ``i`` of each pair (up to the longest
  row of the block) against a chunk of right elements ``j > i`` held in
  registers: the ``(rows, pairs, k)`` tensor is never materialised; element
  ``i`` and its parameter vectors are gathered from global memory (L1/L2 serve
  the repeats). Each factor is multiplied by its value before the dot
  (``<V x_i, V x_j>``), so no intermediate under- or overflows on the way to a
  representable pair term. Element ``i`` is reloaded rather than selected out of the
  register chunk: that selection is a masked cross-thread reduction, and slower.

FwFM on a CSR carrying a field-slot table (:meth:`CSR.with_field_slots`, rows
with at most one nonzero per field) takes a per-field kernel instead: with
:math:`u_s = x_s v_s` the row's term in slot ``s`` and :math:`\bar r` the
symmetric field weights with a zero diagonal (one nonzero per field: no
same-field pairs), the pair sum is :math:`\tfrac12 \sum_{s,s'} \bar r_{ss'}
\langle u_s, u_{s'}\rangle`. Each program gathers ``u`` for ``block_rows`` rows
as an ``(f, block_rows * k)`` tile (slot-major, so ``R`` is one dense operand
and no field id or weight is gathered per pair) and computes ``R u`` with one
``jnp.dot`` at ``Precision.HIGHEST`` (IEEE float32 FMAs, not TF32; float64 stays
float64). It also flags any row whose nonzero is not in its own field's slot
for the ``field_ids`` given; :func:`fwfm_scores` then rescores with the
row-bucket kernel, so a stale table can cost time but never a wrong score.

Entries with ``x == 0`` (padding and explicit zeros) are masked out of every
gather, so their parameters are never read. Accumulation is in the compute
dtype (float64 stays float64; float32 and 16-bit inputs accumulate in float32),
elementwise (no ``jnp.dot``, so no TF32). The bias ``w0`` is added by the caller.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from gpustat._arrays import next_pow2, nonempty
from gpustat.csr import CSR
from gpustat.pallas._common import pallas_call, plt
from gpustat.reference.factorization import (
    assemble_scores,
    pow2,
    scale_exponent,
    score_dtype,
    symmetric_field_weights,
)

__all__ = ["ffm_scores", "fm_scores", "fwfm_scores", "fwfm_slot_scores", "kernel_settings",
           "slot_kernel_settings"]

def kernel_settings(model: str, width: int, k: int) -> dict:
    """Default ``block_rows``, ``block_w``, ``num_warps`` for a bucket.

    The register tile is ``block_rows x block_w x next_pow2(k)``; it is held near
    4096 elements (32 per thread at 4 warps) for FM and FwFM, and 1024 for FFM,
    whose pair loop gathers two such tiles per step: the budgets that give each
    model its fastest tile in the row-bucket sweep of ``benchmarks/bench_factorization.py``.
    """
    kp = next_pow2(k)
    block_w = min(width, 32)
    budget = 1024 if model == "ffm" else 4096
    block_rows = max(1, min(64, budget // (block_w * kp)))
    return {"block_rows": block_rows, "block_w": block_w, "num_warps": 4}


def _row_extents(rows_ref, indptr_ref, n_rows):
    """(start, end) offsets of the block's rows; padded row ids (>= n_rows) are empty."""
    rows = rows_ref[...]
    real = rows < n_rows
    start = plt.load(indptr_ref.at[rows], mask=real, other=0)
    end = plt.load(indptr_ref.at[rows + 1], mask=real, other=0)
    return start, end


def _load_chunk(indices_ref, data_ref, start, end, offset, block_w, acc_dtype):
    """Positions ``offset + [0, block_w)`` of each row: (feature ids, values); x = 0 if past end."""
    pos = start[:, None] + offset + jnp.arange(block_w, dtype=start.dtype)[None, :]
    inside = pos < end[:, None]
    cols = plt.load(indices_ref.at[pos], mask=inside, other=0)
    x = plt.load(data_ref.at[pos], mask=inside, other=0).astype(acc_dtype)
    return cols, x


def _load_position(indices_ref, data_ref, start, end, i, acc_dtype):
    """Element ``i`` of each row: (feature id, value) of shape (block_rows,); x = 0 if past end."""
    pos = start + i
    inside = pos < end
    col = plt.load(indices_ref.at[pos], mask=inside, other=0)
    x = plt.load(data_ref.at[pos], mask=inside, other=0).astype(acc_dtype)
    return col, x


def _fm_kernel(rows_ref, indptr_ref, indices_ref, data_ref, w_ref, V_ref, out_ref, *,
               n_rows, width, block_w, k):
    acc_dtype = out_ref.dtype
    kp = next_pow2(k)
    t = jnp.arange(kp)
    start, end = _row_extents(rows_ref, indptr_ref, n_rows)
    block_rows = start.shape[0]

    def chunk(c, carry):
        # q and the squares are kept scaled by 2**-e per (row, factor), e following the
        # largest |v x| seen so far (the reference's fm_pair_sum, one chunk at a time):
        # a larger chunk maximum rescales the sums by an exact power of two
        linear, q, squares, e = carry
        cols, x = _load_chunk(indices_ref, data_ref, start, end, c * block_w, block_w, acc_dtype)
        nonzero = x != 0
        w = plt.load(w_ref.at[cols], mask=nonzero, other=0)
        v = plt.load(V_ref.at[cols[:, :, None] * k + t], mask=nonzero[:, :, None] & (t < k),
                     other=0)
        vx = v * x[:, :, None]
        e_new = jnp.maximum(e, scale_exponent(jnp.max(jnp.abs(vx), axis=1)))
        down = pow2(e - e_new, acc_dtype)
        u = vx * pow2(-e_new, acc_dtype)[:, None, :]
        return (linear + jnp.sum(w * x, axis=1), q * down + jnp.sum(u, axis=1),
                squares * down * down + jnp.sum(u * u, axis=1), e_new)

    zeros = jnp.zeros((block_rows,), acc_dtype)
    factors = jnp.zeros((block_rows, kp), acc_dtype)
    linear, q, squares, e = jax.lax.fori_loop(
        0, width // block_w, chunk, (zeros, factors, factors, jnp.zeros((block_rows, kp),
                                                                        jnp.int32)))
    up = pow2(e, acc_dtype)
    out_ref[...] = linear + jnp.sum(0.5 * (q * q - squares) * up * up, axis=1)


def _pair_kernel(rows_ref, indptr_ref, indices_ref, data_ref, fields_ref, w_ref, V_ref, *rest,
                 model, n_rows, width, block_w, k, n_fields):
    """FFM (``rest = (out_ref,)``) or FwFM (``rest = (R_ref, out_ref)``) scores."""
    out_ref = rest[-1]
    acc_dtype = out_ref.dtype
    kp = next_pow2(k)
    t = jnp.arange(kp)
    k_mask = t < k
    start, end = _row_extents(rows_ref, indptr_ref, n_rows)
    block_rows = start.shape[0]
    longest = jnp.max(end - start)  # pairs loop only as far as the block's longest row

    def chunk(c, acc):
        cols_j, x_j = _load_chunk(indices_ref, data_ref, start, end, c * block_w, block_w,
                                  acc_dtype)
        j = c * block_w + jnp.arange(block_w)
        nonzero_j = x_j != 0
        fields_j = plt.load(fields_ref.at[cols_j], mask=nonzero_j, other=0)
        w = plt.load(w_ref.at[cols_j], mask=nonzero_j, other=0)
        acc = acc + jnp.sum(w * x_j, axis=1)
        if model == "fwfm":
            u_j = plt.load(V_ref.at[cols_j[:, :, None] * k + t],
                           mask=nonzero_j[:, :, None] & k_mask, other=0) * x_j[:, :, None]

        def left(i, acc):
            col_i, x_i = _load_position(indices_ref, data_ref, start, end, i, acc_dtype)
            pair = (x_i != 0)[:, None] & nonzero_j & (j > i)[None, :]
            field_i = plt.load(fields_ref.at[col_i], mask=x_i != 0, other=0)
            if model == "ffm":
                # <V[c_i, f(c_j)], V[c_j, f(c_i)]> for every j of the chunk
                slot_i = (col_i[:, None] * n_fields + fields_j) * k
                slot_j = (cols_j * n_fields + field_i[:, None]) * k
                mask = pair[:, :, None] & k_mask
                a = plt.load(V_ref.at[slot_i[:, :, None] + t], mask=mask, other=0)
                b = plt.load(V_ref.at[slot_j[:, :, None] + t], mask=mask, other=0)
                # each factor times its value first: x near 1e20 with small factors
                weight = jnp.sum((a * x_i[:, None, None]) * (b * x_j[:, :, None]), axis=2)
            else:
                R_ref = rest[0]
                u_i = plt.load(V_ref.at[col_i[:, None] * k + t],
                               mask=(x_i != 0)[:, None] & k_mask, other=0) * x_i[:, None]
                lo = jnp.minimum(field_i[:, None], fields_j)
                hi = jnp.maximum(field_i[:, None], fields_j)
                r = plt.load(R_ref.at[lo * n_fields + hi], mask=pair, other=0)
                weight = r * jnp.sum(u_i[:, None, :] * u_j, axis=2)
            return acc + jnp.sum(jnp.where(pair, weight, 0), axis=1)

        # left elements i < j only: i runs up to the chunk's end or the longest row
        return jax.lax.fori_loop(0, jnp.minimum(longest, (c + 1) * block_w), left, acc)

    out_ref[...] = jax.lax.fori_loop(0, width // block_w, chunk,
                                     jnp.zeros((block_rows,), acc_dtype))


def _fwfm_slots_kernel(slots_ref, indices_ref, data_ref, fields_ref, w_ref, V_ref, R_ref,
                       out_ref, misplaced_ref, *, n_rows, n_fields, k):
    """FwFM scores of ``block_rows`` one-hot rows from the field-slot table.

    Tiles are slot-major, ``(fp, block_rows)``: slot ``s`` of every row of the
    block along axis 0, so the factor tile ``u`` flattens to the ``(fp,
    block_rows * kp)`` right operand of ``R_ref @ u`` (``R_ref`` is the
    ``(fp, fp)`` symmetric, zero-diagonal, zero-padded field-weight matrix).
    """
    acc_dtype = out_ref.dtype
    block_rows = out_ref.shape[0]
    fp = R_ref.shape[0]
    kp = next_pow2(k)
    rows = pl.program_id(0) * block_rows + jnp.arange(block_rows)
    s = jnp.arange(fp)
    in_table = (s < n_fields)[:, None] & (rows < n_rows)[None, :]
    pos = plt.load(slots_ref.at[rows[None, :] * n_fields + s[:, None]], mask=in_table, other=-1)
    stored = pos >= 0
    cols = plt.load(indices_ref.at[pos], mask=stored, other=0)
    x = plt.load(data_ref.at[pos], mask=stored, other=0).astype(acc_dtype)
    nonzero = x != 0
    fields = plt.load(fields_ref.at[cols], mask=nonzero, other=0)
    # a nonzero outside its own field's slot: the table does not fit these field_ids
    misplaced_ref[...] = jnp.max(jnp.where(nonzero & (fields != s[:, None]), 1, 0), axis=0)
    w = plt.load(w_ref.at[cols], mask=nonzero, other=0)
    t = jnp.arange(kp)
    v = plt.load(V_ref.at[cols[:, :, None] * k + t], mask=nonzero[:, :, None] & (t < k),
                 other=0)
    u = (v * x[:, :, None]).reshape(fp, block_rows * kp)  # u[s, (b, t)] = x_s V[c_s, t]
    ru = jnp.dot(R_ref[...], u, precision=jax.lax.Precision.HIGHEST)
    pairs = jnp.sum(jnp.sum((u * ru).reshape(fp, block_rows, kp), axis=2), axis=0)
    out_ref[...] = jnp.sum(w * x, axis=0) + 0.5 * pairs


def slot_kernel_settings(n_fields: int, k: int) -> dict:
    """Default ``block_rows``, ``num_warps`` of the field-slot FwFM kernel.

    The tile is ``fp x block_rows x next_pow2(k)`` (``fp`` the padded field
    count); it is held at 16384 elements (``block_rows = 64`` at 4 warps for 24
    fields and k = 8), among the fastest settings of the field-slot sweep of
    ``benchmarks/bench_factorization.py``. ``block_rows * next_pow2(k)``, the dot's N,
    stays >= 16.
    """
    kp = next_pow2(k)
    fp = _padded_fields(n_fields)
    return {"block_rows": max(-(-16 // kp), 16384 // (fp * kp)), "num_warps": 4}


def _padded_fields(n_fields: int) -> int:
    """Slots per row in the kernel: a power of two, >= 16 (Triton's smallest dot)."""
    return max(16, next_pow2(n_fields))


def fwfm_slot_scores(X: CSR, field_ids, w, V, R, acc_dtype, k: int, *, interpret: bool,
                     block_rows: int | None = None, num_warps: int | None = None):
    """(scores without ``w0`` (n,), per-row flag (n,) of a nonzero outside its field's slot).

    Needs ``X.field_slots`` of width ``R.shape[0]``; parameters in ``acc_dtype``
    (``w`` (p,), ``V`` flat (p * k,), ``R`` (f, f)); ``k`` factors.
    """
    n_rows, n_fields = X.field_slots.shape
    if X.nnz == 0:  # nothing to gather: every score is the bias
        return jnp.zeros((n_rows,), acc_dtype), jnp.zeros((n_rows,), jnp.int32)
    settings = slot_kernel_settings(n_fields, k)
    # Triton dots need every dimension >= 16
    block_rows = max(block_rows or settings["block_rows"], -(-16 // next_pow2(k)))
    fp = _padded_fields(n_fields)
    weights = symmetric_field_weights(R)
    weights = jnp.where(jnp.eye(n_fields, dtype=bool), 0, weights)
    weights = jnp.pad(weights, (0, fp - n_fields))
    n_blocks = max(1, -(-n_rows // block_rows))
    padded = n_blocks * block_rows
    call = pallas_call(
        functools.partial(_fwfm_slots_kernel, n_rows=n_rows, n_fields=n_fields, k=k),
        interpret=interpret,
        num_warps=num_warps or settings["num_warps"],
        grid=(n_blocks,),
        in_specs=[pl.no_block_spec] * 7,
        out_specs=[pl.BlockSpec((block_rows,), lambda b: (b,))] * 2,
        out_shape=[jax.ShapeDtypeStruct((padded,), acc_dtype),
                   jax.ShapeDtypeStruct((padded,), jnp.int32)],
    )
    scores, misplaced = call(X.field_slots.reshape(-1), X.indices, X.data,
                             field_ids.astype(jnp.int32), w, V, weights)
    return scores[:n_rows], misplaced[:n_rows]


def _bucket_call(model: str, X: CSR, rows, width: int, params: tuple, acc_dtype, *,
                 interpret: bool, k: int, n_fields: int, block_rows: int | None,
                 block_w: int | None, num_warps: int | None):
    """Scores of one bucket's rows (padded to a multiple of ``block_rows``)."""
    settings = kernel_settings(model, width, k)
    block_rows = block_rows or settings["block_rows"]
    block_w = min(block_w or settings["block_w"], width)
    num_warps = num_warps or settings["num_warps"]
    n_rows = X.shape[0]
    n_blocks = -(-rows.shape[0] // block_rows)
    # padded row ids point past the last row: the kernel treats them as empty
    rows = jnp.pad(rows, (0, n_blocks * block_rows - rows.shape[0]), constant_values=n_rows)
    statics = dict(n_rows=n_rows, width=width, block_w=block_w, k=k)
    if model == "fm":
        kernel = functools.partial(_fm_kernel, **statics)
    else:
        kernel = functools.partial(_pair_kernel, model=model, n_fields=n_fields, **statics)
    inputs = (rows, X.indptr, X.indices, X.data, *params)
    call = pallas_call(
        kernel,
        interpret=interpret,
        num_warps=num_warps,
        grid=(n_blocks,),
        # the row-id block is tiled; everything else is gathered from whole arrays
        in_specs=[pl.BlockSpec((block_rows,), lambda b: (b,))]
        + [pl.no_block_spec] * (len(inputs) - 1),
        out_specs=pl.BlockSpec((block_rows,), lambda b: (b,)),
        out_shape=jax.ShapeDtypeStruct(rows.shape, acc_dtype),
    )
    return call(*inputs)


def _scores(model: str, X: CSR, field_ids, w0, w, V, R, *, interpret: bool,
            class_axis: str | None = None, block_rows: int | None = None,
            block_w: int | None = None, num_warps: int | None = None):
    dtype = score_dtype(*(a for a in (X.data, w0, w, V, R) if a is not None))
    V = nonempty(V, axis=-1)  # k = 0 (a linear model): one zero factor to gather
    k = V.shape[-1]
    n_fields = 0 if model == "fm" else (V.shape[1] if model == "ffm" else R.shape[0])
    # parameters in the compute dtype, flattened so kernels gather by flat offset
    params = (w.astype(dtype), V.astype(dtype).reshape(-1))
    if model != "fm":
        params = (field_ids.astype(jnp.int32), *params)
    if model == "fwfm" and _has_slots(X, R):
        return _fwfm_slots_or_buckets(X, w0, params, R.astype(dtype), dtype, k,
                                      interpret=interpret, class_axis=class_axis,
                                      block_rows=block_rows,
                                      block_w=block_w, num_warps=num_warps)
    if model == "fwfm":
        params = (*params, R.astype(dtype).reshape(-1))
    return _bucket_scores(model, X, w0, params, dtype, interpret=interpret, k=k,
                          n_fields=n_fields, block_rows=block_rows, block_w=block_w,
                          num_warps=num_warps)


def _has_slots(X: CSR, R) -> bool:
    return X.field_slots is not None and X.field_slots.shape[1] == R.shape[0]


def _bucket_scores(model: str, X: CSR, w0, params: tuple, dtype, *, interpret: bool, k: int,
                   n_fields: int, block_rows, block_w, num_warps):
    """Scores of every row by the row-bucket kernels (one call per bucket)."""
    per_bucket = [
        _bucket_call(model, X, rows, width, params, dtype, interpret=interpret, k=k,
                     n_fields=n_fields, block_rows=block_rows, block_w=block_w,
                     num_warps=num_warps) + jnp.asarray(w0, dtype)
        for rows, width in zip(X.bucket_rows, X.buckets.widths, strict=True)
    ]
    return assemble_scores(X, jnp.asarray(w0, dtype), per_bucket)


def _fwfm_slots_or_buckets(X: CSR, w0, params: tuple, R, dtype, k: int, *, interpret: bool,
                           class_axis: str | None, block_rows, block_w, num_warps):
    """Field-slot kernel; the row-bucket kernel instead if a row's table does not fit."""
    field_ids, w, V = params
    scores, misplaced = fwfm_slot_scores(X, field_ids, w, V, R, dtype, k, interpret=interpret,
                                         block_rows=block_rows, num_warps=num_warps)
    slotted = scores + jnp.asarray(w0, dtype)

    def by_buckets():
        return _bucket_scores("fwfm", X, w0, (*params, R.reshape(-1)), dtype,
                              interpret=interpret, k=k, n_fields=R.shape[0],
                              block_rows=block_rows, block_w=block_w, num_warps=num_warps)

    fallback = jnp.any(misplaced != 0)
    if class_axis is not None:  # one decision for every class: an unbatched predicate
        fallback = jax.lax.pmax(fallback.astype(jnp.int32), class_axis) > 0
    return jax.lax.cond(fallback, by_buckets, lambda: slotted)


def fm_scores(X: CSR, w0, w, V, *, interpret: bool = False, **settings):
    """FM scores (n,) by the Pallas kernel; same meaning as the reference ``fm_scores``."""
    return _scores("fm", X, None, w0, w, V, None, interpret=interpret, **settings)


def ffm_scores(X: CSR, field_ids, w0, w, V, *, interpret: bool = False, **settings):
    """FFM scores (n,) by the Pallas kernel; ``V`` is ``(p, F, k)``."""
    return _scores("ffm", X, field_ids, w0, w, V, None, interpret=interpret, **settings)


def fwfm_scores(X: CSR, field_ids, w0, w, V, R, *, interpret: bool = False,
                class_axis: str | None = None, **settings):
    """FwFM scores (n,) by the Pallas kernel; ``R`` is ``(F, F)``, upper triangle read.

    ``class_axis``: the name of an enclosing ``jax.vmap`` over parameter sets
    (classes), if any. With a field-slot table the fallback decision is then
    taken once for all of them, so the vmapped ``lax.cond`` stays a branch
    instead of becoming a select that runs both kernels.
    """
    return _scores("fwfm", X, field_ids, w0, w, V, R, interpret=interpret,
                   class_axis=class_axis, **settings)
