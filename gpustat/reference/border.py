"""Reference batched border (arrow-Schur) Newton solves: the square-root Schur form per atom.

For atom ``a`` with rows ``i = 1..n_a`` (spec B.3), ``L_i L_i^T = H_tt^(i) + rho_t I``,
``u_i = L_i^{-1} g_t^(i)``, ``Y_i = L_i^{-1} H_tb^(i)``,

    S = H_bb + rho_b I - sum_i Y_i^T Y_i,      r = -g_b + sum_i Y_i^T u_i,
    L_S L_S^T = S,   delta_beta = S^{-1} r,   delta_t_i = -L_i^{-T} (u_i + Y_i delta_beta),
    log_det = sum_i log det(H_tt^(i) + rho_t I) + log det S,

which solves ``H delta = -g`` for the whole ridged bordered matrix (Schur determinant
identity for ``log_det``). Atoms are bucketed by padded size (rows and border to
powers of two) and each bucket is one ``vmap`` of the per-atom solve; padded rows
are identity blocks and padded border entries identity, so they change nothing.

Only the lower triangles of ``H_tt`` and ``H_bb`` are read (they are symmetric).
Per-atom ``status``: 0 ok, 1 a row block not positive definite (``row`` = first such
atom-local row, ``bump`` = Gershgorin ridge bump for ``ridge_t``), 2 the Schur
complement not positive definite (``bump`` for ``ridge_beta``), 3 non-finite input or
intermediate: an input entry, or (finite inputs, positive definite rows) an entry of
``S0 = H_bb - sum_i Y_i^T Y_i`` or of ``r``, or a row sum of ``|S0|``, that overflowed
(``bump`` 0 then). The first that applies, in the order 3 (input), 1, 3 (intermediate),
2, wins. A pivot fails when ``not (pivot > 0)``, which also catches NaN. Failed atoms get
NaN ``delta_t``, ``delta_beta`` and ``log_det``; other atoms are untouched.

The batch layout (:class:`BorderLayout`):
A batch of ``b`` atoms with ``n_a`` rows each (row dimension ``d`` for the batch, or
``d_a`` per atom) and border widths ``k_a`` is stored packed, with no padding (spec B.6):

* ``H_tt`` ``(N, d, d)`` and ``g_t`` ``(N, d)`` with ``N = sum_a n_a`` rows, atom ``a``
  owning rows ``row_offsets[a]:row_offsets[a + 1]``; with per-atom ``d_a`` both flat,
  ``(sum_a n_a d_a^2,)`` from ``tt_offsets[a]`` and ``(sum_a n_a d_a,)`` from
  ``gt_offsets[a]`` (a mixed-``d`` batch solves one group per distinct ``d``,
  :func:`solve_by_dim`);
* ``H_tb`` flat ``(sum_a n_a d_a k_a,)``: atom ``a``'s rows from ``cross_offsets[a]``, each
  row's ``d_a x k_a`` block row-major;
* ``H_bb`` flat ``(sum_a k_a^2,)`` from ``hbb_offsets[a]``, row-major ``k_a x k_a``;
* ``g_b`` flat ``(sum_a k_a,)`` from ``border_offsets[a]``.

The layout is static (numpy, hashable by content): kernels and the reference plan
their buckets from it at trace time, so a jitted solve is compiled once per layout
and reused across Newton iterations of the same colour class.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.linalg import solve_triangular

from gpustat._arrays import nonempty
from gpustat._checks import check_int

__all__ = [
    "MAX_BORDER",
    "STATUS_NONFINITE",
    "STATUS_OK",
    "STATUS_ROW_NOT_PD",
    "STATUS_SCHUR_NOT_PD",
    "BorderLayout",
    "accumulation_growth",
    "gershgorin_bounds",
    "gershgorin_ridge_bump",
    "row_bump",
    "schur_overflow",
    "solve_border_reference",
    "solve_by_dim",
    "symmetric_from_lower",
]

#: Largest border width k_a a batch may carry (the fused-kernel bound of the spec).
MAX_BORDER = 32


def _prefix(sizes: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]).astype(np.int64)


@dataclasses.dataclass(frozen=True, eq=False)
class BorderLayout:
    """Row counts ``n_rows`` ``(b,)``, border widths ``k_dims`` ``(b,)`` and row dimension ``d``.

    ``d`` is an integer >= 1 (uniform: ``H_tt`` packs as ``(N, d, d)`` and ``g_t`` as
    ``(N, d)``) or a ``(b,)`` integer array of per-atom row dimensions ``d_a >= 1`` (mixed:
    ``H_tt`` packs flat as ``(sum_a n_a d_a^2,)`` and ``g_t`` as ``(sum_a n_a d_a,)``, each
    row's ``d_a x d_a`` block row-major, atom ``a``'s from ``tt_offsets[a]`` and
    ``gt_offsets[a]``). Equality and hashing go by content, so two batches with the same
    structure share one compiled solve.
    """

    d: int | np.ndarray
    n_rows: np.ndarray
    k_dims: np.ndarray

    def __post_init__(self):
        for name in ("n_rows", "k_dims"):
            counts = np.asarray(getattr(self, name))
            if counts.size and not np.issubdtype(counts.dtype, np.integer):
                # a cast to int64 would truncate 2.7 rows to 2
                raise TypeError(f"BorderLayout: {name} must be integers, got {counts.dtype=}")
            object.__setattr__(self, name, counts.astype(np.int64))
        if self.n_rows.ndim != 1 or self.n_rows.shape != self.k_dims.shape:
            raise ValueError(f"BorderLayout: n_rows and k_dims must be (b,) arrays of one "
                             f"length, got {self.n_rows.shape} and {self.k_dims.shape}")
        if self.n_rows.size and min(self.n_rows.min(), self.k_dims.min()) < 0:
            raise ValueError("BorderLayout: n_rows and k_dims must be >= 0")
        if np.ndim(self.d) == 0:
            object.__setattr__(self, "d", check_int(self.d, "d", 1))
        else:
            dims = np.asarray(self.d)
            if dims.size and not np.issubdtype(dims.dtype, np.integer):
                raise TypeError(f"BorderLayout: per-atom d must be integers, got {dims.dtype=}")
            if dims.shape != self.n_rows.shape:
                raise ValueError(f"BorderLayout: per-atom d must have shape "
                                 f"{self.n_rows.shape}, got {dims.shape}")
            if dims.size and dims.min() < 1:
                raise ValueError(f"BorderLayout: per-atom d must be >= 1, got min {dims.min()}")
            dims = dims.astype(np.int64)
            dims.setflags(write=False)
            object.__setattr__(self, "d", dims)
        self.n_rows.setflags(write=False)
        self.k_dims.setflags(write=False)

    @functools.cached_property
    def _digest(self) -> bytes:
        h = hashlib.blake2b(digest_size=16)
        if self.uniform:
            h.update(np.int64(self.d).tobytes())
        else:
            h.update(b"mixed")
            h.update(self.d.tobytes())
        h.update(b"|")
        h.update(self.n_rows.tobytes())
        h.update(b"|")
        h.update(self.k_dims.tobytes())
        return h.digest()

    def __hash__(self) -> int:
        return hash(self._digest)

    def __eq__(self, other) -> bool:
        return isinstance(other, BorderLayout) and self._digest == other._digest

    def __repr__(self) -> str:
        d = self.d if self.uniform else f"{sorted(set(self.d.tolist()))} (mixed)"
        return (f"BorderLayout(atoms={self.num_atoms}, rows={self.num_rows}, d={d}, "
                f"max_rows={self.max_rows}, max_border={self.max_border})")

    @property
    def uniform(self) -> bool:
        """Whether ``d`` is one integer for the whole batch (``(N, d, d)`` packing)."""
        return isinstance(self.d, int)

    @functools.cached_property
    def row_dims(self) -> np.ndarray:
        """``(b,)`` row dimension of each atom."""
        return np.full(self.num_atoms, self.d, np.int64) if self.uniform else self.d

    @property
    def max_d(self) -> int:
        return int(self.row_dims.max(initial=0))

    @property
    def num_atoms(self) -> int:
        return int(self.n_rows.size)

    @property
    def num_rows(self) -> int:
        return int(self.n_rows.sum())

    @property
    def max_rows(self) -> int:
        return int(self.n_rows.max(initial=0))

    @property
    def max_border(self) -> int:
        return int(self.k_dims.max(initial=0))

    @functools.cached_property
    def row_offsets(self) -> np.ndarray:
        """``(b + 1,)`` first packed row of each atom."""
        return _prefix(self.n_rows)

    @functools.cached_property
    def tt_offsets(self) -> np.ndarray:
        """``(b + 1,)`` first flat ``H_tt`` entry of each atom."""
        return _prefix(self.n_rows * self.row_dims**2)

    @functools.cached_property
    def gt_offsets(self) -> np.ndarray:
        """``(b + 1,)`` first flat ``g_t`` / ``delta_t`` entry of each atom."""
        return _prefix(self.n_rows * self.row_dims)

    @functools.cached_property
    def cross_offsets(self) -> np.ndarray:
        """``(b + 1,)`` first flat ``H_tb`` entry of each atom."""
        return _prefix(self.n_rows * self.row_dims * self.k_dims)

    @functools.cached_property
    def hbb_offsets(self) -> np.ndarray:
        """``(b + 1,)`` first flat ``H_bb`` entry of each atom."""
        return _prefix(self.k_dims**2)

    @functools.cached_property
    def border_offsets(self) -> np.ndarray:
        """``(b + 1,)`` first flat ``g_b`` / ``delta_beta`` entry of each atom."""
        return _prefix(self.k_dims)

    def packed_sizes(self) -> dict[str, tuple[int, ...]]:
        """Expected shape of every packed array."""
        if self.uniform:
            tt, gt = (self.num_rows, self.d, self.d), (self.num_rows, self.d)
        else:
            tt, gt = (int(self.tt_offsets[-1]),), (int(self.gt_offsets[-1]),)
        return {
            "H_tt": tt,
            "H_tb": (int(self.cross_offsets[-1]),),
            "g_t": gt,
            "H_bb": (int(self.hbb_offsets[-1]),),
            "g_b": (int(self.border_offsets[-1]),),
        }

    def subset(self, atoms: np.ndarray) -> BorderLayout:
        """Layout of the atoms ``atoms`` (in that order); a mixed layout stays mixed."""
        atoms = np.asarray(atoms, dtype=np.int64)
        d = self.d if self.uniform else self.d[atoms]
        return BorderLayout(d, self.n_rows[atoms], self.k_dims[atoms])

    def dim_groups(self) -> list[tuple[int, np.ndarray]]:
        """``[(d, atoms)]``: the atoms of each distinct row dimension, ascending."""
        dims = self.row_dims
        return [(int(d), np.flatnonzero(dims == d)) for d in np.unique(dims)]

    def row_index(self, atoms: np.ndarray) -> np.ndarray:
        """Packed row indices of ``atoms``, concatenated in that order."""
        return _ranges(self.row_offsets, atoms)

    def tt_index(self, atoms: np.ndarray) -> np.ndarray:
        return _ranges(self.tt_offsets, atoms)

    def gt_index(self, atoms: np.ndarray) -> np.ndarray:
        return _ranges(self.gt_offsets, atoms)

    def step_index(self, atoms: np.ndarray) -> np.ndarray:
        """Indices of ``atoms`` along the first axis of ``g_t`` / ``delta_t`` (rows when
        uniform, flat entries when mixed)."""
        return self.row_index(atoms) if self.uniform else self.gt_index(atoms)

    def cross_index(self, atoms: np.ndarray) -> np.ndarray:
        return _ranges(self.cross_offsets, atoms)

    def hbb_index(self, atoms: np.ndarray) -> np.ndarray:
        return _ranges(self.hbb_offsets, atoms)

    def border_index(self, atoms: np.ndarray) -> np.ndarray:
        return _ranges(self.border_offsets, atoms)


def _ranges(offsets: np.ndarray, atoms: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(offsets[a], offsets[a + 1])`` over ``atoms``."""
    atoms = np.asarray(atoms, dtype=np.int64)
    starts = offsets[atoms]
    lengths = offsets[atoms + 1] - starts
    within = np.arange(int(lengths.sum())) - np.repeat(_prefix(lengths)[:-1], lengths)
    return np.repeat(starts, lengths) + within


# float32 contractions in full precision: XLA would run them as TF32 on NVIDIA GPUs.
_einsum = functools.partial(jnp.einsum, precision=jax.lax.Precision.HIGHEST)


STATUS_OK = 0
STATUS_ROW_NOT_PD = 1
STATUS_SCHUR_NOT_PD = 2
STATUS_NONFINITE = 3


def accumulation_growth(k, unit_roundoff):
    """Floating-point accumulation bound ``gamma_k = k u / (1 - k u)``."""
    return k * unit_roundoff / (1.0 - k * unit_roundoff)


def gershgorin_ridge_bump(gap, scale, radius, ridge, dim, unit_roundoff):
    """Ridge increase that makes ``A + (ridge + bump) I`` positive definite (spec B.5).

    From the unridged symmetric ``dim x dim`` block ``A``: ``gap = min_i (A_ii - sum_{j!=i}
    |A_ij|)``, ``scale = max(1, max_i |A_ii|)``, ``radius = max_i (|A_ii| + sum_{j!=i} |A_ij|)``.
    ``deficit = max(0, -(gap + ridge)) + gamma_{dim+1} (radius + |ridge|)`` and
    ``bump = deficit + rel U / (1 - rel)`` with ``U = scale + |ridge| + deficit`` and
    ``rel = c_d u (1 + gamma_2) + gamma_2``, ``c_d = dim``: the Cholesky completion band is
    read as ``dim`` unit roundoffs (a bare ``c_d = dim`` would make ``rel >= 1``). Always
    ``> 0``. Elementwise in every argument, so kernels use it on loaded values.
    """
    gamma_2 = accumulation_growth(2, unit_roundoff)
    deficit = jnp.maximum(0.0, -(gap + ridge)) + accumulation_growth(dim + 1, unit_roundoff) * (
        radius + jnp.abs(ridge))
    rel = dim * unit_roundoff * (1.0 + gamma_2) + gamma_2
    return deficit + rel * (scale + jnp.abs(ridge) + deficit) / (1.0 - rel)


def gershgorin_bounds(a, valid):
    """``(gap, scale, radius)`` of symmetric ``a`` ``(m, m)`` over entries ``valid`` ``(m,)``."""
    diag = jnp.diagonal(a)
    off = jnp.sum(jnp.abs(a) * valid[None, :], axis=1) - jnp.abs(diag)
    gap = jnp.min(jnp.where(valid, diag - off, jnp.inf))
    scale = jnp.maximum(1.0, jnp.max(jnp.where(valid, jnp.abs(diag), 0.0)))
    radius = jnp.max(jnp.where(valid, jnp.abs(diag) + off, 0.0))
    return gap, scale, radius


def schur_overflow(schur_bump, r, valid):
    """Whether ``S0`` or ``r`` came out non-finite: ``schur_bump`` (of
    :func:`gershgorin_ridge_bump` over ``S0``'s bounds, non-finite when an entry of its valid
    block is or a row sum overflows) or a ``valid`` entry of ``r`` ``(..., m)``."""
    return ~(jnp.isfinite(schur_bump) & jnp.all(jnp.isfinite(jnp.where(valid, r, 0.0)), axis=-1))


def symmetric_from_lower(a):
    """The symmetric matrix whose lower triangle is that of ``a`` ``(..., m, m)``."""
    lower = jnp.tril(a)
    return lower + jnp.swapaxes(jnp.tril(a, -1), -1, -2)


def _solve_atom(H_tt, H_tb, g_t, H_bb, g_b, n, k, ridge_t, ridge_beta):
    """One padded atom: ``H_tt`` (np, d, d), ``H_tb`` (np, d, kp), ``g_t`` (np, d),
    ``H_bb`` (kp, kp), ``g_b`` (kp,) with ``n`` real rows and ``k`` real border entries."""
    n_pad, d, _ = H_tt.shape
    k_pad = H_bb.shape[0]
    u = jnp.finfo(H_tt.dtype).eps / 2
    row_ok = jnp.arange(n_pad) < n
    col_ok = jnp.arange(k_pad) < k
    eye_d = jnp.eye(d, dtype=H_tt.dtype)

    # Masked inputs: padded rows are identity blocks with zero cross terms and gradient.
    A_rows = jnp.where(row_ok[:, None, None], symmetric_from_lower(H_tt), eye_d)
    B = jnp.where(row_ok[:, None, None] & col_ok[None, None, :], H_tb, 0.0)
    g = jnp.where(row_ok[:, None], g_t, 0.0)
    border_ok = col_ok[:, None] & col_ok[None, :]
    A_bb = jnp.where(border_ok, symmetric_from_lower(H_bb), 0.0)
    gb = jnp.where(col_ok, g_b, 0.0)
    finite = (jnp.all(jnp.isfinite(jnp.tril(A_rows))) & jnp.all(jnp.isfinite(B))
              & jnp.all(jnp.isfinite(g)) & jnp.all(jnp.isfinite(jnp.tril(A_bb)))
              & jnp.all(jnp.isfinite(gb)))

    # Steps 1-2: per-row Cholesky, u_i = L_i^{-1} g_i, Y_i = L_i^{-1} H_tb_i. LAPACK's potrf
    # rejects a pivot when not (pivot > 0) and the factor comes back NaN.
    ridged = A_rows + jnp.where(row_ok, ridge_t, 0.0)[:, None, None] * eye_d
    L = jax.lax.linalg.cholesky(ridged, symmetrize_input=False)
    row_bad = row_ok & ~jnp.all(jnp.isfinite(L), axis=(1, 2))
    first_bad = jnp.argmax(row_bad)
    Y = solve_triangular(L, B, lower=True)
    u_t = solve_triangular(L, g[..., None], lower=True)[..., 0]

    # Step 3: Schur complement (unridged S0 for the Gershgorin bump) and reduced RHS.
    S0 = A_bb - _einsum("irk,irl->kl", Y, Y)
    r = _einsum("irk,ir->k", Y, u_t) - gb
    S = S0 + jnp.diag(jnp.where(col_ok, ridge_beta, 1.0))

    # Steps 4-6: Schur Cholesky, delta_beta, back-substitution for delta_t.
    L_S = jax.lax.linalg.cholesky(S, symmetrize_input=False)
    schur_bad = ~jnp.all(jnp.isfinite(L_S))
    delta_beta = solve_triangular(L_S, solve_triangular(L_S, r, lower=True), lower=True,
                                  trans="T")
    w = u_t + _einsum("irk,k->ir", Y, delta_beta)
    delta_t = -solve_triangular(L, w[..., None], lower=True, trans="T")[..., 0]

    # Step 7: log det of the whole ridged bordered matrix, 2 sum log diag of the factors
    # (padded rows and border entries are identity: log 1 = 0).
    log_det = 2.0 * (jnp.sum(jnp.log(jnp.diagonal(L, axis1=1, axis2=2)))
                     + jnp.sum(jnp.log(jnp.diagonal(L_S))))

    # A failing row makes Y NaN, so S0 and r are checked only after the rows.
    schur_bump = gershgorin_ridge_bump(*gershgorin_bounds(S0, col_ok), ridge_beta, k, u)
    status = jnp.where(~finite, STATUS_NONFINITE,
                       jnp.where(jnp.any(row_bad), STATUS_ROW_NOT_PD,
                                 jnp.where(schur_overflow(schur_bump, r, col_ok),
                                           STATUS_NONFINITE,
                                           jnp.where(schur_bad, STATUS_SCHUR_NOT_PD,
                                                     STATUS_OK))))
    row_bump = gershgorin_ridge_bump(*gershgorin_bounds(A_rows[first_bad], jnp.ones(d, bool)),
                                     ridge_t, d, u)
    bump = jnp.where(status == STATUS_ROW_NOT_PD, row_bump,
                     jnp.where(status == STATUS_SCHUR_NOT_PD, schur_bump, 0.0))
    row = jnp.where(status == STATUS_ROW_NOT_PD, first_bad, -1)
    failed = status != STATUS_OK
    return (jnp.where(failed, jnp.nan, delta_t), jnp.where(failed, jnp.nan, delta_beta),
            jnp.where(failed, jnp.nan, log_det), status.astype(jnp.int32),
            row.astype(jnp.int32), bump)


def _next_pow2(n: np.ndarray) -> np.ndarray:
    return np.left_shift(1, np.ceil(np.log2(np.maximum(n, 1))).astype(np.int64))


def _bucket_indices(layout: BorderLayout, atoms: np.ndarray, n_pad: int, k_pad: int):
    """Packed indices of the padded per-atom tiles of ``atoms`` (out of range where padded).

    Built on the device from per-atom offsets, so only ``O(len(atoms))`` constants enter
    the compiled program.
    """
    d = layout.d
    per_atom = lambda x: jnp.asarray(x[atoms])  # noqa: E731
    n = per_atom(layout.n_rows)[:, None]
    k = per_atom(layout.k_dims)[:, None, None, None]
    i = jnp.arange(n_pad)[None, :]
    rows = jnp.where(i < n, per_atom(layout.row_offsets)[:, None] + i, layout.num_rows)
    r = jnp.arange(d)[None, None, :, None]
    c = jnp.arange(k_pad)[None, None, None, :]
    cross = (per_atom(layout.cross_offsets)[:, None, None, None]
             + (i[..., None, None] * d + r) * k + c)
    cross = jnp.where((i[..., None, None] < n[..., None, None]) & (c < k), cross,
                      int(layout.cross_offsets[-1]))
    kb = k[:, :, 0]
    a, b = jnp.arange(k_pad)[None, :, None], jnp.arange(k_pad)[None, None, :]
    hbb = jnp.where((a < kb) & (b < kb), per_atom(layout.hbb_offsets)[:, None, None] + a * kb + b,
                    int(layout.hbb_offsets[-1]))
    kv = kb[:, :, 0]
    ck = jnp.arange(k_pad)[None, :]
    border = jnp.where(ck < kv, per_atom(layout.border_offsets)[:, None] + ck,
                       int(layout.border_offsets[-1]))
    return rows, cross, hbb, border


def solve_by_dim(layout: BorderLayout, H_tt, H_tb, g_t, H_bb, g_b, ridge_t, ridge_beta, solve):
    """Solve a mixed-``d`` batch one row dimension at a time.

    ``solve(sub_layout, H_tt, H_tb, g_t, H_bb, g_b, ridge_t, ridge_beta)`` runs on the
    uniform sub-batch of every distinct ``d`` (``H_tt (N_d, d, d)``, ``g_t (N_d, d)``) and
    returns the six outputs of :func:`solve_border_reference`; they are put back in the
    packed order, ``delta_t`` flat ``(sum_a n_a d_a,)``.
    """
    H_tt, g_t = jnp.reshape(H_tt, -1), jnp.reshape(g_t, -1)
    parts, steps, borders, atom_order = [], [], [], []
    for d, atoms in layout.dim_groups():
        sub = BorderLayout(d, layout.n_rows[atoms], layout.k_dims[atoms])
        out = solve(sub, H_tt[layout.tt_index(atoms)].reshape(-1, d, d),
                    H_tb[layout.cross_index(atoms)], g_t[layout.gt_index(atoms)].reshape(-1, d),
                    H_bb[layout.hbb_index(atoms)], g_b[layout.border_index(atoms)],
                    ridge_t[atoms], ridge_beta[atoms])
        parts.append((out[0].reshape(-1), *out[1:]))
        steps.append(layout.gt_index(atoms))
        borders.append(layout.border_index(atoms))
        atom_order.append(atoms)
    if not parts:
        zeros = jnp.zeros(0, H_tt.dtype)
        empty = jnp.zeros(0, jnp.int32)
        return zeros, zeros, zeros, empty, empty, zeros
    inverse = [np.argsort(np.concatenate(order)) for order in (steps, borders)]
    inverse += [np.argsort(np.concatenate(atom_order))] * 4
    return tuple(jnp.concatenate(column)[inv] for column, inv in zip(zip(*parts), inverse))


@functools.partial(jax.jit, static_argnums=0)
def solve_border_reference(layout: BorderLayout, H_tt, H_tb, g_t, H_bb, g_b, ridge_t, ridge_beta):
    """Solve every atom of a packed batch (see :mod:`gpustat.reference.border` for the layout).

    Args:
        layout: the static batch layout (b atoms, N rows, row dimension d, uniform or
            per atom).
        H_tt: ``(N, d, d)`` row blocks (flat when ``d`` is per atom). H_tb: flat cross
            blocks. g_t: ``(N, d)`` (flat when ``d`` is per atom).
        H_bb: flat borders. g_b: flat border gradients.
        ridge_t, ridge_beta: ``(b,)`` per-atom ridges.

    Returns:
        ``delta_t (N, d)`` (flat ``(sum_a n_a d_a,)`` when ``d`` is per atom),
        ``delta_beta`` flat, ``log_det (b,)``, ``status (b,)`` int32, ``row (b,)`` int32,
        ``bump (b,)``.
    """
    if not layout.uniform:
        return solve_by_dim(layout, H_tt, H_tb, g_t, H_bb, g_b, ridge_t, ridge_beta,
                            solve_border_reference)
    dtype = H_tt.dtype
    d = layout.d
    delta_t = jnp.zeros((layout.num_rows, d), dtype)
    delta_beta = jnp.zeros((int(layout.border_offsets[-1]),), dtype)
    b = layout.num_atoms
    log_det = jnp.zeros((b,), dtype)
    status = jnp.zeros((b,), jnp.int32)
    row = jnp.zeros((b,), jnp.int32)
    bump = jnp.zeros((b,), dtype)
    n_pad_all = _next_pow2(layout.n_rows)
    k_pad_all = _next_pow2(layout.k_dims)
    for n_pad, k_pad in sorted(set(zip(n_pad_all.tolist(), k_pad_all.tolist()))):
        atoms = np.flatnonzero((n_pad_all == n_pad) & (k_pad_all == k_pad))
        rows, cross, hbb, border = _bucket_indices(layout, atoms, n_pad, k_pad)
        take = lambda x, idx: jnp.take(nonempty(x), idx, axis=0, mode="fill",  # noqa: E731
                                       fill_value=0)
        out = jax.vmap(_solve_atom)(
            take(H_tt, rows), take(H_tb, cross), take(g_t, rows), take(H_bb, hbb),
            take(g_b, border), layout.n_rows[atoms], layout.k_dims[atoms],
            ridge_t[atoms], ridge_beta[atoms])
        dt, db, ld, st, rw, bp = out
        delta_t = delta_t.at[rows].set(dt, mode="drop")
        delta_beta = delta_beta.at[border].set(db, mode="drop")
        log_det = log_det.at[atoms].set(ld)
        status = status.at[atoms].set(st)
        row = row.at[atoms].set(rw)
        bump = bump.at[atoms].set(bp)
    return delta_t, delta_beta, log_det, status, row, bump


def row_bump(h, ridge, d, unit_roundoff):
    """Gershgorin ridge bump of every row's unridged block ``h`` (spec B.5), ``(R,)``.

    ``h`` maps ``(p, q)``, ``q <= p``, to the rows' entries (the kernels' elementwise form)."""
    gap = scale = radius = None
    for p in range(d):
        diag = h[(p, p)]
        off = sum((jnp.abs(h[(max(p, q), min(p, q))]) for q in range(d) if q != p), start=0.0)
        row_gap, row_radius = diag - off, jnp.abs(diag) + off
        gap = row_gap if gap is None else jnp.minimum(gap, row_gap)
        scale = jnp.abs(diag) if scale is None else jnp.maximum(scale, jnp.abs(diag))
        radius = row_radius if radius is None else jnp.maximum(radius, row_radius)
    return gershgorin_ridge_bump(gap, jnp.maximum(scale, 1.0), radius, ridge, d, unit_roundoff)
