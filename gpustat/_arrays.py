"""Array helpers shared by the references and the kernels: compute dtype, padding, sizes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["compute_dtype", "grid_size", "next_pow2", "nonempty", "over_row_chunks", "pad_axis",
           "pad_rows", "row_bucket", "row_weights"]


def next_pow2(n: int) -> int:
    """Smallest power of two >= max(n, 1)."""
    return 1 << max(int(n) - 1, 0).bit_length()


def grid_size(n: int, per_octave: int) -> int:
    """Smallest size >= n on a grid of ``per_octave`` equal steps between consecutive
    powers of two (a power of two is its own size; steps of at least 1): padding to it
    costs less than ``1 / per_octave`` more, and nearby sizes share one compiled program."""
    n = max(int(n), 1)
    step = max((1 << (n.bit_length() - 1)) // per_octave, 1)
    return -(-n // step) * step


def row_bucket(n: int) -> int:
    """Rows padded to (with weight 0) so that data of nearby sizes, such as
    cross-validation folds, share one compiled program: :func:`grid_size` with four
    sizes per octave (at most a quarter more rows)."""
    return grid_size(n, 4)


# bytes from which host rows are padded on the device (below, one host copy costs less
# than the joining program's compile); the joined pieces number _PIECES
_DEVICE_PADDING_BYTES = 1 << 22
_PIECES = 64


@jax.jit
def _joined(*pieces):
    return jnp.concatenate(pieces)


def pad_rows(X: np.ndarray, rows: int):
    """Host rows X (n, p) with zero rows appended up to ``rows`` (>= n).

    Small X are padded on the host (a numpy array). Larger ones go to the device in
    ``_PIECES`` pieces of rows / _PIECES rows, all but the one holding the last rows
    sent as views of X (no host copy of X), the zero pieces sent once, and are joined
    there by one program per (rows, p, dtype), which nearby n of one row bucket share.
    """
    n, p = X.shape
    if rows == n:
        return X
    piece = rows // _PIECES
    if X.nbytes < _DEVICE_PADDING_BYTES or rows % _PIECES or n < piece:
        return np.concatenate([X, np.zeros((rows - n, p), X.dtype)])
    full = n // piece
    pieces = [X[i * piece:(i + 1) * piece] for i in range(full)]
    if n > full * piece:
        pieces.append(np.concatenate([X[full * piece:],
                                      np.zeros(((full + 1) * piece - n, p), X.dtype)]))
    pieces = jax.device_put(pieces)
    if len(pieces) < _PIECES:
        pieces += [jax.device_put(np.zeros((piece, p), X.dtype))] * (_PIECES - len(pieces))
    return _joined(*pieces)


def compute_dtype(dtype) -> jnp.dtype:
    """Accumulation dtype: float64 stays float64; 16-bit and float32 compute in float32."""
    dtype = jnp.dtype(dtype)
    return jnp.dtype(jnp.float64) if dtype == jnp.float64 else jnp.dtype(jnp.float32)


def pad_axis(x: jax.Array, axis: int, multiple: int, value=0) -> jax.Array:
    """Pad ``x`` along ``axis`` up to a multiple of ``multiple`` with ``value``."""
    size = x.shape[axis]
    target = -(-size // multiple) * multiple
    if target == size:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, target - size)
    return jnp.pad(x, widths, constant_values=value)


def nonempty(x: jax.Array, axis: int = 0) -> jax.Array:
    """``x``, or zeros with ``axis`` of length 1 when ``x`` is empty (a static shape).

    Masked loads and gathers need an in-range slot even when every index is padding
    (e.g. a packed border array no atom has entries in, no BMS rows, or FM factors with
    k = 0 along the last axis); the callers mask it or it adds nothing, so the
    substitute's value never matters. A non-empty ``x`` is returned as it is (no copy)."""
    if x.size:
        return x
    shape = list(x.shape)
    shape[axis] = 1
    return jnp.zeros(shape, x.dtype)


def over_row_chunks(chunk_fn, rows_per_chunk, arrays):
    """``chunk_fn`` over row chunks of ``arrays`` (first axis n): the sum of its first output
    (a pytree) and the concatenation of the others (per-row arrays). The last chunk is
    padded with zeros (the callers' zero weights make padded rows count for nothing)."""
    n = arrays[0].shape[0]
    if n <= rows_per_chunk:
        return chunk_fn(*arrays)
    n_chunks = -(-n // rows_per_chunk)
    chunks = [jnp.pad(a, [(0, n_chunks * rows_per_chunk - n)] + [(0, 0)] * (a.ndim - 1))
              .reshape(n_chunks, rows_per_chunk, *a.shape[1:]) for a in arrays]
    shapes = jax.eval_shape(chunk_fn, *(c[0] for c in chunks))
    zero = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes[0])

    def body(total, chunk):
        total_c, *rows = chunk_fn(*chunk)
        return jax.tree.map(jnp.add, total, total_c), rows

    total, rows = jax.lax.scan(body, zero, chunks)
    return (total, *(r.reshape(-1, *r.shape[2:])[:n] for r in rows))


def row_weights(X, sample_weight):
    """(n,) row weights in X's dtype: ones when ``sample_weight`` is None."""
    return jnp.ones(X.shape[0], X.dtype) if sample_weight is None else sample_weight.astype(X.dtype)
