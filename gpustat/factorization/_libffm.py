"""Read and write the libffm text format (Juan et al. 2016's ``ffm-train`` input); read svmlight.

One row per line: a label, then ``field:feature:value`` triples separated by
white space, fields and features 0-based::

    1 0:3:1 1:17:1 2:40:0.5
    0 0:5:1 2:41:1

gpustat keeps one field per feature (``field_ids``, as the FFM/FwFM estimators and
scoring functions take it), so a feature that appears under two fields is an
error. A feature repeated within a line is summed (as scipy sums duplicates).

:func:`dump_libffm` starts the file with a header comment that the libffm tools do
not know but :func:`load_libffm` reads, so the width ``p`` and the fields of
features that no row uses survive a round trip::

    # gpustat-libffm n_features=50 fields=47:2,49:3

(``fields`` lists ``feature:field`` for the unused features of a nonzero field.)
``header=False`` writes plain libffm for ``ffm-train``.

Parsing is vectorised over the bytes of 4 MiB blocks of whole lines: numpy
classifies every byte and finds the words and colons; the indices and the numbers
written as plain digits go through one integer parse, the other numbers through
one float parse (numpy's C loops, no Python per token). Memory stays bounded by
the block and the rows kept; only a block that holds an error is re-read line by
line, to name the line. :func:`iter_libffm` yields the rows in chunks of
``chunk_rows`` (for ``partial_fit`` over files larger than memory);
:func:`load_libffm` reads them all. :func:`load_svmlight` / :func:`iter_svmlight`
read ``label feature:value ...`` lines with the same parser, without fields.
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Iterable, Iterator

import numpy as np
import scipy.sparse as sp

from gpustat._checks import is_int
from gpustat._prefetch import prefetched

__all__ = ["dump_libffm", "iter_libffm", "iter_svmlight", "load_libffm", "load_svmlight"]

_HEADER = b"# gpustat-libffm"
_BLOCK_BYTES = 1 << 22
# feature and field ids must fit the int32 indices of gpustat.CSR and field_ids
_INDEX_LIMIT = int(np.iinfo(np.int32).max)

_NUMBER = re.compile(rb"[+-]?((\d+\.?\d*|\.\d+)([eE][+-]?\d+)?|inf|infinity|nan)",
                     re.IGNORECASE)
_INTEGER = re.compile(rb"-?\d+")


# -- reading whole lines in blocks ------------------------------------------------------------

def _file_blocks(path) -> Iterator[bytes]:
    with open(path, "rb") as handle:
        rest = b""
        while chunk := handle.read(_BLOCK_BYTES):
            cut = chunk.rfind(b"\n")
            if cut < 0:
                rest += chunk
                continue
            yield rest + chunk[: cut + 1]
            rest = chunk[cut + 1:]
        if rest:
            yield rest + b"\n"


def _line_blocks(lines: Iterable, op: str) -> Iterator[bytes]:
    """Lines (str or bytes, with or without their line break) joined into blocks."""
    pending, size, line_no = [], 0, 0
    for line_no, line in enumerate(lines, start=1):
        if isinstance(line, str):
            line = line.encode("utf-8")
        elif not isinstance(line, (bytes, bytearray, memoryview)):
            raise TypeError(f"{op}: line {line_no}: source must yield str or bytes "
                            f"lines, got {type(line).__name__}")
        line = bytes(line)
        line = line[:-1] if line.endswith(b"\n") else line
        pending.append(line)
        size += len(line) + 1
        if size >= _BLOCK_BYTES:
            yield _joined(pending, line_no, op)
            pending, size = [], 0
    if pending:
        yield _joined(pending, line_no, op)


def _joined(lines: list[bytes], last_line: int, op: str) -> bytes:
    block = b"\n".join(lines) + b"\n"
    if block.count(b"\n") != len(lines):
        first = last_line - len(lines) + 1
        bad = next(i for i, line in enumerate(lines) if b"\n" in line)
        raise ValueError(f"{op}: line {first + bad}: an item of source holds a line "
                         "break; pass one line per item")
    return block


def _blocks(source, op: str) -> Iterator[bytes]:
    if isinstance(source, (str, os.PathLike)):
        return _file_blocks(source)
    if isinstance(source, (bytes, bytearray)):
        raise TypeError(f"{op}: source must be a path or an iterable of lines, got "
                        f"{type(source).__name__} (split the text into lines)")
    return _line_blocks(source, op)


# -- header ---------------------------------------------------------------------------------

def _read_header(line: bytes, op: str) -> tuple[int, np.ndarray, np.ndarray]:
    """``(n_features, unused features, their fields)`` of a ``# gpustat-libffm`` line."""
    words = line[len(_HEADER):].split()
    try:
        fields = dict(word.split(b"=", 1) for word in words)
        n_features = int(fields[b"n_features"])
        pairs = [pair.split(b":") for pair in fields.get(b"fields", b"").split(b",") if pair]
        table = np.array([[int(a), int(b)] for a, b in pairs], np.int64).reshape(-1, 2)
    except (KeyError, ValueError):
        raise ValueError(f"{op}: line 1: malformed header {line.decode(errors='replace')!r}"
                         ) from None
    if not (0 <= n_features <= _INDEX_LIMIT and np.all(table >= 0)
            and np.all(table[:, 0] < n_features) and np.all(table[:, 1] <= _INDEX_LIMIT)):
        raise ValueError(f"{op}: line 1: header values out of range in "
                         f"{line.decode(errors='replace')!r}")
    return n_features, table[:, 0], table[:, 1]


# -- parsing --------------------------------------------------------------------------------

def _numbers(buf: np.ndarray, dtype) -> np.ndarray | None:
    """All white-space separated numbers of ``buf`` (uint8) in ``dtype``; None if one is not."""
    text = buf.tobytes()
    if not text.strip():
        return np.zeros(0, dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        try:
            return np.fromstring(text, dtype=dtype, sep=" ")
        except (ValueError, DeprecationWarning):
            return None


def _token_error(block: bytes, first_line: int, op: str, parts: int) -> ValueError:
    """The first malformed label or entry of ``block``, named by its line (error path only)."""
    names = ("field", "feature", "value")[3 - parts:]
    for offset, line in enumerate(block.split(b"\n")):
        tokens = line.split()
        if not tokens:
            continue
        line_no = first_line + offset
        if not _NUMBER.fullmatch(tokens[0]):
            return ValueError(f"{op}: line {line_no}: the label must be a number, got "
                              f"{tokens[0].decode(errors='replace')!r}")
        for token in tokens[1:]:
            split = token.split(b":")
            well_formed = (len(split) == parts and _NUMBER.fullmatch(split[-1])
                           and all(_INTEGER.fullmatch(index) for index in split[:-1]))
            if well_formed and any(index.startswith(b"-") for index in split[:-1]):
                return ValueError(f"{op}: line {line_no}: {' and '.join(names[:-1])} must be "
                                  f">= 0, got {token.decode(errors='replace')!r}")
            if not well_formed:
                return ValueError(f"{op}: line {line_no}: expected {':'.join(names)} "
                                  f"(non-negative integers and a number), got "
                                  f"{token.decode(errors='replace')!r}")
    last_line = first_line + block.count(b"\n") - 1
    return ValueError(f"{op}: lines {first_line}-{last_line}: a token numpy cannot parse as a "
                      "number")


class _Parser:
    """Parses blocks of whole lines; keeps the line count and the field of each feature seen.

    One parser reads libffm (``parts=3``) and svmlight (``parts=2``, no fields) lines.

    ``fields`` is the field of every feature seen so far (-1 unseen), grown as
    needed unless fixed (``field_ids`` given); ``first_line`` the line where each
    feature was first seen (1, the header's line, for the fields it lists).
    """

    def __init__(self, op: str, parts: int, n_features: int | None,
                 field_ids: np.ndarray | None, dtype):
        self.op = op
        self.parts = parts  # 3: field:feature:value (libffm), 2: feature:value (svmlight)
        self.n_features = n_features
        self.dtype = dtype
        self.fixed = field_ids is not None
        self.fields = (np.asarray(field_ids, np.int64) if self.fixed
                       else np.full(0, -1, np.int64))
        self.first_line = np.zeros(self.fields.shape, np.int64)
        self.line = 1

    def preset(self, features: np.ndarray, fields: np.ndarray) -> None:
        self._grow(int(features.max(initial=-1)) + 1)
        self.fields[features] = fields
        self.first_line[features] = 1

    def _grow(self, size: int) -> None:
        if size > self.fields.shape[0]:
            grown = np.full(max(size, 2 * self.fields.shape[0]), -1, np.int64)
            grown[: self.fields.shape[0]] = self.fields
            line = np.zeros(grown.shape, np.int64)
            line[: self.first_line.shape[0]] = self.first_line
            self.fields, self.first_line = grown, line

    def parse(self, block: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                           np.ndarray]:
        """``(labels (r,), indptr (r + 1,), features, fields, values (nnz,))`` of ``block``.

        Bytes up to 0x20 separate words; a line's first word is its label, every
        other word one ``field:feature:value`` triple. Indices and the labels and
        values written as plain digits go through one integer parse, the other
        numbers through one float parse (both numpy C loops over a copy of the
        block with every other byte blanked).
        """
        first_line = self.line
        self.line += block.count(b"\n")
        a = np.frombuffer(block, np.uint8)
        blank = a <= 32
        edge = np.flatnonzero(blank[1:] != blank[:-1]) + 1
        if a.size and not blank[0]:
            edge = np.concatenate(([0], edge))
        starts, ends = edge[0::2], edge[1::2]  # words: maximal runs of non-blank bytes
        word_lines = first_line + np.searchsorted(np.flatnonzero(a == 10), starts)
        is_label = np.ones(starts.shape, bool)
        is_label[1:] = word_lines[1:] != word_lines[:-1]
        triple = ~is_label  # every word after a line's label is one entry
        n_triples = int(np.count_nonzero(triple))
        n_indices = self.parts - 1
        nondigit = (a - np.uint8(48)) > 9
        odd = np.flatnonzero(nondigit & ~blank)  # colons, and signs, points, letters
        colon = a[odd] == 58
        colons, odd = odd[colon], odd[~colon]
        if colons.shape[0] != n_indices * n_triples:
            raise _token_error(block, first_line, self.op, self.parts)
        # the k-th colons split the k-th entry into non-empty parts (so labels hold none
        # and each entry exactly parts - 1)
        t_starts, t_ends = starts[triple], ends[triple]
        last = colons[n_indices - 1::n_indices]  # before the value
        index_starts = np.stack([t_starts, *(colons[c::n_indices] + 1
                                             for c in range(n_indices - 1))], axis=1)
        index_ends = np.stack([colons[c::n_indices] for c in range(n_indices)], axis=1)
        if not (np.all(index_starts < index_ends) and np.all(last + 1 < t_ends)):
            raise _token_error(block, first_line, self.op, self.parts)
        # a sign, point or letter in an index is an error; in a label or a value it
        # makes the number a decimal one (parsed as a float)
        odd_word = np.searchsorted(starts, odd, side="right") - 1
        triple_of = np.cumsum(triple) - 1
        if np.any(triple[odd_word] & (odd < last[triple_of[odd_word]])):
            raise _token_error(block, first_line, self.op, self.parts)
        entry_lines = word_lines[triple]
        value_starts = starts.copy()
        value_starts[triple] = last + 1
        lengths = index_ends - index_starts
        if np.any(lengths > 18):  # beyond int64 parsing, and any index limit
            entry, which = np.unravel_index(int(np.argmax(lengths > 18)), lengths.shape)
            at = index_starts[entry, which]
            raise ValueError(f"{self.op}: line {entry_lines[entry]}: "
                             f"{('field', 'feature')[which + 2 - n_indices]} index "
                             f"{block[at:at + lengths[entry, which]].decode()} is beyond the "
                             "int32 range")
        decimal = np.zeros(starts.shape, bool)
        decimal[odd_word] = True
        decimal |= ends - value_starts > 18  # too long for int64
        # the decimal numbers' bytes, each followed by a blank, gathered into one buffer
        sizes = ends[decimal] - value_starts[decimal] + 1
        gather = np.arange(int(sizes.sum())) + np.repeat(value_starts[decimal]
                                                         - (np.cumsum(sizes) - sizes), sizes)
        compact = a[gather]
        compact[np.cumsum(sizes) - 1] = 32
        floats = _numbers(compact, np.float64)
        integer_bytes = np.where(nondigit, np.uint8(32), a)
        integer_bytes[gather] = 32
        integers = _numbers(integer_bytes, np.int64)
        indices_per_word = np.where(triple, n_indices, 0)
        per_word = indices_per_word + ~decimal
        if (integers is None or floats is None or integers.shape[0] != per_word.sum()
                or floats.shape[0] != np.count_nonzero(decimal)):
            raise _token_error(block, first_line, self.op, self.parts)
        numbers = np.empty(starts.shape, np.float64)  # the label or value of each word
        numbers[decimal] = floats
        offsets = np.cumsum(per_word) - per_word
        numbers[~decimal] = integers[offsets[~decimal] + indices_per_word[~decimal]]
        fields = integers[offsets[triple]] if n_indices == 2 else None
        features = integers[offsets[triple] + n_indices - 1]
        labels = numbers[is_label]
        if not np.all(np.isfinite(labels)):
            bad = int(np.argmin(np.isfinite(labels)))
            raise ValueError(f"{self.op}: line {word_lines[is_label][bad]}: the label "
                             f"must be finite, got {float(labels[bad])!r}")
        values = numbers[triple]
        if not np.all(np.isfinite(values)):
            bad = int(np.argmin(np.isfinite(values)))
            raise ValueError(f"{self.op}: line {entry_lines[bad]}: value must be "
                             f"finite, got {float(values[bad])!r}")
        limit = _INDEX_LIMIT if self.n_features is None else self.n_features
        name = ("the int32 index limit (at most 2**31 - 1 features)" if self.n_features is None
                else f"n_features={self.n_features}")
        if features.size and features.max() >= limit:
            bad = int(np.argmax(features >= limit))
            raise ValueError(f"{self.op}: line {entry_lines[bad]}: feature index "
                             f"{features[bad]} is beyond {name}")
        if fields is not None:
            if fields.size and fields.max() > _INDEX_LIMIT:
                bad = int(np.argmax(fields > _INDEX_LIMIT))
                raise ValueError(f"{self.op}: line {entry_lines[bad]}: field index "
                                 f"{fields[bad]} is beyond the int32 range")
            self._check_fields(features, fields, entry_lines)
        n_labels = labels.shape[0]
        row = np.cumsum(is_label)[triple] - 1
        indptr = np.zeros(n_labels + 1, np.int64)
        np.cumsum(np.bincount(row, minlength=n_labels), out=indptr[1:])
        with np.errstate(over="ignore"):  # reported below, naming the line
            cast = values.astype(self.dtype)
        if not np.all(np.isfinite(cast)):
            bad = int(np.argmin(np.isfinite(cast)))
            raise ValueError(f"{self.op}: line {entry_lines[bad]}: value "
                             f"{float(values[bad])!r} overflows dtype={self.dtype.name}")
        return labels, indptr, features, fields, cast

    def _check_fields(self, features, fields, lines) -> None:
        """One field per feature, across blocks (and equal to ``field_ids`` if given)."""
        if not self.fixed:
            self._grow(int(features.max(initial=-1)) + 1)
            new = self.fields[features] < 0
            # reversed, so that the first occurrence of a new feature is the one written
            self.fields[features[new][::-1]] = fields[new][::-1]
            self.first_line[features[new][::-1]] = lines[new][::-1]
        known = self.fields[features]
        if np.array_equal(known, fields):
            return
        bad = int(np.argmax(known != fields))
        feature = int(features[bad])
        if self.fixed:
            raise ValueError(f"{self.op}: line {lines[bad]}: feature {feature} is in field "
                             f"{fields[bad]} but field_ids[{feature}]={known[bad]}")
        raise ValueError(f"{self.op}: line {lines[bad]}: feature {feature} is in field "
                         f"{fields[bad]} but in field {known[bad]} on line "
                         f"{self.first_line[feature]} (gpustat keeps one field per feature)")


def _check_load_arguments(op: str, n_features, dtype) -> None:
    if not np.issubdtype(dtype, np.floating):
        raise TypeError(f"{op}: dtype must be a floating dtype, got {dtype=}")
    if n_features is not None:
        if not is_int(n_features):
            raise TypeError(f"{op}: n_features must be an integer, got {n_features=}")
        if not 0 <= n_features <= _INDEX_LIMIT:
            raise ValueError(f"{op}: n_features must be >= 0 and at most 2**31 - 1, got "
                             f"{n_features=}")


def _start(op: str, source, n_features, field_ids, dtype, parts: int = 3
           ) -> tuple[_Parser, Iterator[bytes]]:
    """The parser and the blocks after the header; the width from the header if there is one."""
    _check_load_arguments(op, n_features, dtype)
    blocks = _blocks(source, op)
    first = next(blocks, b"")
    header = None
    if parts == 3 and first.startswith(_HEADER):
        cut = first.index(b"\n")
        header = _read_header(first[:cut], op)
        first = first[cut + 1:]
        if n_features is not None and n_features != header[0]:
            raise ValueError(f"{op}: n_features={n_features} but the file's header says "
                             f"n_features={header[0]}")
        n_features = header[0]
    if field_ids is not None:
        field_ids = np.asarray(field_ids)
        if n_features is None:
            raise ValueError(f"{op}: field_ids needs n_features (or a file header)")
        if field_ids.shape != (n_features,) or not np.issubdtype(field_ids.dtype, np.integer):
            raise ValueError(f"{op}: field_ids must be ({n_features},) integers, got "
                             f"{field_ids.shape=}, {field_ids.dtype=}")
        if n_features and field_ids.min() < 0:
            raise ValueError(f"{op}: field_ids must be >= 0, got min {field_ids.min()}")
    parser = _Parser(op, parts, n_features, field_ids, np.dtype(dtype))
    if header is not None:
        parser.line = 2
        if not parser.fixed:
            parser.preset(*header[1:])

    def rest():
        if first:
            yield first
        yield from blocks

    return parser, rest()


def _matrix(labels, indptr, features, values, n_features, dtype) -> sp.csr_matrix:
    X = sp.csr_matrix((values, features, indptr), shape=(labels.shape[0], n_features),
                      dtype=dtype)
    X.sum_duplicates()
    return X


def load_libffm(source: str | os.PathLike | Iterable[str | bytes], *,
                n_features: int | None = None,
                dtype=np.float64) -> tuple[sp.csr_matrix, np.ndarray, np.ndarray]:
    """Read libffm text into ``(X, y, field_ids)``.

    Args:
        source: a path, or an iterable of lines (an open text or binary file, a
            list of ``str`` or ``bytes``). Blank lines are skipped (and counted in
            line numbers). A first line ``# gpustat-libffm ...`` (written by
            :func:`dump_libffm`) gives ``p`` and the fields of unused features.
        n_features: p, an integer in ``[0, 2**31 - 1]``; default the header's
            value, else one more than the largest feature index read. Must equal
            the header's if both are given.
        dtype: floating dtype of ``X``'s values.

    Returns:
        ``X`` an ``(n, p)`` ``scipy.sparse.csr_matrix`` (duplicates summed, indices
        sorted), ``y`` the ``(n,)`` float64 labels, ``field_ids`` the ``(p,)`` int64
        field of each feature (the header's or 0 for features that never occur).

    Raises:
        TypeError: ``dtype`` is not floating, ``n_features`` not an integer, or
            ``source`` yields something other than ``str``/``bytes``.
        ValueError: a malformed label or triple, a negative index, a non-finite
            value, a feature under two fields, a feature index >= ``n_features``
            or beyond the int32 range, a line item holding a line break (each
            message names the line); ``n_features`` out of range or different
            from the header's.
    """
    parser, blocks = _start("load_libffm", source, n_features, None, dtype)
    X, labels = _load(parser, blocks, dtype)
    field_ids = np.zeros(parser.n_features, np.int64)
    known = parser.fields[: parser.n_features]
    field_ids[: known.shape[0]] = np.maximum(known, 0)
    return X, labels, field_ids


def _load(parser: _Parser, blocks: Iterator[bytes], dtype) -> tuple[sp.csr_matrix, np.ndarray]:
    """All rows of ``blocks`` as ``(X, y)``; sets ``parser.n_features`` if it was unknown."""
    parts = [parser.parse(block) for block in blocks]
    labels = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0)
    features = np.concatenate([p[2] for p in parts]) if parts else np.zeros(0, np.int64)
    values = np.concatenate([p[4] for p in parts]) if parts else np.zeros(0, dtype)
    indptr = np.zeros(labels.shape[0] + 1, np.int64)
    row = 0
    for part in parts:
        indptr[row + 1: row + part[0].shape[0] + 1] = part[1][1:] + indptr[row]
        row += part[0].shape[0]
    if parser.n_features is None:
        parser.n_features = int(features.max(initial=-1)) + 1
    return _matrix(labels, indptr, features, values, parser.n_features, dtype), labels


def iter_libffm(source: str | os.PathLike | Iterable[str | bytes], *, chunk_rows: int = 65536,
                n_features: int | None = None, field_ids=None, dtype=np.float64,
                prefetch: int = 1) -> Iterator[tuple[sp.csr_matrix, np.ndarray, np.ndarray]]:
    """Read libffm text in chunks of rows, with memory bounded by the chunk, not the file.

    Every chunk has the same width ``p``, so each can go straight to
    ``partial_fit``. Lines are read in 4 MiB blocks; at a time the reader holds
    one block's text and rows, fewer than ``chunk_rows`` rows carried over, and
    the ``(p,)`` field table, plus the ``prefetch`` chunks read ahead.

    With ``prefetch >= 1`` a worker thread reads and parses the next chunks
    while the caller works on the current one (``partial_fit`` training on the
    device): the chunks, their order and the errors are those of the sequential
    read; an error surfaces at the chunk it belongs to.

    Args:
        source: as :func:`load_libffm` (a path, or an iterable of lines).
        chunk_rows: rows per chunk (the last chunk may be shorter), a positive integer.
        n_features: p; required unless the file has a ``# gpustat-libffm`` header.
        field_ids: optional ``(p,)`` integer field of every feature, known in
            advance (as ``partial_fit`` needs it from the first chunk on); every
            triple is checked against it.
        dtype: floating dtype of ``X``'s values.
        prefetch: chunks read ahead in a worker thread (0: read in the caller's thread).

    Yields:
        ``(X, y, field_ids)``: ``X`` a ``(chunk, p)`` ``scipy.sparse.csr_matrix``
        (duplicates summed), ``y`` the ``(chunk,)`` float64 labels, ``field_ids``
        the ``(p,)`` int64 field of each feature: the given one, or else the
        fields seen so far (and the header's), ``-1`` for features not seen yet.

    Raises:
        ValueError / TypeError: as :func:`load_libffm` (the line named is the
            file's), a non-positive ``chunk_rows`` or negative ``prefetch``, no width
            known, a triple whose field differs from ``field_ids``.
    """
    return _iterate("iter_libffm", source, chunk_rows, n_features, field_ids, dtype, 3,
                    prefetch)


def _iterate(op: str, source, chunk_rows, n_features, field_ids, dtype, parts: int,
             prefetch: int) -> Iterator[tuple[sp.csr_matrix, np.ndarray, np.ndarray]]:
    """Arguments checked now; then an iterator of ``(X, y, field table)`` chunks."""
    for name, value, low in (("chunk_rows", chunk_rows, 1), ("prefetch", prefetch, 0)):
        if not is_int(value):
            raise TypeError(f"{op}: {name} must be an integer, got {name}={value!r}")
        if value < low:
            raise ValueError(f"{op}: {name} must be >= {low}, got {name}={value!r}")
    parser, blocks = _start(op, source, n_features, field_ids, dtype, parts)
    if parser.n_features is None:
        raise ValueError(f"{op}: n_features is required" + (
            " (the file has no '# gpustat-libffm' header that gives it)" if parts == 3 else ""))
    if not parser.fixed:
        parser._grow(parser.n_features)
    return prefetched(_chunks(parser, blocks, chunk_rows), int(prefetch))


def _chunks(parser: _Parser, blocks: Iterator[bytes], chunk_rows: int):
    labels, indptr, features, values = np.zeros(0), np.zeros(1, np.int64), None, None
    for block in blocks:
        part = parser.parse(block)
        if features is None:
            labels, indptr, features, values = part[0], part[1], part[2], part[4]
        else:
            labels = np.concatenate([labels, part[0]])
            indptr = np.concatenate([indptr, part[1][1:] + indptr[-1]])
            features = np.concatenate([features, part[2]])
            values = np.concatenate([values, part[4]])
        done = 0
        while labels.shape[0] - done >= chunk_rows:
            yield _chunk(parser, labels, indptr, features, values, done, done + chunk_rows)
            done += chunk_rows
        if done:  # keep only the rows not yielded yet
            labels, features, values = (labels[done:], features[indptr[done]:],
                                        values[indptr[done]:])
            indptr = indptr[done:] - indptr[done]
    if labels.shape[0]:
        yield _chunk(parser, labels, indptr, features, values, 0, labels.shape[0])


def _chunk(parser: _Parser, labels, indptr, features, values, r0: int, r1: int):
    """Rows ``r0:r1`` of the held rows as a ``(X, y, field_ids)`` chunk."""
    p = parser.n_features
    lo, hi = indptr[r0], indptr[r1]
    X = _matrix(labels[r0:r1], indptr[r0:r1 + 1] - lo, features[lo:hi], values[lo:hi], p,
                parser.dtype)
    return X, labels[r0:r1], parser.fields if parser.fixed else parser.fields[:p].copy()


def load_svmlight(source: str | os.PathLike | Iterable[str | bytes], *,
                  n_features: int | None = None,
                  dtype=np.float64) -> tuple[sp.csr_matrix, np.ndarray]:
    """Read svmlight text, ``label feature:value ...`` lines, into ``(X, y)``.

    The libffm reader without fields: the same vectorised parser, blocks, checks
    and line-numbered errors. Feature indices are used as written (a 1-based
    file leaves column 0 empty); ``qid:`` entries and ``#`` comments are not
    read (``sklearn.datasets.load_svmlight_file`` reads them).

    Args:
        source: a path, or an iterable of ``str`` or ``bytes`` lines.
        n_features: p; default one more than the largest feature index read.
        dtype: floating dtype of ``X``'s values.

    Returns:
        ``X`` an ``(n, p)`` ``scipy.sparse.csr_matrix`` (duplicates summed) and
        ``y`` the ``(n,)`` float64 labels.

    Raises:
        TypeError / ValueError: as :func:`load_libffm` (each naming the line).
    """
    parser, blocks = _start("load_svmlight", source, n_features, None, dtype, parts=2)
    return _load(parser, blocks, dtype)


def iter_svmlight(source: str | os.PathLike | Iterable[str | bytes], *,
                  chunk_rows: int = 65536, n_features: int, dtype=np.float64,
                  prefetch: int = 1) -> Iterator[tuple[sp.csr_matrix, np.ndarray]]:
    """Read svmlight text in chunks of rows (:func:`iter_libffm` without fields; the
    next ``prefetch`` chunks are read by a worker thread in the same way).

    Yields:
        ``(X, y)``: a ``(chunk, p)`` ``scipy.sparse.csr_matrix`` and its ``(chunk,)``
        float64 labels; the last chunk may be shorter.
    """
    chunks = _iterate("iter_svmlight", source, chunk_rows, n_features, None, dtype, 2,
                      prefetch)
    return ((X, y) for X, y, _ in chunks)


# -- writing --------------------------------------------------------------------------------

def _label_text(label: float) -> str:
    return str(int(label)) if float(label).is_integer() else repr(float(label))


def dump_libffm(target: str | os.PathLike, X, y, field_ids, *, header: bool = True) -> None:
    """Write ``(X, y, field_ids)`` as libffm text (explicit zeros are left out).

    Args:
        target: the file to write.
        X: ``(n, p)`` real scipy sparse matrix or 2-D dense array.
        y: ``(n,)`` real numeric labels (integral ones are written without a decimal point).
        field_ids: ``(p,)`` non-negative integer field of each feature.
        header: start with a ``# gpustat-libffm n_features=p fields=...`` line, so
            that :func:`load_libffm` restores ``p`` and the fields of features no
            row uses. ``False`` writes plain libffm (as ``ffm-train`` reads it);
            then pass ``n_features`` and ``field_ids`` when reading back.

    Values are written with Python's shortest round-trip ``repr``, so
    :func:`load_libffm` reads back the same float64 numbers. ``X`` itself is
    left as it was.

    Raises:
        TypeError: complex ``X`` or ``y``, or non-numeric ``X``.
        ValueError: ``X`` not 2-D, shapes that do not match, non-finite values,
            negative or non-integer ``field_ids``.
    """
    if sp.issparse(X):
        if X.ndim != 2:
            raise ValueError(f"dump_libffm: X must be 2-D (n, p), got {X.shape=}")
        dtype = X.dtype
    else:
        X = np.asarray(X)
        if X.ndim != 2:
            raise ValueError(f"dump_libffm: X must be 2-D (n, p), got {X.shape=}")
        dtype = X.dtype
    if np.issubdtype(dtype, np.complexfloating):
        raise TypeError(f"dump_libffm: X must be real, got {dtype=}")
    if not (np.issubdtype(dtype, np.number) or dtype == np.bool_):
        raise TypeError(f"dump_libffm: X must be numeric, got {dtype=}")
    X = sp.csr_matrix(X, copy=True)  # summing and dropping zeros below work in place
    X.sum_duplicates()
    X.eliminate_zeros()
    y = np.asarray(y)
    field_ids = np.asarray(field_ids)
    n, p = X.shape
    if np.issubdtype(y.dtype, np.complexfloating):
        raise TypeError(f"dump_libffm: y must be real, got {y.dtype=}")
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
        if header:
            unused = np.ones(p, bool)
            unused[X.indices] = False
            listed = np.flatnonzero(unused & (field_ids != 0))
            pairs = ",".join(f"{j}:{field_ids[j]}" for j in listed)
            handle.write(f"{_HEADER.decode()} n_features={p}" + (f" fields={pairs}" if pairs
                                                                  else "") + "\n")
        for r in range(n):
            start, stop = X.indptr[r], X.indptr[r + 1]
            triples = (f"{field_ids[j]}:{j}:{float(v)!r}"
                       for j, v in zip(X.indices[start:stop], X.data[start:stop], strict=True))
            handle.write(" ".join((_label_text(y[r]), *triples)) + "\n")
