"""Pallas kernel for batched border (arrow-Schur) Newton solves: the square-root Schur sequence.

One program solves one atom. Its rows stream through in chunks of ``block_rows``;
per chunk the latent coordinates ``p < d`` are ``(block_rows, K)`` tiles of ``H_tb``
loaded straight from the packed layout, each row's ``d x d`` Cholesky and forward
substitution run elementwise over the rows (unrolled over the static ``d``), and the
Schur complement gathers ``sum_i Y_i^T Y_i`` as ``d`` two-dimensional
``(K, rows) @ (rows, K)`` dots (tensor-core DMMA for float64 on Hopper, IEEE float32
otherwise) into a ``(K, K)`` accumulator. ``S``'s Cholesky, ``delta_beta`` and the
log-determinant follow in registers, then ``delta_t`` row by row.

An atom that fits in one chunk keeps its whitened tiles ``Y``, ``u`` and ``L`` in
registers for the back substitution (inputs read once); a longer atom streams its
chunks twice (the second pass re-reads what it just read, mostly from L2).
``K`` is the border width padded to 16 or 32 (the DMMA minimum is 16) and
``block_rows`` the row count padded to a power of two between 16 and the
``config``'s cap; padded rows are identity blocks with zero cross terms and padded
border entries identity, so they change nothing. Atoms are bucketed by
``(K, block_rows)``; each bucket is one ``pallas_call`` writing in place (aliased
outputs) into the shared packed results.

Numerics: float64 stays float64, everything else computes in float32 (dots at
``Precision.HIGHEST``, i.e. no TF32). A pivot fails when ``not (pivot > 0)``; the
failing atom's outputs go NaN and its status says why (same rules as
:mod:`gpustat.reference.border`), other atoms never see it. Index arithmetic is
int32: packed arrays must have fewer than 2**31 entries.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

from gpustat.border_layout import BorderLayout
from gpustat.pallas._common import compute_dtype, next_pow2, pallas_call, register_lowering_case
from gpustat.reference.border import (
    STATUS_NONFINITE,
    STATUS_OK,
    STATUS_ROW_NOT_PD,
    STATUS_SCHUR_NOT_PD,
    gershgorin_ridge_bump,
)

__all__ = ["MAX_KERNEL_D", "KernelConfig", "plan_buckets", "solve_border_pallas"]

#: Largest row dimension d the kernel unrolls (larger d goes to the reference).
MAX_KERNEL_D = 8
_MIN_TILE = 16  # smallest K and block_rows: float64 dots need M, K >= 16 in Triton
_NO_ROW = 2**30  # "no failing row yet" sentinel, larger than any atom-local row index
_META_FIELDS = 7  # atom id, first row, rows, border width, H_tb / H_bb / g_b offsets


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    """Tile rules: ``block_rows <= max_block_rows`` and ``d * block_rows * K <= tile_elems``
    (the ``H_tb`` tiles of one chunk); ``num_warps = clamp(block_rows * K / elems_per_warp,
    1, max_warps)``.

    Default = the fastest measured (H100, B = 100k, d = 2, k_a in [4, 12], commit b8b3cb9,
    ``benchmarks/results/nvidia-h100-80gb-hbm3/border.jsonl``): 64-row cap 11.9 ms, 128-row
    cap 29-58 ms (128-row tiles spill with 1-2 warps, reduce slowly across 4-8).
    """

    tile_elems: int = 4096
    max_block_rows: int = 64
    elems_per_warp: int = 512
    max_warps: int = 4

    def block_rows_cap(self, d: int, K: int) -> int:
        cap = min(self.max_block_rows, max(1, self.tile_elems // (d * K)))
        return max(_MIN_TILE, next_pow2(cap + 1) // 2)  # round down to a power of two

    def num_warps(self, block_rows: int, K: int) -> int:
        return int(np.clip(block_rows * K // self.elems_per_warp, 1, self.max_warps))


@dataclasses.dataclass(frozen=True)
class _Bucket:
    """Atoms solved with one tile shape, one program each (``atoms`` in program order)."""

    K: int
    block_rows: int
    streamed: bool  # atoms longer than one chunk: two passes over their rows
    atoms: np.ndarray


def plan_buckets(layout: BorderLayout, config: KernelConfig) -> list[_Bucket]:
    """Group atoms by padded border ``K`` and row tile (host, static).

    Atoms that fit one chunk get ``block_rows = next_pow2(n_a)`` (at least 16); longer
    atoms stream chunks of the cap, longest first so the last programs are short.
    """
    buckets = []
    K_all = np.array([max(_MIN_TILE, next_pow2(k)) for k in layout.k_dims], dtype=np.int64)
    for K in sorted(set(K_all.tolist())):
        cap = config.block_rows_cap(layout.d, K)
        in_K = np.flatnonzero(K_all == K)
        n = layout.n_rows[in_K]
        R_all = np.array([max(_MIN_TILE, next_pow2(x)) for x in n], dtype=np.int64)
        for R in sorted(set(R_all[n <= cap].tolist())):
            buckets.append(_Bucket(K, R, False, in_K[(n <= cap) & (R_all == R)]))
        if np.any(n > cap):
            long = in_K[n > cap]
            buckets.append(_Bucket(K, cap, True,
                                   long[np.argsort(-layout.n_rows[long], kind="stable")]))
    return buckets


def _bucket_meta(layout: BorderLayout, bucket: _Bucket) -> np.ndarray:
    """Flat ``(programs * 7,)`` int32 per-program metadata in :data:`_META_FIELDS` order."""
    a = bucket.atoms
    fields = [a, layout.row_offsets[a], layout.n_rows[a], layout.k_dims[a],
              layout.cross_offsets[a], layout.hbb_offsets[a], layout.border_offsets[a]]
    return np.stack(fields, axis=1).astype(np.int32).reshape(-1)


def _load(ref, index, mask, other):
    """Gather ``ref[index]`` where ``mask`` (a safe index elsewhere)."""
    return plt.load(ref.at[jnp.where(mask, index, 0)], mask=mask, other=other)


def _store(ref, index, value, mask):
    """Scatter ``value`` to ``ref[index]`` where ``mask``.

    Masked lanes aim at the buffer's last slot, a spare one in interpret mode: that mode
    emulates a masked store as a read-modify-write scatter, so a masked lane must not
    share a real index there (on the GPU a masked lane writes nothing).
    """
    plt.store(ref.at[jnp.where(mask, index, ref.shape[0] - 1)], value, mask=mask)


def _nan_probe(x):
    """``sum(x * 0)``: 0 when every entry of ``x`` is finite, NaN otherwise.

    Reduced one axis at a time: a full reduction of a 2-D tile does not lower.
    """
    x = x * 0.0
    while x.ndim:
        x = jnp.sum(x, axis=-1)
    return x


def _row_cholesky(h, ridge, d):
    """Unrolled ``d x d`` lower Cholesky of ``h + ridge I`` on ``(R,)`` row vectors.

    Returns ``(L, inv_diag, pivots)``: ``L[(p, q)]`` for p > q, ``1 / L[(p, p)]`` and
    the ``d`` pivots (``L[(p, p)]^2``).
    """
    L, inv_diag, pivots = {}, [], []
    for j in range(d):
        pivot = h[(j, j)] + ridge - sum((L[(j, q)] ** 2 for q in range(j)), start=0.0)
        inv_diag.append(jax.lax.rsqrt(pivot))
        for i in range(j + 1, d):
            dot = sum((L[(i, q)] * L[(j, q)] for q in range(j)), start=0.0)
            L[(i, j)] = (h[(i, j)] - dot) * inv_diag[j]
        pivots.append(pivot)
    return L, inv_diag, pivots


def _row_bump(h, ridge, d, unit_roundoff):
    """Gershgorin ridge bump of every row's unridged block ``h`` (spec B.5), ``(R,)``."""
    gap = scale = radius = None
    for p in range(d):
        diag = h[(p, p)]
        off = sum((jnp.abs(h[(max(p, q), min(p, q))]) for q in range(d) if q != p), start=0.0)
        row_gap, row_radius = diag - off, jnp.abs(diag) + off
        gap = row_gap if gap is None else jnp.minimum(gap, row_gap)
        scale = jnp.abs(diag) if scale is None else jnp.maximum(scale, jnp.abs(diag))
        radius = row_radius if radius is None else jnp.maximum(radius, row_radius)
    return gershgorin_ridge_bump(gap, jnp.maximum(scale, 1.0), radius, ridge, d, unit_roundoff)


def _gram(Y):
    """``Y^T Y`` of an ``(R, K)`` tile as one 2-D dot, full precision."""
    return jax.lax.dot_general(Y, Y, (((0,), (0,)), ((), ())),
                               precision=jax.lax.Precision.HIGHEST,
                               preferred_element_type=Y.dtype)


def _schur_solve(S, rhs, k, ck):
    """Right-looking Cholesky of ``S`` ``(K, K)`` with the forward solve fused, then the
    back solve: ``(delta_beta (K,), sum log pivots over the k real columns, failed)``.

    A failed pivot (``not (pivot > 0)``) leaves NaN on ``L_S``'s diagonal, so failure is
    read off the diagonal after the loop as a vector reduction, the form the row pass
    uses: a boolean scalar carried through the loop came back False on an H100.
    """
    K = ck.shape[0]
    ii, jj = ck[:, None], ck[None, :]

    def column(j, carry):
        S, L_S, z, rhs, log_det = carry
        col = jnp.sum(jnp.where(jj == j, S, 0.0), axis=1)
        pivot = jnp.sum(jnp.where(ck == j, col, 0.0))
        inv = jax.lax.rsqrt(pivot)
        l = jnp.where(ck > j, col * inv, jnp.where(ck == j, pivot * inv, 0.0))
        S = S - jnp.where((ii > j) & (jj > j), l[:, None] * l[None, :], 0.0)
        L_S = L_S + jnp.where(jj == j, l[:, None], 0.0)
        z_j = jnp.sum(jnp.where(ck == j, rhs, 0.0)) * inv
        z = jnp.where(ck == j, z_j, z)
        rhs = rhs - jnp.where(ck > j, l * z_j, 0.0)
        log_det += jnp.where(j < k, jnp.log(pivot), 0.0)
        return S, L_S, z, rhs, log_det

    zero = jnp.zeros((), S.dtype)
    _, L_S, z, _, log_det = jax.lax.fori_loop(
        0, K, column, (S, jnp.zeros_like(S), jnp.zeros_like(rhs), rhs, zero))
    diag = jnp.sum(jnp.where(ii == jj, L_S, 0.0), axis=1)
    first_bad = jnp.min(jnp.where((ck < k) & ~(diag > 0), ck, _NO_ROW))

    # delta_beta = L_S^{-T} z, one column of L_S (= row of L_S^T) per step, last first.
    def back(step, x):
        j = K - 1 - step
        col = jnp.sum(jnp.where(jj == j, L_S, 0.0), axis=1)
        done = jnp.sum(jnp.where(ck > j, col * x, 0.0))
        l_jj = jnp.sum(jnp.where(ck == j, col, 0.0))
        z_j = jnp.sum(jnp.where(ck == j, z, 0.0))
        return jnp.where(ck == j, (z_j - done) / l_jj, x)

    return jax.lax.fori_loop(0, K, back, jnp.zeros_like(rhs)), log_det, first_bad < _NO_ROW


def _border_kernel(*refs, d, K, block_rows, streamed, unit_roundoff):
    # refs: 8 inputs, then (after the first bucket) the 6 aliased outputs, then the outputs.
    meta_ref, ridge_t_ref, ridge_b_ref, htt_ref, htb_ref, gt_ref, hbb_ref, gb_ref = refs[:8]
    dt_ref, db_ref, ld_ref, st_ref, row_ref, bump_ref = refs[-6:]
    R = block_rows
    dtype = ld_ref.dtype
    base = pl.program_id(0) * _META_FIELDS
    atom, row0, n, k, cross0, hbb0, gb0 = (meta_ref[base + f] for f in range(_META_FIELDS))
    ridge_t = ridge_t_ref[atom]
    ridge_b = ridge_b_ref[atom]
    ck = jnp.arange(K, dtype=jnp.int32)
    col_ok = ck < k

    def load_chunk(c):
        """Rows ``c*R ..`` of the atom: lower ``H_tt`` entries and ``g_t`` as ``(R,)``
        vectors, ``H_tb`` as one ``(R, K)`` tile per latent coordinate ``p`` (row stride
        ``d k`` in the packed layout). Masked rows read as identity blocks."""
        local = c * R + jnp.arange(R, dtype=jnp.int32)
        row_ok = local < n
        row = row0 + local
        h = {(p, q): _load(htt_ref, row * (d * d) + p * d + q, row_ok, 1.0 if p == q else 0.0)
             for p in range(d) for q in range(p + 1)}
        g = [_load(gt_ref, row * d + p, row_ok, 0.0) for p in range(d)]
        tile_ok = row_ok[:, None] & col_ok[None, :]
        B = [_load(htb_ref, cross0 + (local[:, None] * d + p) * k + ck[None, :], tile_ok, 0.0)
             for p in range(d)]
        return local, row_ok, h, g, B

    def whiten(row_ok, h, g, B):
        """Steps 1-2: ``L_i``, ``u_i = L_i^{-1} g_i``, ``Y_i = L_i^{-1} H_tb_i`` on the chunk."""
        L, inv_diag, pivots = _row_cholesky(h, jnp.where(row_ok, ridge_t, 0.0), d)
        Y, u = [], []
        for p in range(d):
            y_p, u_p = B[p], g[p]
            for q in range(p):
                y_p = y_p - L[(p, q)][:, None] * Y[q]
                u_p = u_p - L[(p, q)] * u[q]
            Y.append(y_p * inv_diag[p][:, None])
            u.append(u_p * inv_diag[p])
        return L, inv_diag, pivots, Y, u

    def row_pass(c, carry):
        S, rhs, log_det, first_bad, bump, probe = carry
        local, row_ok, h, g, B = load_chunk(c)
        L, inv_diag, pivots, Y, u = whiten(row_ok, h, g, B)
        # Step 1 failures: first failing row of the chunk and its Gershgorin bump.
        good = row_ok
        for pivot in pivots:
            good = good & (pivot > 0)
            log_det += jnp.sum(jnp.where(row_ok, jnp.log(pivot), 0.0))
        failing = jnp.min(jnp.where(row_ok & ~good, local, _NO_ROW))
        chunk_bump = jnp.sum(jnp.where(local == failing,
                                       _row_bump(h, ridge_t, d, unit_roundoff), 0.0))
        bump = jnp.where(failing < first_bad, chunk_bump, bump)
        first_bad = jnp.minimum(first_bad, failing)
        for x in [*h.values(), *g, *B]:
            probe += _nan_probe(x)
        # Step 3: S -= sum_i Y_i^T Y_i (one dot per p), rhs += sum_i Y_i^T u_i.
        for p in range(d):
            S -= _gram(Y[p])
            rhs += jnp.sum(Y[p] * u[p][:, None], axis=0)
        return (S, rhs, log_det, first_bad, bump, probe), (row_ok, L, inv_diag, Y, u)

    carry = (jnp.zeros((K, K), dtype), jnp.zeros((K,), dtype), jnp.zeros((), dtype),
             jnp.int32(_NO_ROW), jnp.zeros((), dtype), jnp.zeros((), dtype))
    n_chunks = (n + R - 1) // R
    if streamed:
        carry = jax.lax.fori_loop(0, n_chunks, lambda c, cr: row_pass(c, cr)[0], carry)
    else:
        carry, whitened = row_pass(0, carry)
    S, rhs, log_det, first_bad, row_bump, probe = carry

    # Border: S0 = H_bb - sum Y^T Y (unridged, for the bump), then ridge; padding is I.
    ii, jj = ck[:, None], ck[None, :]
    border_ok = col_ok[:, None] & col_ok[None, :]
    H_bb = _load(hbb_ref, hbb0 + jnp.maximum(ii, jj) * k + jnp.minimum(ii, jj), border_ok, 0.0)
    g_b = _load(gb_ref, gb0 + ck, col_ok, 0.0)
    probe += _nan_probe(H_bb) + _nan_probe(g_b)
    S += H_bb
    diag_S = jnp.sum(jnp.where(ii == jj, S, 0.0), axis=1)
    off_S = jnp.sum(jnp.where(border_ok, jnp.abs(S), 0.0), axis=1) - jnp.abs(diag_S)
    schur_bump = gershgorin_ridge_bump(
        jnp.min(jnp.where(col_ok, diag_S - off_S, jnp.inf)),
        jnp.maximum(1.0, jnp.max(jnp.where(col_ok, jnp.abs(diag_S), 0.0))),
        jnp.max(jnp.where(col_ok, jnp.abs(diag_S) + off_S, 0.0)),
        ridge_b, k.astype(dtype), unit_roundoff)
    S += jnp.where(ii == jj, jnp.where(col_ok, ridge_b, 1.0)[:, None], 0.0)

    # Steps 4-5 and 7: delta_beta = S^{-1} (sum Y^T u - g_b), log det.
    delta_beta, schur_log_det, schur_bad = _schur_solve(S, rhs - g_b, k, ck)
    log_det += schur_log_det

    # probe is NaN exactly when some input entry the solve reads is not finite.
    status = jnp.where(~(probe == 0), STATUS_NONFINITE,
                       jnp.where(first_bad < _NO_ROW, STATUS_ROW_NOT_PD,
                                 jnp.where(schur_bad, STATUS_SCHUR_NOT_PD, STATUS_OK)))
    status = status.astype(jnp.int32)
    failed = status != STATUS_OK
    st_ref[atom] = status
    row_ref[atom] = jnp.where(status == STATUS_ROW_NOT_PD, first_bad, -1).astype(jnp.int32)
    bump_ref[atom] = jnp.where(status == STATUS_ROW_NOT_PD, row_bump,
                               jnp.where(status == STATUS_SCHUR_NOT_PD, schur_bump, 0.0))
    ld_ref[atom] = jnp.where(failed, jnp.nan, log_det)
    _store(db_ref, gb0 + ck, jnp.where(failed, jnp.nan, delta_beta), col_ok)

    # Step 6: delta_t_i = -L_i^{-T} (u_i + Y_i delta_beta).
    def solve_rows(c, row_ok, L, inv_diag, Y, u):
        w = [u[p] + jnp.sum(Y[p] * delta_beta[None, :], axis=1) for p in range(d)]
        x = [None] * d
        for p in reversed(range(d)):
            v = w[p]
            for q in range(p + 1, d):
                v = v - L[(q, p)] * x[q]
            x[p] = v * inv_diag[p]
        row = row0 + c * R + jnp.arange(R, dtype=jnp.int32)
        for p in range(d):
            _store(dt_ref, row * d + p, jnp.where(failed, jnp.nan, -x[p]), row_ok)

    if streamed:
        def solve_pass(c, carry):
            _, row_ok, h, g, B = load_chunk(c)
            L, inv_diag, _, Y, u = whiten(row_ok, h, g, B)
            solve_rows(c, row_ok, L, inv_diag, Y, u)
            return carry

        jax.lax.fori_loop(0, n_chunks, solve_pass, jnp.int32(0))
    else:
        solve_rows(0, *whitened)


def _solve_bucket(bucket: _Bucket, meta, ridge_t, ridge_beta, arrays, outputs, *, d,
                  interpret, num_warps):
    """One ``pallas_call``. ``outputs`` are ``jax.ShapeDtypeStruct`` for the first bucket
    (fresh buffers, no memset: the buckets together write every entry) and arrays after
    it, updated in place."""
    dtype = outputs[0].dtype
    kernel = functools.partial(
        _border_kernel, d=d, K=bucket.K, block_rows=bucket.block_rows,
        streamed=bucket.streamed, unit_roundoff=float(jnp.finfo(dtype).eps) / 2)
    inputs = (meta, ridge_t, ridge_beta, *arrays)
    fresh = isinstance(outputs[0], jax.ShapeDtypeStruct)
    call = pallas_call(
        kernel, interpret=interpret, num_warps=num_warps,
        grid=(bucket.atoms.size,),
        out_shape=[jax.ShapeDtypeStruct(o.shape, o.dtype) for o in outputs],
        input_output_aliases={} if fresh else {len(inputs) + i: i for i in range(len(outputs))},
    )
    return call(*inputs) if fresh else call(*inputs, *outputs)


@functools.partial(jax.jit, static_argnames=("layout", "interpret", "config"))
def solve_border_pallas(layout: BorderLayout, H_tt, H_tb, g_t, H_bb, g_b, ridge_t, ridge_beta,
                        *, interpret: bool = False, config: KernelConfig = KernelConfig()):
    """Kernel twin of :func:`gpustat.reference.border.solve_border_reference` (same arguments).

    Returns ``delta_t (N, d)``, ``delta_beta`` flat, ``log_det (b,)``, ``status (b,)``,
    ``row (b,)``, ``bump (b,)``; arrays in the compute dtype.
    """
    dtype = compute_dtype(H_tt.dtype)
    d = layout.d
    arrays = tuple(jnp.asarray(x, dtype).reshape(-1) for x in (H_tt, H_tb, g_t, H_bb, g_b))
    b = layout.num_atoms
    # In interpret mode every output has one spare trailing slot for masked lanes (see
    # _store); on the GPU masked lanes write nothing, and no slice copies the results.
    spare = 1 if interpret else 0
    sizes = (layout.num_rows * d, int(layout.border_offsets[-1]), b, b, b, b)
    dtypes = (dtype, dtype, dtype, jnp.int32, jnp.int32, dtype)
    outputs = [jax.ShapeDtypeStruct((size + spare,), dt) for size, dt in zip(sizes, dtypes)]
    ridge_t = jnp.asarray(ridge_t, dtype)
    ridge_beta = jnp.asarray(ridge_beta, dtype)
    for bucket in plan_buckets(layout, config):
        meta = jnp.asarray(_bucket_meta(layout, bucket))
        outputs = _solve_bucket(bucket, meta, ridge_t, ridge_beta, arrays, outputs, d=d,
                                interpret=interpret,
                                num_warps=config.num_warps(bucket.block_rows, bucket.K))
    delta_t, delta_beta, log_det, status, row, bump = (
        out[:size] for out, size in zip(outputs, sizes))
    return delta_t.reshape(layout.num_rows, d), delta_beta, log_det, status, row, bump


def _register_lowering_cases() -> None:
    """One small ragged layout per dtype: one-chunk atoms (K 16 and 32) and streamed atoms."""
    layout = BorderLayout(2, np.array([3, 40, 1, 20, 200]), np.array([2, 5, 1, 20, 17]))
    for dtype in (jnp.float32, jnp.float64):
        sizes = layout.packed_sizes()
        args = [jax.ShapeDtypeStruct(sizes[name], dtype)
                for name in ("H_tt", "H_tb", "g_t", "H_bb", "g_b")]
        args += [jax.ShapeDtypeStruct((layout.num_atoms,), dtype)] * 2
        register_lowering_case(
            "border", f"solve_border_{jnp.dtype(dtype).name}",
            lambda *a: solve_border_pallas(layout, *a), args)


_register_lowering_cases()
