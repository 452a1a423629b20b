"""BMS FLEX Pallas-Triton kernels: Stage-1 cell moments, Stage-2 row derivatives, joint operators.

Each wrapper has the signature of its :mod:`gpustat.reference.bms` counterpart plus
``interpret`` and block settings. All arrays stay whole in global memory
(``memory_space=ANY``) and are read with masked gathers, so no wrapper pads or
copies a large input.

* ``_cell_moments_kernel``: ``block_cells`` cells per program, one cell per lane; the
  384 Gauss-Legendre nodes are walked serially (one mirror pair per loop step) into
  lane-local running moment sums, one per half of the cell, skipped entirely when
  every cell of the block takes the closed form (affine tails, affine cells wider than
  32 standard deviations each side): the upward recurrence on (block_cells,) vectors.
* ``_row_derivatives_kernel``: one row per program; its CSR cells stream through in
  chunks of ``block_cells``, loaded as one (r, 4 block_cells) jet tile each. The
  quadratic form Σ_pq E_up E_vq T_{p+q} of a chunk is two small full-precision dots,
  (E Hk) Eᵀ with the chunk's block-diagonal Hankel matrix Hk; the first functionals
  accumulate elementwise and are reduced once per row, which then finalises the
  implicit-function algebra on its (r, r) tile (stored from the upper triangle, so
  bitwise symmetric). The Hankel entries T_n per cell and the probit factors per row
  come from small XLA passes in the wrapper.
* ``_joint_hvp_kernel`` / ``_joint_diagonal_kernel`` / ``_joint_dense_kernel``: each
  program streams ``steps`` blocks of ``block_rows`` row Hessians (the Hessian is
  read once for all directions of a multi-RHS HVP) and writes its own partial sums;
  the wrapper adds the partials in program order (deterministic, no atomics).

Padding: r is padded to a power of two in registers only (lanes u >= r are masked
to zero on load, never stored).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from gpustat._arrays import compute_dtype, next_pow2, nonempty
from gpustat.pallas._common import pallas_call, plt
from gpustat.reference.bms import (
    AFFINE_TOL,
    CLOSED_FORM_MIN_HALF_WIDTH,
    GL_NODES,
    KAPPA,
    CellStatus,
    RowStatus,
    gauss_legendre,
    hankel_entries,
    probit_factors,
)
from gpustat.reference.numerics import ndtr

__all__ = ["cell_moments", "joint_dense", "joint_diagonal", "joint_hvp", "row_derivatives"]

_ANY = pl.BlockSpec(memory_space=pl.ANY)
_SQRT_2PI = 2.5066282746310002
MAX_RHS = 8


def _finite(x):
    """isfinite from comparisons (is_finite has no Triton lowering); NaN -> False."""
    return jnp.abs(x) < jnp.inf


def _load(ref, idx, mask, other=0.0):
    return plt.load(ref.at[idx], mask=mask, other=other)


def _dot_width(n):
    """Padded size of an in-kernel dot dimension (float64 dots need M, K >= 16)."""
    return max(16, next_pow2(n))


def _dot(a, b):
    """a @ b in full precision."""
    return jax.lax.dot(a, b, precision=jax.lax.Precision.HIGHEST,
                       preferred_element_type=a.dtype)


def _dot_t(a, b):
    """aᵀ @ b in full precision (contracts the row axis of both)."""
    return jax.lax.dot_general(a, b, (((0,), (0,)), ((), ())),
                               precision=jax.lax.Precision.HIGHEST,
                               preferred_element_type=a.dtype)


def _dot_nt(a, b):
    """a @ bᵀ in full precision (contracts the column axis of both)."""
    return jax.lax.dot_general(a, b, (((1,), (1,)), ((), ())),
                               precision=jax.lax.Precision.HIGHEST,
                               preferred_element_type=a.dtype)


# ----------------------------------------------------------------------------- Stage 1


def _ndtr_diff(lo, hi):
    upper = lo > 0
    return jnp.where(upper, ndtr(-lo) - ndtr(-hi), ndtr(hi) - ndtr(lo))


def _cell_moments_kernel(lo_ref, hi_ref, c_ref, nodes_ref, weights_ref, m_ref, status_ref, *,
                         n_cells, order, block_cells):
    cells = pl.program_id(0) * block_cells + jnp.arange(block_cells)
    live = cells < n_cells
    lo = _load(lo_ref, cells, live, -1.0)
    hi = _load(hi_ref, cells, live, 1.0)
    c0, c1, c2, c3 = (_load(c_ref, (cells, e), live) for e in range(4))
    finite_c = _finite(c0) & _finite(c1) & _finite(c2) & _finite(c3)
    infinite = (jnp.abs(lo) == jnp.inf) | (jnp.abs(hi) == jnp.inf)
    curved = (jnp.abs(c2) > AFFINE_TOL) | (jnp.abs(c3) > AFFINE_TOL)
    invalid = (lo != lo) | (hi != hi) | ~(hi > lo) | (lo == jnp.inf) | (hi == -jnp.inf)
    half = jnp.where(infinite, 1.0, 0.5 * (hi - lo))
    mid = jnp.where(infinite, 0.0, 0.5 * (hi + lo))
    k2 = half * half * (c2 + 3.0 * c3 * mid)
    k3 = c3 * half * half * half
    affine = (jnp.abs(k2) <= AFFINE_TOL) & (jnp.abs(k3) <= AFFINE_TOL)
    wide = half * jnp.sqrt(1.0 + c1 * c1) > CLOSED_FORM_MIN_HALF_WIDTH
    closed_form = infinite | (affine & wide)
    zero = jnp.zeros_like(c0)
    c0, c1, c2, c3 = (jnp.where(finite_c, v, zero) for v in (c0, c1, c2, c3))

    # Gauss-Legendre on [mid - half, mid + half]: one cell per lane, the nodes walked
    # serially into lane-local running moment sums (no cross-lane reductions), one
    # mirror pair z = mid ± d per loop step (the rule's nodes and weights are exactly
    # symmetric). The two halves keep separate sums: on a symmetric cell they are
    # bitwise mirror images whatever the compiler contracts into FMAs, so odd moments
    # come out exactly zero. Skipped when every cell of the block takes the closed form.
    def gl_pair(j, carry):
        sums, bad = carry
        node = GL_NODES - 1 - j                                   # t_node >= 0
        d = half * nodes_ref[node]
        hw = half * weights_ref[node]
        new = []
        for z, acc in zip((mid + d, mid - d), sums):
            eta = c0 + z * (c1 + z * (c2 + z * c3))
            qz = 0.5 * (z * z + eta * eta)
            bad = bad | ~_finite(qz)
            term = hw * jnp.exp(-qz)
            half_sums = []
            for k in range(order + 1):
                half_sums.append(acc[k] + term)
                term = term * z
            new.append(tuple(half_sums))
        return tuple(new), bad

    needs_gl = jnp.max(jnp.where(live & ~closed_form, 1, 0).astype(jnp.int32))
    acc0 = tuple(zero for _ in range(order + 1))
    (upper, lower), gl_bad = jax.lax.fori_loop(0, needs_gl * (GL_NODES // 2), gl_pair,
                                               ((acc0, acc0), jnp.zeros(block_cells, jnp.bool_)))
    gl = [p + q for p, q in zip(upper, lower)]

    # affine closed form: q(z) = d1 (z - μ)²/2 + α²/(2 d1), then the upward recurrence
    d0 = c0 * c1
    d1 = 1.0 + c1 * c1
    mu = -d0 / d1
    s = jnp.sqrt(d1)
    m0 = _SQRT_2PI / s * jnp.exp(-c0 * c0 / (2.0 * d1)) * _ndtr_diff(s * (lo - mu), s * (hi - mu))
    lo_fin = _finite(lo)
    hi_fin = _finite(hi)
    zl = jnp.where(lo_fin, lo, zero)
    zh = jnp.where(hi_fin, hi, zero)
    q_lo = 0.5 * (zl * zl + (c0 + c1 * zl) * (c0 + c1 * zl))
    q_hi = 0.5 * (zh * zh + (c0 + c1 * zh) * (c0 + c1 * zh))
    af_bad = ~(_finite(q_lo) & _finite(q_hi))
    e_lo = jnp.where(lo_fin, jnp.exp(-q_lo), zero)
    e_hi = jnp.where(hi_fin, jnp.exp(-q_hi), zero)
    af = [m0]
    prev = zero
    pow_lo = jnp.ones_like(zero)
    pow_hi = jnp.ones_like(zero)
    for n in range(order):
        nxt = (n * prev - d0 * af[-1] - (pow_hi * e_hi - pow_lo * e_lo)) / d1
        prev = af[-1]
        af.append(nxt)
        pow_lo = pow_lo * zl
        pow_hi = pow_hi * zh

    status = jnp.where(~finite_c, CellStatus.NON_FINITE_COEFFICIENT,
                       jnp.where(invalid, CellStatus.INVALID_INTERVAL,
                                 jnp.where(infinite & curved,
                                           CellStatus.NON_AFFINE_INFINITE_INTERVAL,
                                           jnp.where(jnp.where(closed_form, af_bad, gl_bad),
                                                     CellStatus.NON_FINITE_EVALUATION,
                                                     CellStatus.OK)))).astype(jnp.int32)
    ok = status == CellStatus.OK
    cols = jnp.arange(next_pow2(order + 1))
    out = jnp.zeros((block_cells, cols.shape[0]), zero.dtype)
    for k in range(order + 1):
        m_k = jnp.where(ok, jnp.where(closed_form, af[k], gl[k]), zero)
        out = jnp.where(cols[None, :] == k, m_k[:, None], out)
    plt.store(m_ref.at[cells[:, None], cols[None, :]], out,
              mask=live[:, None] & (cols[None, :] <= order))
    plt.store(status_ref.at[cells], status, mask=live)


@functools.partial(jax.jit, static_argnames=("order", "interpret", "block_cells", "num_warps"))
def cell_moments(lo, hi, c, *, order: int = 9, interpret: bool = False, block_cells: int = 128,
                 num_warps: int = 4):
    """Kernel twin of :func:`gpustat.reference.bms.cell_moments`."""
    dtype = compute_dtype(c.dtype)
    n_cells = c.shape[0]
    if n_cells == 0:  # no program to launch
        return [jnp.zeros((0, order + 1), dtype), jnp.zeros((0,), jnp.int32)]
    nodes, weights = gauss_legendre()
    kernel = functools.partial(_cell_moments_kernel, n_cells=n_cells, order=order,
                               block_cells=block_cells)
    return pallas_call(
        kernel, interpret=interpret, num_warps=num_warps,
        grid=(pl.cdiv(n_cells, block_cells),),
        in_specs=[_ANY] * 5, out_specs=[_ANY, _ANY],
        out_shape=[jax.ShapeDtypeStruct((n_cells, order + 1), dtype),
                   jax.ShapeDtypeStruct((n_cells,), jnp.int32)],
    )(lo.astype(dtype), hi.astype(dtype), c.astype(dtype), jnp.asarray(nodes, dtype),
      jnp.asarray(weights, dtype))


# ----------------------------------------------------------------------------- Stage 2


def _row_derivatives_kernel(offsets_ref, hankel_ref, m_ref, cell_status_ref, jet_ref, jet_a_ref,
                            jet_b_ref, mu1_ref, mu2_ref, chi_ref, xi_ref, rho_ref, tau_ref,
                            r_uv_ref, loss_ref, d_e_ref, d_ee_ref,
                            neglog_ref, grad_ref, hess_ref, status_ref, *, r, block_cells):
    # One row per program; its CSR cells stream through in chunks of block_cells. Column
    # k = 4 slot + q of an (R, 4 block_cells) tile belongs to the chunk's cell `slot` and
    # jet order q, so E[u, k] = E_uq is one gather of the chunk's jets. With the chunk's
    # block-diagonal Hankel matrix Hk[4 s + p, 4 s + q] = T_{p+q} of cell s (zero across
    # cells), the quadratic form Σ_cells Σ_pq E_up E_vq T_{p+q} is Σ_chunks (E Hk) Eᵀ: two
    # full-precision dots per chunk (float64: the m16n8k16 DMMA), everything else is
    # elementwise. The first functionals D(E_u) = κ Σ_q E_uq m_q (and those of the second
    # jets) accumulate as (R, 4 block_cells) tiles E κ m_q, reduced over k once per row.
    row = pl.program_id(0)
    start = offsets_ref[row]
    count = offsets_ref[row + 1] - start
    u = jnp.arange(_dot_width(r), dtype=jnp.int32)
    uu = u[:, None]
    vv = u[None, :]
    kk = jnp.arange(4 * block_cells, dtype=jnp.int32)
    slot = jnp.right_shift(kk, 2)
    q = kk & 3
    dtype = mu1_ref.dtype

    def chunk(j, carry):
        quad, acc, acc_a, acc_b, failed = carry
        in_row = j * block_cells + slot
        valid = in_row < count
        cell = start + in_row
        mask = valid[None, :] & (uu < r)
        e = _load(jet_ref, (cell[None, :], uu, q[None, :]), mask)
        same_cell = (slot[:, None] == slot[None, :]) & valid[None, :]
        hankel = _load(hankel_ref, (cell[None, :], q[:, None] + q[None, :]), same_cell)
        quad = quad + _dot_nt(_dot(e, hankel), e)
        m_q = KAPPA * _load(m_ref, (cell, q), valid)
        acc = acc + e * m_q[None, :]
        acc_a = acc_a + _load(jet_a_ref, (cell[None, :], uu, q[None, :]), mask) * m_q[None, :]
        acc_b = acc_b + _load(jet_b_ref, (cell[None, :], uu - 1, q[None, :]),
                              mask & (uu >= 1)) * m_q[None, :]
        failed = jnp.maximum(failed, _load(cell_status_ref, cell, valid, 0))
        return quad, acc, acc_a, acc_b, failed

    tile = jnp.zeros((u.shape[0], kk.shape[0]), dtype)
    quad, acc, acc_a, acc_b, failed = jax.lax.fori_loop(
        0, (count + (block_cells - 1)) // block_cells, chunk,
        (jnp.zeros((u.shape[0], u.shape[0]), dtype), tile, tile, tile,
         jnp.zeros(kk.shape, jnp.int32)))
    first, d_a, d_b = (jnp.sum(x, axis=1) for x in (acc, acc_a, acc_b))
    failed = jnp.max(failed)

    # second[u, v] = D(U_uv) - Σ_pq E_up E_vq T_{p+q} on the upper triangle u <= v (the only
    # part used below: the Hessian is stored from it, mirrored); U has row 0 (a: d_a) and
    # row 1 (b: d_b from v = 1 on).
    d_u = jnp.where(uu == 0, d_a[None, :], jnp.where((uu == 1) & (vv >= 1), d_b[None, :], 0.0))
    second = d_u - quad
    mu_1 = mu1_ref[row]
    mu_2 = mu2_ref[row]
    f_a = jnp.sum(jnp.where(u == 0, first, 0.0))
    row_a = jnp.sum(jnp.where(uu == 0, second, 0.0), axis=0)      # second[0, v]
    f_aa = jnp.sum(jnp.where(u == 0, row_a, 0.0))
    # the q-row: F depends on q only through -μ(q)
    f_u = jnp.where(u == 0, -mu_1, first)
    f_au = jnp.where(u == 0, 0.0, row_a)
    f_uv = jnp.where((uu == 0) | (vv == 0), jnp.where((uu == 0) & (vv == 0), -mu_2, 0.0), second)
    inv = 1.0 / f_a
    a_u = -f_u * inv
    outer_a = a_u[:, None] * a_u[None, :]
    a_uv = -((f_uv + (f_au[:, None] * a_u[None, :] + a_u[:, None] * f_au[None, :]))
             + f_aa * outer_a) * inv

    lane_r = u < r
    mask_rr = (uu < r) & (vv < r)
    rho = _load(rho_ref, (row, u), lane_r)
    tau = _load(tau_ref, (row, u), lane_r)
    r_uv = _load(r_uv_ref, (row, uu, vv), mask_rr & (uu <= vv))
    chi = chi_ref[row]
    xi = xi_ref[row]
    e_u = chi * a_u + rho
    e_uv = (((chi * a_uv + xi * outer_a)
             + (tau[:, None] * a_u[None, :] + a_u[:, None] * tau[None, :])) + r_uv)

    neglog = loss_ref[row]
    d_e = d_e_ref[row]
    d_ee = d_ee_ref[row]
    grad = d_e * e_u
    hess = d_ee * (e_u[:, None] * e_u[None, :]) + d_e * e_uv

    upper = mask_rr & (uu <= vv)
    degenerate = ~((f_a > 0) & (f_a < jnp.inf))
    bad = jnp.maximum(jnp.max(jnp.where((_finite(grad) & _finite(neglog)) | ~lane_r, 0, 1)),
                      jnp.max(jnp.max(jnp.where(_finite(hess) | ~upper, 0, 1), axis=1)))
    # the status code by int32 arithmetic on 0/1 flags: the Triton lowering of 0.11.2
    # gives a scalar where between int literals an i1 type (3 would be stored as 1)
    is_failed = (failed > 0).astype(jnp.int32)
    is_degenerate = degenerate.astype(jnp.int32)
    is_bad = (bad > 0).astype(jnp.int32)
    status = is_failed * RowStatus.CELL_FAILED + (1 - is_failed) * (
        is_degenerate * RowStatus.DEGENERATE_FA
        + (1 - is_degenerate) * is_bad * RowStatus.NON_FINITE_OUTPUT)
    nan_row = (failed > 0) | degenerate
    neglog_ref[row] = jnp.where(nan_row, jnp.nan, neglog)
    plt.store(grad_ref.at[row, u], jnp.where(nan_row, jnp.nan, grad), mask=lane_r)
    # the upper triangle goes to (u, v) and to (v, u): bitwise symmetric
    hess = jnp.where(nan_row, jnp.nan, hess)
    plt.store(hess_ref.at[row, uu, vv], hess, mask=upper)
    plt.store(hess_ref.at[row, vv, uu], hess, mask=mask_rr & (uu < vv))
    status_ref[row] = status.astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("interpret", "block_cells", "num_warps"))
def row_derivatives(cell_offsets, cell_c, cell_moments, cell_status, cell_jet, cell_jet_a,
                    cell_jet_b, mu_1, mu_2, e_obs, chi, xi, rho, tau, r_uv, y, w, *,
                    interpret: bool = False, block_cells: int = 4, num_warps: int | None = None):
    """Kernel twin of :func:`gpustat.reference.bms.row_derivatives` (one row per program).

    Defaults: ``block_cells = 4`` at 2 warps, the fastest of the configurations swept by
    ``benchmarks/bench_bms.py`` (Stage 2, n = 195k, r = 20, about 23 cells per row). For
    r > 32 (64-row tiles) 4 warps, which spill fewer registers than 2 in an sm_90 compile.

    Two per-item passes run in XLA around the kernel, each a few bytes per cell or row:
    the Hankel entries T_0..T_6 of every cell, and the probit factors of every row
    (``-w log Φ(m)``, ``-w s λ``, ``w C`` at ``m = s e_obs``, the reference's own
    numerics), so the kernel gathers each T once and does no transcendental math.
    """
    dtype = compute_dtype(mu_1.dtype)
    n, r = rho.shape
    if n == 0:  # no program to launch
        return (jnp.zeros((0,), dtype), jnp.zeros((0, r), dtype), jnp.zeros((0, r, r), dtype),
                jnp.zeros((0,), jnp.int32))
    if num_warps is None:
        num_warps = 2 if _dot_width(r) <= 32 else 4
    c, m = cell_c.astype(dtype), cell_moments.astype(dtype)
    hankel = jnp.pad(hankel_entries(c, m), ((0, 0), (0, 1)))      # T_0..T_6, padded to 8
    probit = probit_factors(e_obs.astype(dtype), y.astype(dtype), w.astype(dtype))
    rows = [x.astype(dtype) for x in (mu_1, mu_2, chi, xi, rho, tau, r_uv)]
    kernel = functools.partial(_row_derivatives_kernel, r=r, block_cells=block_cells)
    return tuple(pallas_call(
        kernel, interpret=interpret, num_warps=num_warps, grid=(n,),
        in_specs=[_ANY] * 17, out_specs=[_ANY] * 4,
        out_shape=[jax.ShapeDtypeStruct((n,), dtype), jax.ShapeDtypeStruct((n, r), dtype),
                   jax.ShapeDtypeStruct((n, r, r), dtype), jax.ShapeDtypeStruct((n,), jnp.int32)],
    )(cell_offsets.astype(jnp.int32), hankel, m, cell_status.astype(jnp.int32),
      *(x.astype(dtype) for x in (cell_jet, cell_jet_a, cell_jet_b)), *rows, *probit))


# ----------------------------------------------------------------------------- joint operators
#
# The HVP and the dense block stream the row Hessians once, as flat (block_rows, r*r)
# tiles: each row's r*r entries are contiguous in memory, so the tile load is coalesced
# (the only large read; rows 0/1 and columns 0/1 of H_i, re-read below, come from cache).
# The tile is added into a (block_rows, r*r) register accumulator, reduced over rows once
# per program: Σ_i H_i. Everything that depends on the designs X, G is small and goes
# through dots with K = block_rows (float64: Triton's m8n8k4 MMA; float32: IEEE FMA,
# precision HIGHEST, never TF32).


def _row_block(first_block, step, block_rows, n):
    """Rows of block ``first_block + step`` (program_id must be read outside loop bodies)."""
    rows = (first_block + step) * block_rows + jnp.arange(block_rows)
    return rows, rows < n


def _load_design(ref, rows, live, cols, width):
    return _load(ref, (rows[:, None], cols[None, :]), live[:, None] & (cols[None, :] < width))


def _hessian_tile(hess_ref, rows, live, r):
    """The block's row Hessians as a flat (block_rows, next_pow2(r*r)) tile, zero-padded."""
    k = jnp.arange(next_pow2(r * r))
    return _load(hess_ref, (rows[:, None], k[None, :]), live[:, None] & (k[None, :] < r * r))


def _hessian_line(hess_ref, rows, live, u, r, *, row=None, col=None):
    """Row ``row`` (H_i[row, u]) or column ``col`` (H_i[u, col]) of each row Hessian."""
    flat = row * r + u if col is None else u * r + col
    return _load(hess_ref, (rows[:, None], flat[None, :]), live[:, None] & (u[None, :] < r))


def _entry(line, u, j):
    """Entry j of each row of a (block_rows, width) tile, as a (block_rows, 1) column."""
    return jnp.sum(jnp.where(u[None, :] == j, line, 0.0), axis=1)[:, None]


def _joint_hvp_kernel(hess_ref, x_ref, g_ref, vmt_ref, vgt_ref, vrt_ref,
                      px_ref, pg_ref, pc_ref, ph_ref, *, n, r, p_m, p_g, block_rows, steps):
    # Per row, d_i = J_i v = (x_i·v_m, g_i·v_g, v_r) and t_i = H_i d_i. The output needs
    # Σ_i x_i t_i0, Σ_i g_i t_i1 (rows 0 and 1 of H_i) and Σ_i t_iu for u >= 2, which is
    # Σ_i (H_i[u, 0] d_i0 + H_i[u, 1] d_i1) + (Σ_i H_i)[u, :] v_r: the first part here
    # (columns 0, 1), the second on the host from the streamed sum of the Hessians.
    u = jnp.arange(_dot_width(r))
    jm = jnp.arange(vmt_ref.shape[0])
    jg = jnp.arange(vgt_ref.shape[0])
    vmt, vgt, vrt = vmt_ref[...], vgt_ref[...], vrt_ref[...]     # (width, MAX_RHS)
    first_block = pl.program_id(0) * steps

    def step(s, carry):
        acc_x, acc_g, acc_c, acc_h = carry
        rows, live = _row_block(first_block, s, block_rows, n)
        acc_h = acc_h + _hessian_tile(hess_ref, rows, live, r)
        x = _load_design(x_ref, rows, live, jm, p_m)
        g = _load_design(g_ref, rows, live, jg, p_g)
        d0 = _dot(x, vmt)                                          # (block_rows, MAX_RHS)
        d1 = _dot(g, vgt)
        h0 = _hessian_line(hess_ref, rows, live, u, r, row=0)
        h1 = _hessian_line(hess_ref, rows, live, u, r, row=1)
        t0 = _entry(h0, u, 0) * d0 + _entry(h0, u, 1) * d1 + _dot(h0, vrt)
        t1 = _entry(h1, u, 0) * d0 + _entry(h1, u, 1) * d1 + _dot(h1, vrt)
        c0 = _hessian_line(hess_ref, rows, live, u, r, col=0)
        c1 = _hessian_line(hess_ref, rows, live, u, r, col=1)
        return (acc_x + _dot_t(x, t0), acc_g + _dot_t(g, t1),
                acc_c + (_dot_t(c0, d0) + _dot_t(c1, d1)), acc_h)

    dtype = vmt_ref.dtype
    init = (jnp.zeros(px_ref.shape[1:], dtype), jnp.zeros(pg_ref.shape[1:], dtype),
            jnp.zeros(pc_ref.shape[1:], dtype),
            jnp.zeros((block_rows, ph_ref.shape[1]), dtype))
    acc_x, acc_g, acc_c, acc_h = jax.lax.fori_loop(0, steps, step, init)
    pid = pl.program_id(0)
    px_ref[pid, :, :] = acc_x
    pg_ref[pid, :, :] = acc_g
    pc_ref[pid, :, :] = acc_c
    ph_ref[pid, :] = jnp.sum(acc_h, axis=0)


def _grid(n, block_rows, target_programs):
    """(programs, steps): each program streams ``steps`` blocks of ``block_rows`` rows."""
    blocks = pl.cdiv(n, block_rows)
    steps = max(1, pl.cdiv(blocks, target_programs))
    return pl.cdiv(blocks, steps), steps


def _pad_to(v, shape):
    return jnp.pad(v, [(0, w - s) for s, w in zip(v.shape, shape)])


def _hessian_sum(ph, r):
    """Σ_i H_i from the programs' flat partial sums."""
    return ph.sum(0)[:r * r].reshape(r, r)


def _hdot(a, b):
    return jnp.dot(a, b, precision=jax.lax.Precision.HIGHEST)


@functools.partial(jax.jit, static_argnames=("interpret", "block_rows", "num_warps",
                                             "target_programs"))
def joint_hvp(hess, x, g, v, *, interpret: bool = False, block_rows: int = 16,
              num_warps: int = 4, target_programs: int = 528):
    """Kernel twin of :func:`gpustat.reference.bms.joint_hvp`: v (R, p_total) -> (R, p_total).

    Up to :data:`MAX_RHS` directions share one pass over the row Hessians (a launch
    always carries :data:`MAX_RHS`, zero-padded); more run in consecutive launches.
    Defaults: the fastest of the configurations swept by ``benchmarks/bench_bms.py`` (joint
    HVP, n = 195k, r = 20); 528 programs are four per SM of a 132-SM GPU.
    """
    if hess.shape[0] == 0:  # no rows: one zero row (masked loads aim at row 0) adds nothing
        hess, x, g = (nonempty(a) for a in (hess, x, g))
    dtype = compute_dtype(hess.dtype)
    if v.shape[0] == 0:  # no directions: no launch
        return jnp.zeros(v.shape, dtype)
    n, r, _ = hess.shape
    p_m, p_g = x.shape[1], g.shape[1]
    programs, steps = _grid(n, block_rows, target_programs)
    rp, pm, pg = _dot_width(r), _dot_width(p_m), _dot_width(p_g)
    hess = hess.astype(dtype).reshape(n, r * r)
    kernel = functools.partial(_joint_hvp_kernel, n=n, r=r, p_m=p_m, p_g=p_g,
                               block_rows=block_rows, steps=steps)
    call = pallas_call(
        kernel, interpret=interpret, num_warps=num_warps, grid=(programs,),
        in_specs=[_ANY] * 6, out_specs=[_ANY] * 4,
        out_shape=[jax.ShapeDtypeStruct((programs, pm, MAX_RHS), dtype),
                   jax.ShapeDtypeStruct((programs, pg, MAX_RHS), dtype),
                   jax.ShapeDtypeStruct((programs, rp, MAX_RHS), dtype),
                   jax.ShapeDtypeStruct((programs, next_pow2(r * r)), dtype)])
    outs = []
    for lo in range(0, v.shape[0], MAX_RHS):
        vb = _pad_to(v[lo:lo + MAX_RHS].astype(dtype), (MAX_RHS, v.shape[1]))
        # v_h, v_w shifted into the row coordinates 2..r-1 (rows 0, 1 of vr are zero)
        vr = jnp.pad(vb[:, p_m + p_g:], ((0, 0), (2, 0)))           # (MAX_RHS, r)
        px, pg_, pc, ph = call(hess, x.astype(dtype), g.astype(dtype),
                               _pad_to(vb[:, :p_m].T, (pm, MAX_RHS)),
                               _pad_to(vb[:, p_m:p_m + p_g].T, (pg, MAX_RHS)),
                               _pad_to(vr.T, (rp, MAX_RHS)))
        t_r = pc.sum(0)[2:r] + _hdot(_hessian_sum(ph, r)[2:], vr.T)
        out = jnp.concatenate([px.sum(0)[:p_m], pg_.sum(0)[:p_g], t_r], axis=0).T
        outs.append(out[:min(MAX_RHS, v.shape[0] - lo)])
    return jnp.concatenate(outs, axis=0)


def _joint_diagonal_kernel(hess_ref, x_ref, g_ref, px_ref, pg_ref, pr_ref, *, n, r, p_m, p_g,
                           block_rows, steps):
    u = jnp.arange(next_pow2(r))
    jm = jnp.arange(next_pow2(p_m))
    jg = jnp.arange(next_pow2(p_g))

    first_block = pl.program_id(0) * steps

    def step(s, carry):
        acc_x, acc_g, acc_r = carry
        rows, live = _row_block(first_block, s, block_rows, n)
        diag = _load(hess_ref, (rows[:, None], u[None, :], u[None, :]),
                     live[:, None] & (u[None, :] < r))
        x = _load_design(x_ref, rows, live, jm, p_m)
        g = _load_design(g_ref, rows, live, jg, p_g)
        h00 = jnp.sum(jnp.where(u[None, :] == 0, diag, 0.0), axis=1)
        h11 = jnp.sum(jnp.where(u[None, :] == 1, diag, 0.0), axis=1)
        return (acc_x + jnp.sum(h00[:, None] * x * x, axis=0),
                acc_g + jnp.sum(h11[:, None] * g * g, axis=0),
                acc_r + jnp.sum(diag, axis=0))

    dtype = px_ref.dtype
    acc_x, acc_g, acc_r = jax.lax.fori_loop(
        0, steps, step, (jnp.zeros(jm.shape, dtype), jnp.zeros(jg.shape, dtype),
                         jnp.zeros(u.shape, dtype)))
    pid = pl.program_id(0)
    px_ref[pid, :] = acc_x
    pg_ref[pid, :] = acc_g
    pr_ref[pid, :] = acc_r


@functools.partial(jax.jit, static_argnames=("interpret", "block_rows", "num_warps",
                                             "target_programs"))
def joint_diagonal(hess, x, g, *, interpret: bool = False, block_rows: int = 16,
                   num_warps: int = 4, target_programs: int = 1024):
    """Kernel twin of :func:`gpustat.reference.bms.joint_diagonal`."""
    if hess.shape[0] == 0:  # no rows: one zero row (masked loads aim at row 0) adds nothing
        hess, x, g = (nonempty(a) for a in (hess, x, g))
    dtype = compute_dtype(hess.dtype)
    n, r, _ = hess.shape
    p_m, p_g = x.shape[1], g.shape[1]
    programs, steps = _grid(n, block_rows, target_programs)
    kernel = functools.partial(_joint_diagonal_kernel, n=n, r=r, p_m=p_m, p_g=p_g,
                               block_rows=block_rows, steps=steps)
    px, pg, pr = pallas_call(
        kernel, interpret=interpret, num_warps=num_warps, grid=(programs,),
        in_specs=[_ANY] * 3, out_specs=[_ANY] * 3,
        out_shape=[jax.ShapeDtypeStruct((programs, next_pow2(p_m)), dtype),
                   jax.ShapeDtypeStruct((programs, next_pow2(p_g)), dtype),
                   jax.ShapeDtypeStruct((programs, next_pow2(r)), dtype)],
    )(hess.astype(dtype), x.astype(dtype), g.astype(dtype))
    return jnp.concatenate([px.sum(0)[:p_m], pg.sum(0)[:p_g], pr.sum(0)[2:r]])


def _joint_dense_kernel(hess_ref, x_ref, g_ref, zz_ref, zr_ref, rz_ref, ph_ref, *, n, r, p_m,
                        p_g, block_rows, steps):
    # z = (x, g) coordinates of a row in one vector: x at 0..p_m-1, g at p_m..p_m+p_g-1.
    # Blocks of J_iᵀ H_i J_i: zz = Σ_ab z_a H_ab z_bᵀ (a, b in {0, 1}), zr = Σ_a z_a H_i[a, :],
    # rz = Σ_b H_i[:, b] z_bᵀ, rr = H_i (streamed sum).
    u = jnp.arange(_dot_width(r))
    jz = jnp.arange(zz_ref.shape[1])
    first_block = pl.program_id(0) * steps

    def step(s, carry):
        zz, zr, rz, acc_h = carry
        rows, live = _row_block(first_block, s, block_rows, n)
        acc_h = acc_h + _hessian_tile(hess_ref, rows, live, r)
        xz = _load(x_ref, (rows[:, None], jz[None, :]), live[:, None] & (jz[None, :] < p_m))
        gz = _load(g_ref, (rows[:, None], jz[None, :] - p_m),
                   live[:, None] & (jz[None, :] >= p_m) & (jz[None, :] < p_m + p_g))
        h0 = _hessian_line(hess_ref, rows, live, u, r, row=0)
        h1 = _hessian_line(hess_ref, rows, live, u, r, row=1)
        c0 = _hessian_line(hess_ref, rows, live, u, r, col=0)
        c1 = _hessian_line(hess_ref, rows, live, u, r, col=1)
        p0 = _entry(h0, u, 0) * xz + _entry(h0, u, 1) * gz
        p1 = _entry(h1, u, 0) * xz + _entry(h1, u, 1) * gz
        return (zz + (_dot_t(xz, p0) + _dot_t(gz, p1)), zr + (_dot_t(xz, h0) + _dot_t(gz, h1)),
                rz + (_dot_t(c0, xz) + _dot_t(c1, gz)), acc_h)

    dtype = zz_ref.dtype
    init = (jnp.zeros(zz_ref.shape[1:], dtype), jnp.zeros(zr_ref.shape[1:], dtype),
            jnp.zeros(rz_ref.shape[1:], dtype), jnp.zeros((block_rows, ph_ref.shape[1]), dtype))
    zz, zr, rz, acc_h = jax.lax.fori_loop(0, steps, step, init)
    pid = pl.program_id(0)
    zz_ref[pid, :, :] = zz
    zr_ref[pid, :, :] = zr
    rz_ref[pid, :, :] = rz
    ph_ref[pid, :] = jnp.sum(acc_h, axis=0)


@functools.partial(jax.jit, static_argnames=("interpret", "block_rows", "num_warps",
                                             "target_programs"))
def joint_dense(hess, x, g, *, interpret: bool = False, block_rows: int = 16, num_warps: int = 4,
                target_programs: int = 1024):
    """Kernel twin of :func:`gpustat.reference.bms.joint_dense`: (p_total, p_total).

    Defaults: the fastest of the configurations swept by ``benchmarks/bench_bms.py`` (dense
    block, n = 195k, r = 20).
    """
    if hess.shape[0] == 0:  # no rows: one zero row (masked loads aim at row 0) adds nothing
        hess, x, g = (nonempty(a) for a in (hess, x, g))
    dtype = compute_dtype(hess.dtype)
    n, r, _ = hess.shape
    p_m, p_g = x.shape[1], g.shape[1]
    p_z = p_m + p_g
    programs, steps = _grid(n, block_rows, target_programs)
    rp, pz = _dot_width(r), _dot_width(p_z)
    kernel = functools.partial(_joint_dense_kernel, n=n, r=r, p_m=p_m, p_g=p_g,
                               block_rows=block_rows, steps=steps)
    zz, zr, rz, ph = pallas_call(
        kernel, interpret=interpret, num_warps=num_warps, grid=(programs,),
        in_specs=[_ANY] * 3, out_specs=[_ANY] * 4,
        out_shape=[jax.ShapeDtypeStruct((programs, pz, pz), dtype),
                   jax.ShapeDtypeStruct((programs, pz, rp), dtype),
                   jax.ShapeDtypeStruct((programs, rp, pz), dtype),
                   jax.ShapeDtypeStruct((programs, next_pow2(r * r)), dtype)],
    )(hess.astype(dtype).reshape(n, r * r), x.astype(dtype), g.astype(dtype))
    zz = zz.sum(0)[:p_z, :p_z]
    zr = zr.sum(0)[:p_z, 2:r]
    rz = rz.sum(0)[2:r, :p_z]
    rr = _hessian_sum(ph, r)[2:, 2:]
    return jnp.block([[zz, zr], [rz, rr]])


# ----------------------------------------------------------------------------- lowering cases
