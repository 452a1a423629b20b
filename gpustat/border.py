"""Batched independent border (arrow-Schur) Newton solves.

Each atom ``a`` of a batch (one colour class of support-disjoint atoms in SAC
backfitting) is an independent bordered ("arrow") system of size ``n_a d + k_a``:

    H = [[blockdiag_i(H_tt^(i) + rho_t I_d),  [H_tb^(1); ...; H_tb^(n_a)]],
         [[H_tb^(1)^T ... H_tb^(n_a)^T],       H_bb + rho_b I_{k_a}      ]],
    g = [g_t^(1); ...; g_t^(n_a); g_b],

and the Newton step solves ``H delta = -g`` by the square-root Schur form
(``L_i L_i^T = H_tt^(i) + rho_t I``, ``Y_i = L_i^{-1} H_tb^(i)``,
``S = H_bb + rho_b I - sum_i Y_i^T Y_i``), also returning
``log_det = log det H`` of the whole ridged bordered matrix (Schur determinant
identity; Golub & Van Loan, *Matrix Computations*, 4th ed., sec. 4.2 and 3.2.10).
Failures are reported per atom (``status``, ``row``, ``bump``), never by failing the
batch; :func:`retry_failed` re-solves only the failed atoms with their bumped ridges.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from gpustat._arrays import compute_dtype
from gpustat._backend import border_shape_class, resolve_backend
from gpustat._checks import as_array, check_float64_enabled, check_int
from gpustat.reference.border import (
    MAX_BORDER,
    STATUS_NONFINITE,
    STATUS_OK,
    STATUS_ROW_NOT_PD,
    STATUS_SCHUR_NOT_PD,
    BorderLayout,
    gershgorin_bounds,
    gershgorin_ridge_bump,
    solve_border_reference,
    solve_by_dim,
    symmetric_from_lower,
)

__all__ = [
    "STATUS_NONFINITE",
    "STATUS_OK",
    "STATUS_ROW_NOT_PD",
    "STATUS_SCHUR_NOT_PD",
    "BorderBatch",
    "BorderLayout",
    "BorderSolution",
    "retry_failed",
    "solve_batched_border",
]

_INDEX_LIMIT = 2**31 - 2  # kernels index packed arrays (plus one spare slot) in int32


def _check_real(name: str, x) -> jax.Array:
    check_float64_enabled(name, x)
    x = as_array(x, name)
    if jnp.issubdtype(x.dtype, jnp.complexfloating) or x.dtype == jnp.bool_:
        raise TypeError(f"{name} must be a real floating (or integer) array, got {x.dtype=}")
    if not jnp.issubdtype(x.dtype, jnp.floating):
        x = x.astype(jnp.result_type(float))
    return x


def _atom_index(a, b: int) -> int:
    """Atom ``a`` of ``b`` as an index in ``[0, b)``; negative ``a`` counts from the end."""
    a = operator.index(a)
    if not -b <= a < b:
        raise IndexError(f"atom index {a} out of range for {b} atoms")
    return a % b


def _atom_indices(atoms, b: int) -> np.ndarray:
    """:func:`_atom_index` of every entry of the 1-D integer sequence ``atoms``."""
    atoms = np.asarray(atoms)
    if atoms.ndim != 1 or not (atoms.size == 0 or np.issubdtype(atoms.dtype, np.integer)):
        raise TypeError(f"atoms must be a 1-D integer sequence, got {atoms.dtype=}, "
                        f"{atoms.shape=}")
    outside = (atoms < -b) | (atoms >= b)
    if np.any(outside):
        raise IndexError(f"atom index {atoms[outside][0]} out of range for {b} atoms")
    return atoms.astype(np.int64) % max(b, 1)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class BorderBatch:
    """A packed batch of ``b`` border systems (CSR over atoms, no padding).

    With ``N = sum_a n_a`` rows, row dimension ``d`` (uniform, or ``d_a`` per atom) and
    border widths ``k_a``:

    Attributes:
        H_tt: ``(N, d, d)`` symmetric row blocks (lower triangle read), atom ``a``'s rows
            at ``layout.row_offsets[a]:layout.row_offsets[a + 1]``; with per-atom ``d_a``
            flat ``(sum_a n_a d_a^2,)``, each row's block row-major, atom ``a``'s from
            ``layout.tt_offsets[a]``.
        H_tb: ``(sum_a n_a d_a k_a,)`` cross blocks, each row's ``d_a x k_a`` block
            row-major.
        g_t: ``(N, d)`` row gradients; with per-atom ``d_a`` flat ``(sum_a n_a d_a,)``
            from ``layout.gt_offsets[a]``.
        H_bb: ``(sum_a k_a^2,)`` symmetric borders, row-major (lower triangle read).
        g_b: ``(sum_a k_a,)`` border gradients.
        layout: the static :class:`~gpustat.reference.border.BorderLayout` (row counts
            ``n_rows (b,)``, border widths ``k_dims (b,)``, ``d``, offsets).

    All arrays share one floating dtype. The batch is a pytree whose layout is static,
    so ``jax.jit`` compiles one solve per layout and reuses it across Newton steps.
    """

    H_tt: Float[Array, "n d d"]
    H_tb: Float[Array, " c"]
    g_t: Float[Array, "n d"]
    H_bb: Float[Array, " q"]
    g_b: Float[Array, " s"]
    layout: BorderLayout = dataclasses.field(metadata={"static": True})

    @classmethod
    def from_atoms(cls, H_tt: Sequence, H_tb: Sequence, g_t: Sequence, H_bb: Sequence,
                   g_b: Sequence, *, d: int | None = None) -> BorderBatch:
        """Pack per-atom arrays (host-side; not traceable, the shapes define the layout).

        Args:
            H_tt: ``b`` arrays ``(n_a, d_a, d_a)``.
            H_tb: ``b`` arrays ``(n_a, d_a, k_a)``.
            g_t: ``b`` arrays ``(n_a, d_a)``.
            H_bb: ``b`` arrays ``(k_a, k_a)``, ``0 <= k_a <= 32``.
            g_b: ``b`` arrays ``(k_a,)``.
            d: row dimension, an integer >= 1; needed only for an empty batch (default 1
                then), else every atom's ``d_a`` must equal it.

        Returns:
            The packed batch, in the common floating dtype of the inputs (integers
            promote to the default float dtype). Its layout has one integer ``d`` when
            every ``d_a`` is equal, else per-atom ``d_a`` (flat ``H_tt`` and ``g_t``).

        Raises:
            ValueError: lists of different lengths, mismatched shapes, ``d_a != d``,
                ``d`` not an integer >= 1, ``k_a > 32``.
            TypeError: complex or boolean arrays, or float64 arrays while
                ``jax_enable_x64`` is off (they would be rounded to float32).
        """
        if d is not None:
            d = check_int(d, "d", 1)
        lists = {"H_tt": H_tt, "H_tb": H_tb, "g_t": g_t, "H_bb": H_bb, "g_b": g_b}
        lengths = {name: len(v) for name, v in lists.items()}
        if len(set(lengths.values())) != 1:
            raise ValueError(f"from_atoms: the five lists must have one length per atom, "
                             f"got {lengths}")
        atoms = [{name: _check_real(f"{name}[{a}]", v[a]) for name, v in lists.items()}
                 for a in range(lengths["H_tt"])]
        if not atoms:
            layout = BorderLayout(1 if d is None else d, np.zeros(0), np.zeros(0))
            dtype = jnp.result_type(float)
            return cls(*(jnp.zeros(s, dtype) for s in layout.packed_sizes().values()), layout)
        row_dims, n_rows, k_dims = [], [], []
        for a, atom in enumerate(atoms):
            row_dims.append(_row_dim(a, atom["H_tt"], d))
            n_a, k_a = _atom_sizes(a, atom, row_dims[-1])
            n_rows.append(n_a)
            k_dims.append(k_a)
        dtype = jnp.result_type(*(x.dtype for atom in atoms for x in atom.values()))
        uniform = len(set(row_dims)) == 1
        layout = BorderLayout(row_dims[0] if uniform else np.array(row_dims), np.array(n_rows),
                              np.array(k_dims))

        def pack(name, flat):
            parts = [atom[name].astype(dtype) for atom in atoms]
            flat = flat or not uniform
            return jnp.concatenate([p.reshape(-1) if flat else p for p in parts], axis=0)

        return cls.from_packed(layout, pack("H_tt", False), pack("H_tb", True),
                               pack("g_t", False), pack("H_bb", True), pack("g_b", True))

    @classmethod
    def from_packed(cls, layout: BorderLayout, H_tt, H_tb, g_t, H_bb, g_b) -> BorderBatch:
        """Wrap already packed arrays (shapes checked against ``layout``)."""
        if not isinstance(layout, BorderLayout):
            raise TypeError(f"layout must be a BorderLayout, got {type(layout).__name__}")
        if layout.max_border > MAX_BORDER:
            raise ValueError(f"border widths must be <= {MAX_BORDER}, got "
                             f"max k_a={layout.max_border}")
        arrays = {name: _check_real(name, x) for name, x in
                  (("H_tt", H_tt), ("H_tb", H_tb), ("g_t", g_t), ("H_bb", H_bb), ("g_b", g_b))}
        _check_packed_shapes(layout, arrays)
        for name, expected in layout.packed_sizes().items():
            if int(np.prod(expected)) > _INDEX_LIMIT:
                raise ValueError(f"{name}: {arrays[name].size} entries exceed the int32 index "
                                 f"limit")
        dtypes = {a.dtype for a in arrays.values()}
        if len(dtypes) != 1:
            raise TypeError(f"all packed arrays must share one dtype, got {dtypes}")
        return cls(**arrays, layout=layout)

    @property
    def num_atoms(self) -> int:
        return self.layout.num_atoms

    def atom(self, a: int) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array]:
        """Atom ``a``'s ``(H_tt (n_a, d_a, d_a), H_tb (n_a, d_a, k_a), g_t (n_a, d_a),
        H_bb (k_a, k_a), g_b (k_a,))``; a negative ``a`` counts from the end, as in a
        Python list.

        Raises:
            IndexError: ``a`` outside ``[-b, b)``.
        """
        lay = self.layout
        a = _atom_index(a, lay.num_atoms)
        n, k, d = int(lay.n_rows[a]), int(lay.k_dims[a]), int(lay.row_dims[a])
        t0, s0 = int(lay.tt_offsets[a]), int(lay.gt_offsets[a])
        c0, h0, b0 = int(lay.cross_offsets[a]), int(lay.hbb_offsets[a]), int(lay.border_offsets[a])
        return (self.H_tt.reshape(-1)[t0:t0 + n * d * d].reshape(n, d, d),
                self.H_tb[c0:c0 + n * d * k].reshape(n, d, k),
                self.g_t.reshape(-1)[s0:s0 + n * d].reshape(n, d),
                self.H_bb[h0:h0 + k * k].reshape(k, k), self.g_b[b0:b0 + k])

    def subset(self, atoms) -> BorderBatch:
        """The batch of atoms ``atoms`` (host-side 1-D integer sequence; negative indices
        count from the end), in that order.

        Raises:
            IndexError: an index outside ``[-b, b)``.
            TypeError: ``atoms`` not a 1-D integer sequence.
        """
        atoms = _atom_indices(atoms, self.num_atoms)
        lay = self.layout
        rows = lay.row_index(atoms) if lay.uniform else lay.tt_index(atoms)
        return BorderBatch(self.H_tt[rows], self.H_tb[lay.cross_index(atoms)],
                           self.g_t[lay.step_index(atoms)], self.H_bb[lay.hbb_index(atoms)],
                           self.g_b[lay.border_index(atoms)], lay.subset(atoms))


def _row_dim(a: int, H_tt, d: int | None) -> int:
    """Atom ``a``'s row dimension, from its ``H_tt`` ``(n_a, d_a, d_a)`` (checked against
    the ``d`` argument when given)."""
    if H_tt.ndim != 3 or H_tt.shape[1] != H_tt.shape[2]:
        raise ValueError(f"H_tt[{a}]: expected (n_a, d, d), got {H_tt.ndim}-D {H_tt.shape=}")
    row_dim = H_tt.shape[2]
    if row_dim < 1:
        raise ValueError(f"H_tt[{a}]: the row dimension d must be >= 1, got {H_tt.shape=}")
    if d is not None and row_dim != d:
        raise ValueError(f"from_atoms: {d=} but H_tt[{a}] has d={row_dim}")
    return row_dim


def _atom_sizes(a: int, atom: dict, d: int) -> tuple[int, int]:
    """Validate one atom's shapes; return ``(n_a, k_a)``."""
    H_tt, H_tb, g_t, H_bb, g_b = (atom[n] for n in ("H_tt", "H_tb", "g_t", "H_bb", "g_b"))
    n = H_tt.shape[0]
    if H_bb.ndim != 2 or H_bb.shape[0] != H_bb.shape[1]:
        raise ValueError(f"H_bb[{a}]: expected a square (k_a, k_a), got {H_bb.shape=}")
    k = H_bb.shape[0]
    if k > MAX_BORDER:
        raise ValueError(f"H_bb[{a}]: border width k_a must be <= {MAX_BORDER}, got {k=}")
    expected = {"H_tb": (n, d, k), "g_t": (n, d), "g_b": (k,)}
    for name, x in (("H_tb", H_tb), ("g_t", g_t), ("g_b", g_b)):
        if x.shape != expected[name]:
            raise ValueError(f"{name}[{a}]: expected {expected[name]} (n_a={n}, d={d}, "
                             f"k_a={k}), got {x.shape=}")
    return n, k


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class BorderSolution:
    """Per-atom Newton steps ``H delta = -g`` of a :class:`BorderBatch`.

    Attributes:
        delta_t: ``(N, d)`` packed row steps (NaN rows for failed atoms); with per-atom
            ``d_a`` flat ``(sum_a n_a d_a,)``, atom ``a``'s from ``layout.gt_offsets[a]``.
        delta_beta: ``(sum_a k_a,)`` packed border steps (NaN for failed atoms).
        log_det: ``(b,)`` natural log-determinant of each whole ridged bordered matrix.
        status: ``(b,)`` int32: 0 ok, 1 a row block not positive definite, 2 the Schur
            complement not positive definite, 3 non-finite input or intermediate (finite
            inputs whose unridged Schur complement, a row sum of its absolute values, or
            reduced right-hand side overflowed).
        row: ``(b,)`` int32 first failing atom-local row for status 1, else -1.
        bump: ``(b,)`` suggested ridge increase: for ``ridge_t`` when status 1 (that of
            row ``row``: a later row may need more, which :func:`retry_failed` adds), for
            ``ridge_beta`` when status 2 (Gershgorin rule of spec B.5), else 0.
        layout: the batch's static layout.
    """

    delta_t: Float[Array, "n d"]
    delta_beta: Float[Array, " s"]
    log_det: Float[Array, " b"]
    status: Int[Array, " b"]
    row: Int[Array, " b"]
    bump: Float[Array, " b"]
    layout: BorderLayout = dataclasses.field(metadata={"static": True})

    def atom(self, a: int) -> tuple[jax.Array, jax.Array]:
        """Atom ``a``'s ``(delta_t (n_a, d_a), delta_beta (k_a,))``; a negative ``a``
        counts from the end, as in a Python list.

        Raises:
            IndexError: ``a`` outside ``[-b, b)``.
        """
        lay = self.layout
        a = _atom_index(a, lay.num_atoms)
        n, d = int(lay.n_rows[a]), int(lay.row_dims[a])
        s0, b0 = int(lay.gt_offsets[a]), int(lay.border_offsets[a])
        return (self.delta_t.reshape(-1)[s0:s0 + n * d].reshape(n, d),
                self.delta_beta[b0:b0 + int(lay.k_dims[a])])


def _atom_ridges(name: str, ridge, b: int, dtype) -> jax.Array:
    """Scalar or ``(b,)`` ridge as ``(b,)`` in ``dtype``; concrete values must be finite (also
    in ``dtype``: 1e39 overflows float32) and >= 0."""
    try:
        ridge = jnp.asarray(ridge)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{name} must be a real scalar or ({b},) array, got {ridge!r}") from e
    if ridge.ndim not in (0, 1) or (ridge.ndim == 1 and ridge.shape != (b,)):
        raise ValueError(f"{name} must be a scalar or shape ({b},), got {ridge.shape=}")
    if jnp.issubdtype(ridge.dtype, jnp.complexfloating) or ridge.dtype == jnp.bool_:
        raise TypeError(f"{name} must be real, got {ridge.dtype=}")
    if not isinstance(ridge, jax.core.Tracer):
        values = np.asarray(ridge, dtype=np.float64)
        finite = np.isfinite(values) & np.isfinite(np.asarray(ridge.astype(dtype)))
        if not np.all(finite & (values >= 0)):
            raise ValueError(f"{name} must be finite and >= 0 in {jnp.dtype(dtype).name}, got "
                             f"min {values.min(initial=0)}, max {values.max(initial=0)} "
                             f"(non-finite: {int(np.sum(~finite))})")
    return jnp.broadcast_to(ridge.astype(dtype), (b,))


def solve_batched_border(batch: BorderBatch, ridge_t, ridge_beta, *,
                         backend: str = "auto") -> BorderSolution:
    """Solve ``H delta = -g`` for every atom of ``batch`` and report per-atom status.

    Args:
        batch: the packed systems (``b`` atoms, ``N`` rows, row dimension ``d``, uniform
            or per atom: a batch of mixed ``d`` solves one launch group per distinct ``d``,
            each on the path ``backend`` picks for it).
        ridge_t: ``rho_t >= 0`` added to every row block's diagonal: a scalar (class-uniform,
            the usual case) or ``(b,)`` per atom (what :func:`retry_failed` uses).
        ridge_beta: ``rho_b >= 0`` added to every border's diagonal, scalar or ``(b,)``.
        backend: ``"auto"`` (a kernel on a CUDA GPU: for ``d <= 8`` the fused Triton
            kernel where jax-triton is installed (``gpustat._backend.AUTO_RULES``),
            else the Pallas one, which also takes ``8 < d <= 32``; the reference
            elsewhere), ``"pallas"`` (``d <= 32``), ``"triton"`` (``d <= 8``),
            ``"interpret"`` or ``"reference"``.

    Returns:
        A :class:`BorderSolution`, in the common dtype of the batch's arrays: float64
        inputs solve in float64; float32 and 16-bit inputs solve in float32.

    Raises:
        ValueError: ridges of the wrong shape, negative or non-finite (value checks run
            on concrete ridges only; traced ridges under ``jax.jit`` are not checked), a
            packed array of ``batch`` whose shape disagrees with its layout, or a kernel
            backend asked for a ``d`` it does not take (Pallas ``d > 32``, Triton
            ``d > 8``).
        TypeError: ``batch`` not a :class:`BorderBatch`, or complex, boolean or
            non-numeric ridges.

    Works under ``jax.jit`` (the batch's layout is static) and ``jax.vmap`` (over the
    batch's arrays or the ridges).
    """
    arrays = _check_batch(batch)
    layout = batch.layout
    dtype = compute_dtype(jnp.result_type(*arrays))
    b = layout.num_atoms
    rt = _atom_ridges("ridge_t", ridge_t, b, dtype)
    rb = _atom_ridges("ridge_beta", ridge_beta, b, dtype)
    arrays = tuple(x.astype(dtype) for x in arrays)
    solve = functools.partial(_solve_uniform, backend=backend)
    if b == 0:
        _resolve(layout, dtype, backend)  # the backend name is still checked
        out = (arrays[2], arrays[4], jnp.zeros(0, dtype), jnp.zeros(0, jnp.int32),
               jnp.zeros(0, jnp.int32), jnp.zeros(0, dtype))
    elif layout.uniform:
        out = solve(layout, *arrays, rt, rb)
    else:
        for _, atoms in layout.dim_groups():  # resolve every group before any work
            _resolve(layout.subset(atoms), dtype, backend)
        out = solve_by_dim(layout, *arrays, rt, rb, solve)
    return BorderSolution(*out, layout=layout)


def _resolve(layout: BorderLayout, dtype, backend: str) -> str:
    """The path that solves ``layout``'s atoms (all of one ``d`` when it has atoms)."""
    from gpustat.pallas.border import MAX_KERNEL_D, MAX_UNROLLED_D

    d = layout.max_d
    # The fused Triton kernel unrolls the row factorisation like the Pallas kernel's
    # small-d form; the Pallas kernel loops over the row for larger d.
    limit = MAX_UNROLLED_D if backend == "triton" else MAX_KERNEL_D
    return resolve_backend(backend, op="solve_batched_border", capability="border",
                           shape_class=border_shape_class(dtype, layout.max_border, d),
                           kernels=("pallas", "triton"), kernel_supports=d <= limit,
                           unsupported_reason=f"the {backend} kernel takes d <= {limit}, "
                                              f"got d={d}")


def _solve_uniform(layout: BorderLayout, H_tt, H_tb, g_t, H_bb, g_b, rt, rb, *, backend: str):
    """The six solution arrays of a non-empty batch of one ``d`` on ``backend``'s path."""
    from gpustat.pallas.border import solve_border_pallas

    path = _resolve(layout, H_tt.dtype, backend)
    arrays = (H_tt, H_tb, g_t, H_bb, g_b)
    if path == "reference":
        return solve_border_reference(layout, *arrays, rt, rb)
    if path == "triton":
        from gpustat.triton.border import solve_border_triton

        return solve_border_triton(layout, *arrays, rt, rb)
    return solve_border_pallas(layout, *arrays, rt, rb, interpret=path == "interpret")


def _check_batch(batch) -> tuple:
    """``batch``'s five packed arrays, checked against its layout: a batch built with the
    constructor or ``dataclasses.replace`` skips :meth:`BorderBatch.from_packed`, and the
    solves gather out-of-range entries as zeros."""
    if not isinstance(batch, BorderBatch):
        raise TypeError(f"batch must be a BorderBatch, got {type(batch).__name__}")
    arrays = {name: getattr(batch, name) for name in ("H_tt", "H_tb", "g_t", "H_bb", "g_b")}
    _check_packed_shapes(batch.layout, arrays, prefix="batch.")
    return tuple(arrays.values())


def _check_packed_shapes(layout: BorderLayout, arrays: dict, prefix: str = "") -> None:
    """``ValueError`` naming the first of the packed ``arrays`` (by name) whose shape is
    not the one ``layout`` expects."""
    for name, expected in layout.packed_sizes().items():
        shape = jnp.shape(arrays[name])
        if shape != expected:
            raise ValueError(f"{prefix}{name}: expected shape {expected} for {layout}, "
                             f"got {shape}")


def _failing_rows_bump(batch: BorderBatch, atoms: np.ndarray, ridge_t: np.ndarray):
    """Largest spec-B.5 bump over the rows of each atom ``atoms`` that are not positive
    definite at its ``ridge_t`` (``(len(atoms),)``, host-side). The solution's ``bump``
    covers only the first failing row, but the ridge is shared by all of an atom's rows."""
    out = np.zeros(atoms.size)
    for d, group in batch.layout.subset(atoms).dim_groups():
        sub = batch.subset(atoms[group])
        n_rows = sub.layout.n_rows
        blocks = symmetric_from_lower(
            sub.H_tt.reshape(-1, d, d).astype(compute_dtype(sub.H_tt.dtype)))
        ridge = jnp.asarray(np.repeat(ridge_t[group], n_rows), blocks.dtype)
        factor = jax.lax.linalg.cholesky(
            blocks + ridge[:, None, None] * jnp.eye(d, dtype=blocks.dtype), symmetrize_input=False)
        failing = ~jnp.all(jnp.isfinite(factor), axis=(1, 2))
        bounds = jax.vmap(gershgorin_bounds, in_axes=(0, None))(blocks, jnp.ones(d, bool))
        bumps = gershgorin_ridge_bump(*bounds, ridge, d, float(jnp.finfo(blocks.dtype).eps) / 2)
        owner = np.repeat(np.arange(group.size), n_rows)
        out[group] = np.asarray(jax.ops.segment_max(jnp.where(failing, bumps, 0.0), owner,
                                                    num_segments=group.size))
    return out


def retry_failed(batch: BorderBatch, solution: BorderSolution, ridge_t, ridge_beta, *,
                 max_rounds: int = 4, backend: str = "auto"):
    """Re-solve only the atoms with status 1 or 2, each with its bumped ridge, until all pass.

    Status 1 atoms retry with ``ridge_t`` plus the largest bump over all their failing rows
    (the solution's ``bump`` covers only the first, ``row``, but ``ridge_t`` is shared by the
    atom's rows), status 2 atoms with ``ridge_beta + bump``;
    a retry can fail again (e.g. a row fixed by a minimal bump leaves an indefinite Schur
    complement), so this repeats up to ``max_rounds`` times. Status 3 (non-finite input or
    intermediate) is not retried, nor is an atom whose bump is not finite (its ridge would
    be): it keeps its failed status. Host-side (eager): which atoms failed decides the
    sub-batch shapes.

    The bump is the minimal one of spec B.5: it leaves a failing row block barely positive
    definite (smallest eigenvalue a few ``u`` times its scale), so that row's whitened
    cross terms ``Y_i`` grow like ``u^{-1/2}`` and the next round's Schur bump raises
    ``ridge_beta`` by ~1e13-1e14 in float64 (2e13 to 3e14 for the tests' ``-I`` and
    ``-2 I`` rows). The retried system is then numerically singular (condition ~1e29)
    and its largest row step ~1e15. To avoid this, re-solve such atoms yourself with a
    larger ridge than the bump, e.g. ``ridge_t + 2 * bump`` (those rows then solve with
    ``ridge_beta = 0``), or with a ridge on the problem's own scale.

    Args:
        batch: the batch that was solved.
        solution: its solution.
        ridge_t: the row ridge it was solved with (scalar or ``(b,)``).
        ridge_beta: the border ridge it was solved with (scalar or ``(b,)``).
        max_rounds: most re-solves.
        backend: as in :func:`solve_batched_border`.

    Returns:
        ``(solution, ridge_t (b,), ridge_beta (b,))``: the merged solution (untouched
        atoms keep their results bit for bit) and the per-atom ridges finally used.

    Raises:
        ValueError: ``solution`` is not of ``batch`` (another layout), or bad ridges or
            batch arrays as in :func:`solve_batched_border`.
        TypeError: ``batch`` or ``solution`` of the wrong type.
    """
    if not isinstance(solution, BorderSolution):
        raise TypeError(f"solution must be a BorderSolution, got {type(solution).__name__}")
    _check_batch(batch)
    if solution.layout != batch.layout:
        raise ValueError(f"solution is not a solution of batch: their layouts (d and every "
                         f"atom's n_a, k_a) differ, solution: {solution.layout}, batch: "
                         f"{batch.layout}")
    dtype = solution.log_det.dtype
    b = batch.num_atoms
    rt = np.array(_atom_ridges("ridge_t", ridge_t, b, dtype))
    rb = np.array(_atom_ridges("ridge_beta", ridge_beta, b, dtype))
    lay = batch.layout
    for _ in range(check_int(max_rounds, "max_rounds", 0)):
        status = np.asarray(solution.status)
        bump = np.array(solution.bump)
        rows_failed = np.flatnonzero(status == STATUS_ROW_NOT_PD)
        if rows_failed.size:
            bump[rows_failed] = np.maximum(bump[rows_failed],
                                           _failing_rows_bump(batch, rows_failed, rt[rows_failed]))
        failed = np.flatnonzero(((status == STATUS_ROW_NOT_PD) | (status == STATUS_SCHUR_NOT_PD))
                                & np.isfinite(bump))
        if failed.size == 0:
            break
        bump = bump[failed]
        rt[failed] += np.where(status[failed] == STATUS_ROW_NOT_PD, bump, 0.0)
        rb[failed] += np.where(status[failed] == STATUS_SCHUR_NOT_PD, bump, 0.0)
        sub = solve_batched_border(batch.subset(failed), rt[failed], rb[failed], backend=backend)
        solution = BorderSolution(
            solution.delta_t.at[lay.step_index(failed)].set(sub.delta_t),
            solution.delta_beta.at[lay.border_index(failed)].set(sub.delta_beta),
            solution.log_det.at[failed].set(sub.log_det),
            solution.status.at[failed].set(sub.status),
            solution.row.at[failed].set(sub.row),
            solution.bump.at[failed].set(sub.bump), layout=lay)
    return solution, jnp.asarray(rt), jnp.asarray(rb)
