"""Read and write the libffm text format (Juan et al. 2016's ``ffm-train`` input).

One row per line: a label, then ``field:feature:value`` triples separated by
white space, fields and features 0-based::

    1 0:3:1 1:17:1 2:40:0.5
    0 0:5:1 2:41:1

gpustat keeps one field per feature (``field_ids``, as the FFM/FwFM estimators and
scoring functions take it), so a feature that appears under two fields is an
error. A feature repeated within a line is summed (as scipy sums duplicates).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable

import numpy as np
import scipy.sparse as sp

from gpustat._checks import is_int

__all__ = ["dump_libffm", "load_libffm"]


def _lines(source):
    if isinstance(source, (str, os.PathLike)):
        with open(source, encoding="utf-8") as handle:
            yield from handle
    else:
        yield from source


def _parse_triple(token: str, line_no: int) -> tuple[int, int, float]:
    parts = token.split(":")
    try:
        if len(parts) != 3:
            raise ValueError
        field, feature, value = int(parts[0]), int(parts[1]), float(parts[2])
    except ValueError:
        raise ValueError(f"load_libffm: line {line_no}: expected field:feature:value, got "
                         f"{token!r}") from None
    if field < 0 or feature < 0:
        raise ValueError(f"load_libffm: line {line_no}: field and feature must be >= 0, got "
                         f"{token!r}")
    if not math.isfinite(value):
        raise ValueError(f"load_libffm: line {line_no}: value must be finite, got {token!r}")
    return field, feature, value


def load_libffm(source: str | os.PathLike | Iterable[str], *, n_features: int | None = None,
                dtype=np.float64) -> tuple[sp.csr_matrix, np.ndarray, np.ndarray]:
    """Read libffm text into ``(X, y, field_ids)``.

    Args:
        source: a path, or an iterable of lines (an open file, a list of strings).
            Blank lines are skipped.
        n_features: p, a non-negative integer; default one more than the largest
            feature index read.
        dtype: floating dtype of ``X``'s values.

    Returns:
        ``X`` an ``(n, p)`` ``scipy.sparse.csr_matrix`` (duplicates summed, indices
        sorted), ``y`` the ``(n,)`` float64 labels, ``field_ids`` the ``(p,)`` int64
        field of each feature (0 for features that never occur).

    Raises:
        TypeError: ``dtype`` is not floating or ``n_features`` not an integer.
        ValueError: a malformed label or triple, a negative index, a non-finite
            value, a feature under two fields, or a feature index >= ``n_features``
            (each message names the line); a negative ``n_features``.
    """
    if not np.issubdtype(dtype, np.floating):
        raise TypeError(f"load_libffm: dtype must be a floating dtype, got {dtype=}")
    if n_features is not None:
        if not is_int(n_features):
            raise TypeError(f"load_libffm: n_features must be an integer, got {n_features=}")
        if n_features < 0:
            raise ValueError(f"load_libffm: n_features must be >= 0, got {n_features=}")
    labels, rows, columns, values = [], [], [], []
    field_of: dict[int, tuple[int, int]] = {}  # feature -> (field, first line)
    for line_no, line in enumerate(_lines(source), start=1):
        tokens = line.split()
        if not tokens:
            continue
        try:
            label = float(tokens[0])
        except ValueError:
            raise ValueError(f"load_libffm: line {line_no}: the label must be a number, got "
                             f"{tokens[0]!r}") from None
        if not math.isfinite(label):
            raise ValueError(f"load_libffm: line {line_no}: the label must be finite, got "
                             f"{tokens[0]!r}")
        row = len(labels)
        labels.append(label)
        for token in tokens[1:]:
            field, feature, value = _parse_triple(token, line_no)
            seen = field_of.setdefault(feature, (field, line_no))
            if seen[0] != field:
                raise ValueError(f"load_libffm: line {line_no}: feature {feature} is in field "
                                 f"{field} but in field {seen[0]} on line {seen[1]} (gpustat "
                                 "keeps one field per feature)")
            rows.append(row)
            columns.append(feature)
            values.append(value)
    largest = max(field_of, default=-1)
    if n_features is None:
        n_features = largest + 1
    elif largest >= n_features:
        raise ValueError(f"load_libffm: feature {largest} read, but n_features={n_features}")
    X = sp.csr_matrix((np.asarray(values, dtype), (np.asarray(rows, np.int64),
                                                   np.asarray(columns, np.int64))),
                      shape=(len(labels), n_features))
    X.sum_duplicates()
    field_ids = np.zeros(n_features, np.int64)
    for feature, (field, _) in field_of.items():
        field_ids[feature] = field
    return X, np.asarray(labels, np.float64), field_ids


def _label_text(label: float) -> str:
    return str(int(label)) if float(label).is_integer() else repr(float(label))


def dump_libffm(target: str | os.PathLike, X, y, field_ids) -> None:
    """Write ``(X, y, field_ids)`` as libffm text (explicit zeros are left out).

    Args:
        target: the file to write.
        X: ``(n, p)`` scipy sparse matrix or dense array.
        y: ``(n,)`` numeric labels (integral ones are written without a decimal point).
        field_ids: ``(p,)`` non-negative integer field of each feature.

    Values are written with Python's shortest round-trip ``repr``, so
    :func:`load_libffm` reads back the same float64 numbers. ``X`` itself is
    left as it was.
    """
    X = sp.csr_matrix(X, copy=True)  # summing and dropping zeros below work in place
    X.sum_duplicates()
    X.eliminate_zeros()
    y = np.asarray(y)
    field_ids = np.asarray(field_ids)
    n, p = X.shape
    if y.shape != (n,):
        raise ValueError(f"dump_libffm: y must have shape (n,) = ({n},), got {y.shape=}")
    if not (np.issubdtype(y.dtype, np.number) and np.all(np.isfinite(y))):
        raise ValueError("dump_libffm: y must hold finite numbers")
    if field_ids.shape != (p,):
        raise ValueError(f"dump_libffm: field_ids must have shape (p,) = ({p},), got "
                         f"{field_ids.shape=}")
    if not np.issubdtype(field_ids.dtype, np.integer) or (p and field_ids.min() < 0):
        raise ValueError("dump_libffm: field_ids must be non-negative integers")
    if not np.all(np.isfinite(X.data)):
        raise ValueError("dump_libffm: X must be finite")
    with open(target, "w", encoding="utf-8") as handle:
        for r in range(n):
            start, stop = X.indptr[r], X.indptr[r + 1]
            triples = (f"{field_ids[j]}:{j}:{float(v)!r}"
                       for j, v in zip(X.indices[start:stop], X.data[start:stop], strict=True))
            handle.write(" ".join((_label_text(y[r]), *triples)) + "\n")
