"""Triton-language kernels for FFM and FwFM scores of CSR rows (the jax-triton twins).

Same input layout and meaning as :mod:`gpustat.pallas.factorization`: one launch
per row bucket of the :class:`~gpustat.csr.CSR` (rows of length in
``(width/2, width]``), each program scoring ``block_rows`` rows straight from
``X.indices``/``X.data`` through ``X.indptr``; the bias is added by the caller.

Tiling differs from the Pallas kernel, which loops over the left element of
each pair against a chunk of right elements (half the lanes masked by
``j > i``). Here the ``width (width - 1) / 2`` pairs ``i < j`` of a bucket are
enumerated once on the host, ordered by ``j`` (so a row of length ``L`` uses
exactly the first ``L (L - 1) / 2``), and each step scores a
``block_rows x block_p`` tile of pairs with every lane busy:

* FFM: ``<V[c_i, f(c_j)] x_i, V[c_j, f(c_i)] x_j>``, two ``k``-vector gathers per pair;
* FwFM: ``R[min(f_i, f_j), max(f_i, f_j)] <V[c_i] x_i, V[c_j] x_j>``

(each factor is multiplied by its value before the dot, so values near 1e20 with
small factors neither under- nor overflow in float32).

The pair loop stops at the block's longest row. Entries with ``x == 0``
(padding, explicit zeros) mask every gather, so their parameters are never
read. Accumulation is elementwise in the compute dtype (float64 stays float64;
float32 and 16-bit inputs accumulate in float32): no ``tl.dot``, so no TF32.
Parameter offsets are 64-bit (``p * f * k`` may pass 2^31).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import triton
import triton.language as tl

from gpustat._arrays import next_pow2, nonempty
from gpustat.csr import CSR
from gpustat.reference.factorization import assemble_scores, score_dtype
from gpustat.triton._common import CompileCase, launch

__all__ = ["COMPILE_CASES", "ffm_scores", "fwfm_scores", "kernel_settings", "pair_table",
           "scores_forward"]

_MODEL_CODE = {"ffm": 0, "fwfm": 1}


@triton.jit
def _pair_scores_kernel(rows_ptr, indptr_ptr, indices_ptr, data_ptr, fields_ptr, pairs_ptr,
                        w_ptr, V_ptr, R_ptr, out_ptr,
                        NUM_ROWS: tl.constexpr, WIDTH: tl.constexpr, NUM_PAIRS: tl.constexpr,
                        K: tl.constexpr, BLOCK_K: tl.constexpr, NUM_FIELDS: tl.constexpr,
                        MODEL: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_W: tl.constexpr,
                        BLOCK_P: tl.constexpr):
    dtype = out_ptr.dtype.element_ty
    slots = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    real = slots < NUM_ROWS
    row = tl.load(rows_ptr + slots, mask=real, other=0)
    start = tl.load(indptr_ptr + row, mask=real, other=0)
    length = tl.load(indptr_ptr + row + 1, mask=real, other=0) - start

    # linear term over the row's positions, block_w at a time
    acc = tl.full([BLOCK_ROWS], 0, dtype)
    for offset in tl.static_range(0, WIDTH, BLOCK_W):
        at = offset + tl.arange(0, BLOCK_W)
        inside = at[None, :] < length[:, None]
        pos = start[:, None] + at[None, :]
        col = tl.load(indices_ptr + pos, mask=inside, other=0)
        x = tl.load(data_ptr + pos, mask=inside, other=0).to(dtype)
        w = tl.load(w_ptr + col, mask=inside & (x != 0), other=0)
        acc += tl.sum(w * x, axis=1)

    # pairs (i < j) ordered by j: a row of length L uses the first L (L - 1) / 2
    longest = tl.max(length, axis=0)
    t = tl.arange(0, BLOCK_K)
    k_mask = t < K
    block_pairs = longest * (longest - 1) // 2
    first = 0
    while first < block_pairs:  # (a while loop: the bound is a runtime value)
        q = first + tl.arange(0, BLOCK_P)
        listed = q < NUM_PAIRS
        pair_i = tl.load(pairs_ptr + q, mask=listed, other=0)
        pair_j = tl.load(pairs_ptr + NUM_PAIRS + q, mask=listed, other=0)
        valid = listed[None, :] & (pair_j[None, :] < length[:, None])  # (rows, pairs)
        pos_i = start[:, None] + pair_i[None, :]
        pos_j = start[:, None] + pair_j[None, :]
        col_i = tl.load(indices_ptr + pos_i, mask=valid, other=0).to(tl.int64)
        col_j = tl.load(indices_ptr + pos_j, mask=valid, other=0).to(tl.int64)
        x_i = tl.load(data_ptr + pos_i, mask=valid, other=0).to(dtype)
        x_j = tl.load(data_ptr + pos_j, mask=valid, other=0).to(dtype)
        live = valid & (x_i != 0) & (x_j != 0)
        field_i = tl.load(fields_ptr + col_i, mask=live, other=0)
        field_j = tl.load(fields_ptr + col_j, mask=live, other=0)
        vector_mask = live[:, :, None] & k_mask[None, None, :]
        if MODEL == 0:  # FFM: V is (p, f, k)
            slot_a = (col_i * NUM_FIELDS + field_j) * K
            slot_b = (col_j * NUM_FIELDS + field_i) * K
        else:  # FwFM: V is (p, k)
            slot_a = col_i * K
            slot_b = col_j * K
        a = tl.load(V_ptr + slot_a[:, :, None] + t[None, None, :], mask=vector_mask, other=0)
        b = tl.load(V_ptr + slot_b[:, :, None] + t[None, None, :], mask=vector_mask, other=0)
        # each factor times its value before the dot: large values with small factors
        # neither under- nor overflow on the way to a representable pair term
        weight = tl.sum((a * x_i[:, :, None]) * (b * x_j[:, :, None]), axis=2)
        if MODEL == 1:  # field-pair weight from R's upper triangle
            lo = tl.minimum(field_i, field_j)
            hi = tl.maximum(field_i, field_j)
            weight = weight * tl.load(R_ptr + lo * NUM_FIELDS + hi, mask=live, other=0)
        acc += tl.sum(tl.where(live, weight, 0), axis=1)
        first += BLOCK_P
    tl.store(out_ptr + slots, acc, mask=real)


@functools.cache
def pair_table(width: int) -> np.ndarray:
    """(2, max(1, width (width - 1) / 2)) int32: rows i and j of the pairs i < j, ordered by j."""
    j, i = np.nonzero(np.tril(np.ones((width, width), dtype=bool), -1))
    table = np.stack([i, j]).astype(np.int32)
    return table if table.shape[1] else np.zeros((2, 1), np.int32)


def kernel_settings(width: int, k: int, dtype) -> dict:
    """Default ``block_rows``, ``block_p``, ``block_w``, ``num_warps`` for a bucket.

    Each pair step holds two ``block_rows x block_p x next_pow2(k)`` tiles; they
    are kept near 2048 elements (16 per thread at 4 warps) in float32, half that
    in float64.
    """
    num_pairs = width * (width - 1) // 2
    block_k = next_pow2(k)
    budget = 2048 if jnp.dtype(dtype) != jnp.float64 else 1024
    block_p = max(1, min(next_pow2(num_pairs), budget // block_k, 256))
    block_rows = max(1, min(64, budget // (block_p * block_k)))
    return {"block_rows": block_rows, "block_p": block_p, "block_w": min(width, 64),
            "num_warps": 4}


def _constexprs(model: str, width: int, num_rows: int, k: int, n_fields: int, dtype,
                overrides: dict) -> tuple[dict, int]:
    settings = {**kernel_settings(width, k, dtype),
                **{key: v for key, v in overrides.items() if v is not None}}
    constexprs = dict(
        NUM_ROWS=num_rows, WIDTH=width, NUM_PAIRS=max(1, width * (width - 1) // 2), K=k,
        BLOCK_K=next_pow2(k), NUM_FIELDS=n_fields, MODEL=_MODEL_CODE[model],
        BLOCK_ROWS=settings["block_rows"], BLOCK_W=min(settings["block_w"], width),
        BLOCK_P=settings["block_p"])
    return constexprs, settings["num_warps"]


def _bucket_call(model: str, X: CSR, rows, width: int, params: tuple, dtype, *, interpret: bool,
                 k: int, n_fields: int, overrides: dict):
    """Scores (without w0) of one bucket's rows, shape ``rows.shape``."""
    constexprs, num_warps = _constexprs(model, width, rows.shape[0], k, n_fields, dtype,
                                        overrides)
    grid = (-(-rows.shape[0] // constexprs["BLOCK_ROWS"]),)
    pairs = jnp.asarray(pair_table(width).reshape(-1))

    # multiclass parameters arrive batched under vmap: one launch per class
    @jax.custom_batching.sequential_vmap
    def call(fields, w, V, R):
        return launch(_pair_scores_kernel, (rows, X.indptr, X.indices, X.data, fields, pairs,
                                            w, V, R),
                      jax.ShapeDtypeStruct(rows.shape, dtype), grid, num_warps=num_warps,
                      interpret=interpret, **constexprs)

    return call(*params)


def _scores(model: str, X: CSR, field_ids, w0, w, V, R, *, interpret: bool, **overrides):
    dtype = score_dtype(*(a for a in (X.data, w0, w, V, R) if a is not None))
    V = nonempty(V, axis=-1)  # k = 0 (a linear model): one zero factor to gather
    k = V.shape[-1]
    n_fields = V.shape[1] if model == "ffm" else R.shape[0]
    # parameters in the compute dtype, flattened so the kernel gathers by flat offset;
    # FFM passes a dummy R that is never read
    R = jnp.zeros((1,), dtype) if R is None else R.astype(dtype).reshape(-1)
    params = (field_ids.astype(jnp.int32), w.astype(dtype), V.astype(dtype).reshape(-1), R)
    w0 = jnp.asarray(w0, dtype)
    per_bucket = [
        _bucket_call(model, X, rows, width, params, dtype, interpret=interpret, k=k,
                     n_fields=n_fields, overrides=overrides) + w0
        for rows, width in zip(X.bucket_rows, X.buckets.widths, strict=True)
    ]
    return assemble_scores(X, w0, per_bucket)


def ffm_scores(X: CSR, field_ids, w0, w, V, *, interpret: bool = False, **settings):
    """FFM scores ``(n,)`` by the Triton kernel; same meaning as the reference ``ffm_scores``.

    Args:
        X: ``(n, p)`` :class:`CSR` rows.
        field_ids: ``(p,)`` int field of each feature.
        w0, w, V: bias ``()``, linear ``(p,)``, field-aware factors ``(p, f, k)``.
        interpret: run the kernel in Triton's interpreter on the host (tests).
        **settings: ``block_rows``, ``block_p``, ``block_w``, ``num_warps`` overrides.
    """
    return _scores("ffm", X, field_ids, w0, w, V, None, interpret=interpret, **settings)


def fwfm_scores(X: CSR, field_ids, w0, w, V, R, *, interpret: bool = False, **settings):
    """FwFM scores ``(n,)`` by the Triton kernel; ``V`` ``(p, k)``, ``R`` ``(f, f)`` (upper read).

    Args and settings as :func:`ffm_scores`.
    """
    return _scores("fwfm", X, field_ids, w0, w, V, R, interpret=interpret, **settings)


@functools.cache
def scores_forward(model: str):
    """``(X, field_ids, w0, w, V, R) -> (n,)`` scores of ``model`` ("ffm" or "fwfm").

    The forward the public ``ffm_predict``/``fwfm_predict`` wrap in their custom VJP.
    """
    if model == "ffm":
        return lambda X, field_ids, w0, w, V, R: ffm_scores(X, field_ids, w0, w, V)
    if model == "fwfm":
        return fwfm_scores
    raise ValueError(f"the Triton kernels score 'ffm' and 'fwfm', got {model=!r}")


def _compile_cases() -> tuple[CompileCase, ...]:
    """Configurations the CPU tests compile for sm_90: both models, three dtypes and widths."""
    cases = []
    for model, dtype, width in [("ffm", jnp.float32, 16), ("fwfm", jnp.float64, 64),
                                ("ffm", jnp.bfloat16, 2)]:
        acc = score_dtype(jnp.zeros((), dtype))
        constexprs, num_warps = _constexprs(model, width, 1000, 8, 16, acc, {})
        arg_dtypes = (jnp.int32, jnp.int32, jnp.int32, dtype, jnp.int32, jnp.int32,
                      acc, acc, acc, acc)
        cases.append(CompileCase(f"{model}_scores[{jnp.dtype(dtype).name},width={width}]",
                                 _pair_scores_kernel, arg_dtypes, constexprs, num_warps))
    return tuple(cases)


COMPILE_CASES = _compile_cases()
