"""Compressed sparse row matrices as a JAX pytree, with the row layout the kernels want.

:class:`CSR` holds the usual three arrays (``data``, ``indices``, ``indptr``)
and a static ``shape``. Built from concrete arrays it validates them and
groups its non-empty rows into **buckets by length**: a row with ``L``
nonzeros lands in the bucket of width ``next_pow2(L)``, so a kernel processes
tiles of rows of similar length (at most 2x padding, which it masks) and a few
long rows do not slow every other row down. The layout is computed once, on
the host, and travels with the matrix through ``jax.jit`` as pytree leaves.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

__all__ = ["CSR", "RowBuckets", "dense_as_csr"]

_INDEX_DTYPE = np.int32


@dataclasses.dataclass(frozen=True)
class RowBuckets:
    """Static description of how a :class:`CSR`'s non-empty rows are bucketed.

    Attributes:
        widths: power-of-two width of each bucket; bucket ``b`` holds the rows
            whose length ``L`` satisfies ``widths[b] // 2 < L <= widths[b]``.
        in_order: True when there is one bucket and it lists every row
            ``0 .. n-1`` in order (so kernel outputs need no scatter back).
    """

    widths: tuple[int, ...]
    in_order: bool


def _bucket_rows(indptr: np.ndarray) -> tuple[RowBuckets, tuple[np.ndarray, ...]]:
    """Group non-empty rows by ``next_pow2(length)``; empty rows belong to no bucket."""
    lengths = np.diff(indptr)
    n = lengths.shape[0]
    nonempty = lengths > 0
    # next power of two of each non-empty length, via the bit length of L - 1
    widths_per_row = np.zeros(n, dtype=np.int64)
    bits = np.ceil(np.log2(np.maximum(lengths[nonempty], 1))).astype(np.int64)
    widths_per_row[nonempty] = np.left_shift(1, bits)
    widths = tuple(int(w) for w in np.unique(widths_per_row[nonempty]))
    rows = tuple(np.flatnonzero(widths_per_row == w).astype(_INDEX_DTYPE) for w in widths)
    in_order = len(widths) == 1 and rows[0].shape[0] == n
    return RowBuckets(widths, in_order), rows


def check_field_ids(op: str, field_ids, p: int, n_fields: int, *, n_fields_name: str = "f",
                    origin: str = "") -> Int[Array, " p"]:
    """Validate a ``(p,)`` integer field id per feature in ``[0, n_fields)`` as int32.

    The range is checked on concrete values only (skipped for tracers). ``op`` prefixes
    every message; ``n_fields_name`` and ``origin`` say where the bound comes from.
    """
    field_ids = jnp.asarray(field_ids)
    if field_ids.shape != (p,):
        raise ValueError(f"{op}: field_ids must have shape (p,) = ({p},), got {field_ids.shape=}")
    if not jnp.issubdtype(field_ids.dtype, jnp.integer):
        raise TypeError(f"{op}: field_ids must hold integers, got {field_ids.dtype=}")
    if not isinstance(field_ids, jax.core.Tracer) and p:
        ids = np.asarray(field_ids)
        if ids.min() < 0 or ids.max() >= n_fields:
            bad = int(np.argmax((ids < 0) | (ids >= n_fields)))
            raise ValueError(f"{op}: field_ids must lie in [0, {n_fields_name}={n_fields})"
                             f"{origin}, got field_ids[{bad}]={ids[bad]}")
    return field_ids.astype(jnp.int32)


@jax.tree_util.register_pytree_node_class
class CSR:
    """A sparse ``(n, p)`` matrix in compressed sparse row form, usable under ``jax.jit``.

    Row ``r`` holds the nonzeros ``data[indptr[r]:indptr[r+1]]`` in the columns
    ``indices[indptr[r]:indptr[r+1]]``. Column indices within a row need not be
    sorted but must be distinct (:meth:`from_scipy` sums duplicates).

    Construction validates (``indptr`` starts at 0, is non-decreasing and ends
    at ``nnz``; ``indices`` lie in ``[0, p)``, distinct within a row; ``data`` is
    real and finite) and builds the row buckets used by the Pallas kernels
    (:class:`RowBuckets`). Both need concrete arrays: build a ``CSR`` outside
    ``jax.jit`` and pass it in; inside
    a traced function it is an ordinary pytree (leaves ``data``, ``indices``,
    ``indptr``, the bucket row lists and the optional field-slot table;
    ``shape`` and the bucket widths are static).

    :meth:`with_field_slots` adds a second layout for one-hot rows (at most one
    nonzero per field, the usual click-through-rate case): an ``(n, f)`` table
    of the position of each row's nonzero in each field, which the FwFM
    kernel reads instead of per-pair field lookups.

    Attributes:
        data: ``(nnz,)`` float values (float32, float64 or 16-bit).
        indices: ``(nnz,)`` int32 column of each value.
        indptr: ``(n + 1,)`` int32 row offsets into ``data``/``indices``.
        shape: ``(n, p)``.
        buckets: static :class:`RowBuckets`.
        bucket_rows: one int32 array of row ids per bucket.
        field_slots: ``None``, or the ``(n, f)`` int32 table of
            :meth:`with_field_slots` (position in ``data`` of row ``r``'s
            nonzero of field ``s``, ``-1`` where the row has none).
    """

    field_slots: Int[Array, "n f"] | None = None

    def __init__(self, data: Float[Array, " nnz"], indices: Int[Array, " nnz"],
                 indptr: Int[Array, " n1"], shape: tuple[int, int]):
        """Validate concrete CSR arrays and build the row buckets.

        Args:
            data: ``(nnz,)`` floating values; integer or bool values are
                converted to float64 when x64 is enabled, else float32.
            indices: ``(nnz,)`` integer column indices in ``[0, p)``.
            indptr: ``(n + 1,)`` integer row offsets.
            shape: ``(n, p)``.

        Raises:
            TypeError: an argument is a tracer or has a non-numeric (or complex) dtype.
            ValueError: inconsistent lengths, ``indptr`` not starting at 0,
                decreasing or not ending at ``nnz``, indices out of range or
                repeated within a row, non-finite data, or more than 2**31 - 1
                nonzeros, rows or columns (int32 indices).
        """
        for name, value in (("data", data), ("indices", indices), ("indptr", indptr)):
            if isinstance(value, jax.core.Tracer):
                raise TypeError(f"CSR: {name} must be a concrete array (build the CSR outside "
                                "jax.jit and pass it in), got a tracer")
        data_np, indices_np, indptr_np = np.asarray(data), np.asarray(indices), np.asarray(indptr)
        shape = _check_shape(shape)
        _check_arrays(data_np, indices_np, indptr_np, shape)
        if not np.issubdtype(data_np.dtype, np.floating) and data_np.dtype != jnp.bfloat16:
            data_np = data_np.astype(jnp.result_type(float))
        buckets, rows = _bucket_rows(indptr_np)
        self.data = jnp.asarray(data_np)
        self.indices = jnp.asarray(indices_np, dtype=_INDEX_DTYPE)
        self.indptr = jnp.asarray(indptr_np, dtype=_INDEX_DTYPE)
        self.shape = shape
        self.buckets = buckets
        self.bucket_rows = tuple(jnp.asarray(r) for r in rows)

    # -- constructors -------------------------------------------------------------------------

    @classmethod
    def from_scipy(cls, matrix, dtype=None) -> CSR:
        """Convert any scipy sparse matrix or array (COO, CSC, CSR, ...).

        Duplicate entries are summed in float64 (then cast to the result dtype,
        so integer values do not wrap and float32 sums round once); explicit
        zeros are kept (the scoring kernels skip them).

        Args:
            matrix: a ``scipy.sparse`` matrix or array of shape ``(n, p)``.
            dtype: optional floating dtype of ``data``; default keeps the matrix's
                floating dtype (integer or bool values become floats as in :class:`CSR`).

        Raises:
            TypeError: ``matrix`` is not a scipy sparse matrix, or ``dtype`` is not
                floating.
            ValueError: as :class:`CSR`.
        """
        import scipy.sparse as sp

        if not sp.issparse(matrix):
            raise TypeError(f"CSR.from_scipy: matrix must be a scipy sparse matrix, "
                            f"got {type(matrix).__name__}")
        if dtype is not None and not jnp.issubdtype(dtype, jnp.floating):
            raise TypeError(f"CSR.from_scipy: dtype must be a floating dtype, got {dtype=}")
        kind = np.dtype(matrix.dtype).kind
        if dtype is None and kind == "f":
            dtype = matrix.dtype
        # scipy sums duplicates in the matrix's dtype (int8 wraps, float32 rounds): widen
        # first; complex data is left to the constructor to reject
        csr = sp.csr_array(matrix.astype(np.float64) if kind in "biuf" else matrix, copy=True)
        csr.sum_duplicates()
        data = csr.data if dtype is None else csr.data.astype(dtype)
        return cls(data, csr.indices, csr.indptr, csr.shape)

    @classmethod
    def from_dense(cls, x: Float[Array, "n p"]) -> CSR:
        """Convert a concrete dense ``(n, p)`` array; exact zeros are dropped.

        Raises:
            TypeError: ``x`` is a tracer.
            ValueError: ``x`` is not 2-D or holds non-finite values.
        """
        if isinstance(x, jax.core.Tracer):
            raise TypeError("CSR.from_dense: x must be a concrete array, got a tracer")
        x = np.asarray(x)
        if x.ndim != 2:
            raise ValueError(f"CSR.from_dense: x must be 2-D (n, p), got {x.shape=}")
        rows, cols = np.nonzero(x)
        indptr = np.zeros(x.shape[0] + 1, dtype=np.int64)
        np.cumsum(np.bincount(rows, minlength=x.shape[0]), out=indptr[1:])
        return cls(x[rows, cols], cols, indptr, x.shape)

    # -- views --------------------------------------------------------------------------------

    @property
    def nnz(self) -> int:
        """Number of stored entries."""
        return int(self.data.shape[0])

    @property
    def dtype(self):
        """dtype of ``data``."""
        return self.data.dtype

    def with_data(self, data: Float[Array, " nnz"]) -> CSR:
        """The same sparsity pattern with new values (traceable; no checks).

        The way to differentiate with respect to the stored values:
        ``jax.grad(lambda d: fm_predict(X.with_data(d), ...).sum())(X.data)``.

        Raises:
            ValueError: ``data`` does not have shape ``(nnz,)``.
        """
        if data.shape != self.data.shape:
            raise ValueError(f"CSR.with_data: data must have shape {self.data.shape}, got "
                             f"{data.shape=}")
        children, aux = self.tree_flatten()
        return CSR.tree_unflatten(aux, (data, *children[1:]))

    def with_field_slots(self, field_ids: Int[Array, " p"], n_fields: int | None = None) -> CSR:
        """The same matrix carrying a field-slot table for one-hot rows (built once, on the host).

        Slot ``(r, s)`` of the table holds the position in ``data``/``indices``
        of row ``r``'s stored entry whose feature has field ``s``, or ``-1``.
        Kernels that read it check, per row, that every nonzero still sits in
        its own field's slot for the ``field_ids`` they are given, and fall
        back to the row-bucket layout when one does not.

        Args:
            field_ids: concrete ``(p,)`` integer field of each feature.
            n_fields: number of fields ``f`` (table width); default
                ``max(field_ids) + 1``.

        Raises:
            TypeError: ``field_ids`` is a tracer or not integer.
            ValueError: ``field_ids`` has the wrong shape or lies outside
                ``[0, n_fields)``, or a row stores two entries of one field
                (the table needs at most one per field; use the CSR as it is).
        """
        if isinstance(field_ids, jax.core.Tracer):
            raise TypeError("CSR.with_field_slots: field_ids must be a concrete array, got a "
                            "tracer")
        n, p = self.shape
        f = int(np.max(field_ids, initial=-1)) + 1 if n_fields is None else int(n_fields)
        fields = np.asarray(check_field_ids("CSR.with_field_slots", field_ids, p, f,
                                            n_fields_name="n_fields"))
        indptr = np.asarray(self.indptr)
        rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
        slot = rows * f + fields[np.asarray(self.indices)]
        counts = np.bincount(slot, minlength=n * f)
        if counts.size and counts.max() > 1:
            bad = int(np.argmax(counts > 1))
            r, s = divmod(bad, f)
            raise ValueError(f"CSR.with_field_slots: row {r} stores {counts[bad]} entries of "
                             f"field {s}; the slot table holds at most one per field")
        table = np.full(n * f, -1, dtype=_INDEX_DTYPE)
        table[slot] = np.arange(self.nnz, dtype=_INDEX_DTYPE)
        children, aux = self.tree_flatten()
        return CSR.tree_unflatten(aux, (*children[:-1], jnp.asarray(table.reshape(n, f))))

    def to_dense(self) -> Float[Array, "n p"]:
        """Dense ``(n, p)`` array (duplicates, if any, summed). Works under ``jax.jit``."""
        n, p = self.shape
        rows = jnp.repeat(jnp.arange(n), jnp.diff(self.indptr), total_repeat_length=self.nnz)
        return jnp.zeros((n, p), self.data.dtype).at[rows, self.indices].add(self.data)

    def to_scipy(self):
        """The matrix as a ``scipy.sparse.csr_array`` (concrete CSR only).

        scipy has no bfloat16: bfloat16 values come back as (the same) float32 values.
        """
        import scipy.sparse as sp

        data = np.asarray(self.data)
        if data.dtype == jnp.bfloat16:
            data = data.astype(np.float32)
        return sp.csr_array((data, np.asarray(self.indices), np.asarray(self.indptr)),
                            shape=self.shape)

    def __repr__(self) -> str:
        return (f"CSR(shape={self.shape}, nnz={self.nnz}, dtype={self.dtype}, "
                f"bucket_widths={self.buckets.widths})")

    # -- pytree -------------------------------------------------------------------------------

    def tree_flatten(self):
        children = (self.data, self.indices, self.indptr, self.bucket_rows, self.field_slots)
        return children, (self.shape, self.buckets)

    @classmethod
    def tree_unflatten(cls, aux, children):
        obj = object.__new__(cls)
        obj.data, obj.indices, obj.indptr, obj.bucket_rows, obj.field_slots = children
        obj.shape, obj.buckets = aux
        return obj


def _check_shape(shape) -> tuple[int, int]:
    try:
        n, p = (int(s) for s in shape)
    except (TypeError, ValueError):
        raise ValueError(f"CSR: shape must be (n, p), got {shape=}") from None
    if n < 0 or p < 0:
        raise ValueError(f"CSR: shape must be non-negative, got {shape=}")
    if max(n, p) > np.iinfo(_INDEX_DTYPE).max:
        raise ValueError(f"CSR: n and p must be at most {np.iinfo(_INDEX_DTYPE).max} (int32 "
                         f"row ids and column indices), got {shape=}")
    return n, p


def _check_arrays(data: np.ndarray, indices: np.ndarray, indptr: np.ndarray,
                  shape: tuple[int, int]) -> None:
    n, p = shape
    for name, value in (("data", data), ("indices", indices), ("indptr", indptr)):
        if value.ndim != 1:
            raise ValueError(f"CSR: {name} must be 1-D, got {name}.shape={value.shape}")
    real = np.issubdtype(data.dtype, np.number) and not np.iscomplexobj(data)
    if not (real or data.dtype in (np.bool_, jnp.bfloat16)):
        raise TypeError(f"CSR: data must be real numbers, got {data.dtype=}")
    for name, value in (("indices", indices), ("indptr", indptr)):
        if not np.issubdtype(value.dtype, np.integer):
            raise TypeError(f"CSR: {name} must hold integers, got {name}.dtype={value.dtype}")
    nnz = data.shape[0]
    if indices.shape[0] != nnz:
        raise ValueError(f"CSR: indices and data must have the same length, got "
                         f"{indices.shape=} and {data.shape=}")
    if nnz > np.iinfo(_INDEX_DTYPE).max:
        raise ValueError(f"CSR: at most {np.iinfo(_INDEX_DTYPE).max} nonzeros supported, "
                         f"got {nnz=}")
    if indptr.shape[0] != n + 1:
        raise ValueError(f"CSR: indptr must have n + 1 = {n + 1} entries for {shape=}, got "
                         f"{indptr.shape=}")
    if indptr[0] != 0 or indptr[-1] != nnz:
        raise ValueError(f"CSR: indptr must start at 0 and end at nnz={nnz}, got "
                         f"indptr[0]={indptr[0]}, indptr[-1]={indptr[-1]}")
    steps = np.diff(indptr.astype(np.int64))  # a decreasing unsigned indptr would wrap
    if np.any(steps < 0):
        row = int(np.argmax(steps < 0))
        raise ValueError(f"CSR: indptr must be non-decreasing, but indptr[{row + 1}]="
                         f"{indptr[row + 1]} < indptr[{row}]={indptr[row]}")
    if nnz and (indices.min() < 0 or indices.max() >= p):
        bad = int(np.argmax((indices < 0) | (indices >= p)))
        raise ValueError(f"CSR: indices must lie in [0, p={p}), got indices[{bad}]="
                         f"{indices[bad]}")
    repeated = _first_repeated_column(indices, indptr, p)
    if repeated is not None:
        row, column = repeated
        raise ValueError(f"CSR: indices must be distinct within a row, got column {column} "
                         f"twice in row {row} (CSR.from_scipy sums duplicates)")
    if np.issubdtype(data.dtype, np.floating) or data.dtype == jnp.bfloat16:
        finite = np.isfinite(data.astype(np.float64))
        if not finite.all():
            bad = int(np.argmin(finite))
            raise ValueError(f"CSR: data must be finite, got data[{bad}]={data[bad]}")


def _first_repeated_column(indices: np.ndarray, indptr: np.ndarray,
                           p: int) -> tuple[int, int] | None:
    """(row, column) of a column index stored twice in one row, or None.

    Rows whose indices increase (scipy's canonical form) are checked in O(nnz);
    otherwise the (row, column) keys are sorted.
    """
    nnz = indices.shape[0]
    if nnz < 2:
        return None
    same_row = np.ones(nnz - 1, bool)  # pair (j, j + 1) lies in one row
    starts = indptr[1:-1]
    same_row[starts[(starts > 0) & (starts < nnz)] - 1] = False
    if np.all(np.diff(indices.astype(np.int64))[same_row] > 0):
        return None
    rows = np.repeat(np.arange(indptr.shape[0] - 1, dtype=np.int64), np.diff(indptr))
    keys = np.sort(rows * max(p, 1) + indices)
    twice = np.flatnonzero(keys[1:] == keys[:-1])
    if twice.size == 0:
        return None
    row, column = divmod(int(keys[twice[0]]), max(p, 1))
    return row, column


def dense_as_csr(x: Float[Array, "n p"]) -> CSR:
    """A :class:`CSR` view of every entry of a dense array, built with traceable ops.

    Every entry is stored (zeros included; the scoring functions skip exact
    zeros), all rows fall in one bucket of width ``next_pow2(p)``, and no value
    check runs, so this works on tracers inside ``jax.jit``/``jax.vmap``.
    Gradients with respect to ``data`` reshape back to ``(n, p)``.

    Raises:
        ValueError: ``x`` is not 2-D, or has more than 2**31 - 1 entries (the
            int32 row offsets would wrap).
    """
    if x.ndim != 2:
        raise ValueError(f"dense_as_csr: x must be 2-D (n, p), got {x.shape=}")
    n, p = x.shape
    if n * p > np.iinfo(_INDEX_DTYPE).max:
        raise ValueError(f"dense_as_csr: x may hold at most {np.iinfo(_INDEX_DTYPE).max} "
                         f"entries (int32 row offsets), got {x.shape=}")
    obj = object.__new__(CSR)
    obj.data = x.reshape(-1)
    obj.indices = jnp.tile(jnp.arange(p, dtype=_INDEX_DTYPE), n)
    obj.indptr = jnp.arange(n + 1, dtype=_INDEX_DTYPE) * p
    obj.shape = (n, p)
    width = 1 << max(p - 1, 0).bit_length()
    if n and p:
        obj.buckets = RowBuckets((width,), True)
        obj.bucket_rows = (jnp.arange(n, dtype=_INDEX_DTYPE),)
    else:
        obj.buckets = RowBuckets((), False)
        obj.bucket_rows = ()
    return obj
