"""Static CSR layout of a batch of border (arrow) systems: who owns which packed entries.

A batch of ``b`` atoms with ``n_a`` rows each (row dimension ``d``, uniform) and
border widths ``k_a`` is stored packed, with no padding (spec B.6):

* ``H_tt`` ``(N, d, d)`` and ``g_t`` ``(N, d)`` with ``N = sum_a n_a`` rows, atom ``a``
  owning rows ``row_offsets[a]:row_offsets[a + 1]``;
* ``H_tb`` flat ``(sum_a n_a d k_a,)``: atom ``a``'s rows from ``cross_offsets[a]``, each
  row's ``d x k_a`` block row-major;
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

import numpy as np

from gpustat._checks import check_int

__all__ = ["MAX_BORDER", "BorderLayout"]

#: Largest border width k_a a batch may carry (the fused-kernel bound of the spec).
MAX_BORDER = 32


def _prefix(sizes: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]).astype(np.int64)


@dataclasses.dataclass(frozen=True, eq=False)
class BorderLayout:
    """Row counts ``n_rows`` ``(b,)``, border widths ``k_dims`` ``(b,)`` and row dimension ``d``.

    Equality and hashing go by content, so two batches with the same structure
    share one compiled solve.
    """

    d: int
    n_rows: np.ndarray
    k_dims: np.ndarray

    def __post_init__(self):
        object.__setattr__(self, "d", check_int(self.d, "d", 1))
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
        self.n_rows.setflags(write=False)
        self.k_dims.setflags(write=False)

    @functools.cached_property
    def _digest(self) -> bytes:
        h = hashlib.blake2b(digest_size=16)
        h.update(np.int64(self.d).tobytes())
        h.update(self.n_rows.tobytes())
        h.update(b"|")
        h.update(self.k_dims.tobytes())
        return h.digest()

    def __hash__(self) -> int:
        return hash(self._digest)

    def __eq__(self, other) -> bool:
        return isinstance(other, BorderLayout) and self._digest == other._digest

    def __repr__(self) -> str:
        return (f"BorderLayout(atoms={self.num_atoms}, rows={self.num_rows}, d={self.d}, "
                f"max_rows={self.max_rows}, max_border={self.max_border})")

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
    def cross_offsets(self) -> np.ndarray:
        """``(b + 1,)`` first flat ``H_tb`` entry of each atom."""
        return _prefix(self.n_rows * self.d * self.k_dims)

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
        return {
            "H_tt": (self.num_rows, self.d, self.d),
            "H_tb": (int(self.cross_offsets[-1]),),
            "g_t": (self.num_rows, self.d),
            "H_bb": (int(self.hbb_offsets[-1]),),
            "g_b": (int(self.border_offsets[-1]),),
        }

    def subset(self, atoms: np.ndarray) -> BorderLayout:
        """Layout of the atoms ``atoms`` (in that order)."""
        atoms = np.asarray(atoms, dtype=np.int64)
        return BorderLayout(self.d, self.n_rows[atoms], self.k_dims[atoms])

    def row_index(self, atoms: np.ndarray) -> np.ndarray:
        """Packed row indices of ``atoms``, concatenated in that order."""
        return _ranges(self.row_offsets, atoms)

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
