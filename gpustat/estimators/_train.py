"""Device-resident training of FM, FFM and FwFM: one compiled program for all epochs.

Data live on the device in a padded-row (ELL) layout, built there from the
CSR arrays: row ``r`` holds ``z`` slots of feature index, value and field;
unused slots have value 0 and index 0 (they add nothing and touch nothing).
An epoch is one compiled loop (``lax.fori_loop``) over the batches of a
host-drawn row permutation, inside a loop over epochs; ``fit`` runs the
layout and all its epochs in one call of one program (:func:`fit_epochs`).
Every row of a batch is scored with the parameters frozen at the batch start
and the batch gradient is formed sparsely (one contribution row per nonzero,
summed per feature by
:func:`gpustat.pallas.estimators.scatter_add_rows` or its reference). A
:class:`~gpustat.estimators._optim.RowwiseTransformation` (the built-in optimizers)
steps the gathered rows of the features the batch touches, parameters and
state alike, which are scattered back: a batch's cost does not depend on p.
Any other optax transformation steps the dense (p, ...) tables.

Parameters are kept with the class axis right after the feature axis so that
one feature's gradient is one contiguous table row:

* ``w0`` (C,), ``w`` (p, C);
* FM and FwFM ``V`` (p, C, k); FFM ``V`` (p, C, F, k);
* FwFM ``r`` (C, F, F), of which the upper triangle (with the diagonal) is read.

For each touched coordinate the gradient is
``(1/B) sum_rows weight_r dL/ds_r ds_r/dtheta (+ lambda theta)`` with B the
number of rows in the batch; the bias is stepped every batch, never
regularised. Shapes are bucketed (rows, features and fields to a coarse grid, nonzeros
per row to a power of two, batches by a dynamic trip count) so that fits of
similar sizes share one compiled program; padded features and fields are
never touched, so they never move.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import scipy.sparse as sp

from gpustat._arrays import grid_size, next_pow2
from gpustat._backend import resolve_backend
from gpustat._compile_ahead import compiling_ahead
from gpustat.estimators._optim import RowwiseTransformation, ftrl, lazy_adagrad, lazy_adam, lazy_sgd
from gpustat.pallas.estimators import scatter_add_rows
from gpustat.reference.estimators import scatter_add_rows_reference
from gpustat.reference.factorization import fm_pair_sum

# float32 contractions in full precision: XLA would run them as TF32 on NVIDIA GPUs.
_einsum = functools.partial(jnp.einsum, precision=jax.lax.Precision.HIGHEST)


def _contract(spec: str, a, b):
    """``jnp.einsum(spec, a, b)`` (two operands, explicit output) as a broadcast product
    summed over the contracted indices: no ``dot_general``, so XLA has no GEMM to
    autotune. For FwFM's small per-row contractions: on an H200 their autotuning took
    1.4 s of its 1.9 s compile, and this form runs as fast."""
    inputs, out = spec.split("->")
    spec_a, spec_b = inputs.split(",")
    indices = list(dict.fromkeys(spec_a + spec_b))

    def aligned(x, spec_x):
        own = [c for c in indices if c in spec_x]
        x = jnp.transpose(x, [spec_x.index(c) for c in own])
        sizes = dict(zip(own, x.shape))
        return x.reshape([sizes.get(c, 1) for c in indices])

    total = (aligned(a, spec_a) * aligned(b, spec_b)).sum(
        axis=tuple(i for i, c in enumerate(indices) if c not in out))
    kept = [c for c in indices if c in out]
    return jnp.transpose(total, [kept.index(c) for c in out])

__all__ = [
    "MODELS",
    "DeviceRows",
    "HostRows",
    "TrainConfig",
    "bucket",
    "decision_scores",
    "fit_epochs",
    "host_rows",
    "init_state",
    "make_optimizer",
    "to_device_rows",
    "touched_rows",
    "train_epoch",
    "train_epochs",
]

MODELS = ("fm", "ffm", "fwfm")
LOSSES = ("logistic", "squared", "softmax")


class DeviceRows(NamedTuple):
    """Padded-row (ELL) data on the device; the last row is always padding.

    Attributes:
        idx: (n_pad, z) int32 feature index per slot (0 in unused slots).
        val: (n_pad, z) value per slot (0 in unused slots).
        fld: (n_pad, z) int32 field of the slot's feature.
        target: (n_pad, C) training target: (smoothed) 0/1 label, regression
            target, or the smoothed one-hot softmax target.
        weight: (n_pad,) row weight, 0 on padding rows.
    """

    idx: jax.Array
    val: jax.Array
    fld: jax.Array
    target: jax.Array
    weight: jax.Array


def bucket(n: int, minimum: int) -> int:
    """Padded size for ``n``: a power of two up to 65536 (at least ``minimum``), then a
    grid of 8 steps per octave (<= 12.5 % padding). Few sizes -> few compiles."""
    if n <= 1 << 16:
        return max(next_pow2(n), minimum)
    return grid_size(n, 8)


class HostRows(NamedTuple):
    """A CSR matrix padded on the host for its one transfer (:func:`host_rows`).

    Attributes:
        z: slots per row of the layout built on the device.
        arrays: ``(indptr, indices, data, field_ids, target, weight)``, numpy;
            ``data`` is None when every stored value is 1 (one-hot rows: the
            slot values are rebuilt on the device from the row lengths).
    """

    z: int
    arrays: tuple

    @property
    def n_pad(self) -> int:
        return self.arrays[0].shape[0] - 1


def host_rows(X: sp.csr_matrix, field_ids: np.ndarray, target: np.ndarray,
              weight: np.ndarray, dtype, ones: bool | None = None) -> HostRows:
    """Pad a canonical CSR matrix (no explicit zeros, no duplicates) for its transfer.

    Rows are padded to ``n_pad = bucket(n + 1, 256)`` (at least one padding row)
    and entries to ``bucket(nnz + 1, 256)``, the field table to ``bucket(p, 16)``
    (as the parameters; no row refers to the padding); the row layout is ``z``,
    the next power of two (>= 8) of the longest row. Values, targets and
    weights are cast to ``dtype`` in the same copy. ``ones``: whether every stored value
    is 1, when the caller knows (else found here).
    """
    n = X.shape[0]
    z = max(next_pow2(int(np.diff(X.indptr).max()) if n else 1), 8)
    n_pad = bucket(n + 1, 256)
    nnz_pad = bucket(X.nnz + 1, 256)
    # padded entries lie past indptr[n]: rows n..n_pad-1 are empty
    indptr = np.full(n_pad + 1, X.nnz, np.int32)
    indptr[: n + 1] = X.indptr
    indices = np.zeros(nnz_pad, np.int32)
    indices[: X.nnz] = X.indices
    if ones is None:
        ones = not X.nnz or (X.data.min() == 1 and X.data.max() == 1)
    data = None
    if not ones:
        data = np.zeros(nnz_pad, dtype)
        data[: X.nnz] = X.data
    tgt = np.zeros((n_pad, target.shape[1]), dtype)
    tgt[:n] = target
    wgt = np.zeros(n_pad, dtype)
    wgt[:n] = weight
    fields = np.zeros(bucket(X.shape[1], 16), np.int32)  # the parameters' feature bucket
    fields[: X.shape[1]] = field_ids
    return HostRows(z, (indptr, indices, data, fields, tgt, wgt))


def to_device_rows(X: sp.csr_matrix, field_ids: np.ndarray, target: np.ndarray,
                   weight: np.ndarray, dtype, ones: bool | None = None) -> DeviceRows:
    """Pack a canonical CSR matrix (no explicit zeros, no duplicates) for the device.

    The CSR arrays go to the device as they are (``indptr``, ``indices``,
    ``data``, padded to a bucketed length by :func:`host_rows`) in one
    transfer with the fields, targets and weights; the padded-row layout and
    the slot fields are built there (:func:`_ell_layout`).

    Args:
        X: (n, p) CSR matrix with sorted, duplicate-free indices and no explicit zeros.
        field_ids: (p,) int field of each feature.
        target: (n, C) training targets.
        weight: (n,) row weights.
        dtype: float dtype of values, targets and weights.
        ones: whether every stored value is 1, when the caller knows (:func:`host_rows`).

    Returns:
        :class:`DeviceRows` with ``n_pad = bucket(n + 1, 256)`` rows (at least
        one padding row) and ``z`` the next power of two (>= 8) of the largest
        row length.
    """
    rows = host_rows(X, field_ids, target, weight, dtype, ones)
    return _ell_layout(rows.z, *jax.device_put(rows.arrays))


def _layout(z: int, indptr, indices, data, field_ids, target, weight) -> DeviceRows:
    """CSR (rows padded to n_pad, entries to nnz_pad) -> :class:`DeviceRows` of width z.

    A gather: slot ``s`` of row ``r`` reads entry ``indptr[r] + s`` when that lies
    before ``indptr[r + 1]``; ``data`` None means every value is 1.
    """
    pos = indptr[:-1, None] + jnp.arange(z, dtype=jnp.int32)[None, :]
    real = pos < indptr[1:, None]
    pos = jnp.where(real, pos, 0)
    idx = jnp.where(real, indices[pos], 0)
    values = real.astype(target.dtype) if data is None else jnp.where(real, data[pos], 0)
    return DeviceRows(idx, values, field_ids[idx], target, weight)


_ell_layout = jax.jit(_layout, static_argnums=0)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Static settings of the compiled epoch (hashable: it keys the compile cache).

    Attributes:
        model: "fm", "ffm" or "fwfm".
        loss: "logistic", "squared" or "softmax".
        n_features: p of the (padded) parameter arrays.
        n_fields: F of the (padded) parameter arrays (1 for FM).
        batch_size: B.
        tx: the optax transformation.
        lazy: pass the touched masks to ``tx`` (the built-in optimizers).
        l2_linear: L2 on ``w`` coupled into the gradient (0 for FTRL, which has its own).
        l2_factors: L2 on ``V`` and ``r`` likewise.
        backend: "pallas", "interpret" or "reference" for the gradient scatter.
    """

    model: str
    loss: str
    n_features: int
    n_fields: int
    batch_size: int
    tx: optax.GradientTransformation
    lazy: bool
    l2_linear: float
    l2_factors: float
    backend: str

    @property
    def sparse(self) -> bool:
        """Step only the touched rows (a row-wise built-in optimizer)."""
        return isinstance(self.tx, RowwiseTransformation)


@functools.lru_cache(maxsize=64)  # equal settings -> the same tx -> compiled epochs are reused
def make_optimizer(name, *, model, learning_rate, beta_1, beta_2, epsilon, ftrl_beta, l1_linear,
                   l1_factors, l2_linear, l2_factors):
    """The optax transformation for an optimizer name, or a user's transformation.

    ``model`` ("fm", "ffm", "fwfm") names the parameter groups FTRL's L1/L2 apply to.

    Returns:
        ``(tx, lazy, coupled_l2)``: the transformation, whether it takes the
        touched masks, and the (l2_linear, l2_factors) to add to the gradient.
    """
    if isinstance(name, optax.GradientTransformation):
        # transformations taking extra arguments get the touched masks (gpustat's
        # lazy ones use them; optax's own ignore them: dense semantics)
        return name, isinstance(name, optax.GradientTransformationExtraArgs), \
            (l2_linear, l2_factors)
    if name == "sgd":
        return lazy_sgd(learning_rate), True, (l2_linear, l2_factors)
    if name == "adagrad":
        return lazy_adagrad(learning_rate), True, (l2_linear, l2_factors)
    if name == "adam":
        return lazy_adam(learning_rate, beta_1, beta_2, epsilon), True, (l2_linear, l2_factors)
    if name == "ftrl":
        l1 = {"w0": 0.0, "w": l1_linear, "V": l1_factors}
        l2 = {"w0": 0.0, "w": l2_linear, "V": l2_factors}
        if model == "fwfm":
            l1["r"], l2["r"] = l1_factors, l2_factors
        return ftrl(learning_rate, ftrl_beta, l1, l2), True, (0.0, 0.0)
    raise ValueError(f"optimizer must be 'sgd', 'adagrad', 'adam', 'ftrl' or an optax "
                     f"GradientTransformation, got {name!r}")


# ---------------------------------------------------------------- model math


def _symmetric_r(r):
    """(C, F, F) -> r_sym with r_sym[c, a, b] = r[c, min(a, b), max(a, b)]."""
    upper = jnp.triu(r)
    return upper + jnp.swapaxes(jnp.triu(r, 1), -1, -2)


def _upper_from_ordered(m):
    """Gradient on the read upper triangle from a sum over ordered field pairs."""
    f = m.shape[-1]
    a = jnp.arange(f)
    both = m + jnp.swapaxes(m, -1, -2)
    return jnp.where(a[:, None] < a[None, :], both, jnp.where(a[:, None] == a[None, :], m, 0.0))


def _pair_weights(val):
    """(B, z, z) x_a x_b for a != b (unused slots have x = 0)."""
    z = val.shape[1]
    off_diag = ~jnp.eye(z, dtype=bool)
    return jnp.where(off_diag, val[:, :, None] * val[:, None, :], 0.0)


def _scores(model, params, idx, val, fld):
    """(B, C) scores and the intermediates the gradient reuses."""
    lin = _einsum("bz,bzc->bc", val, params["w"][idx])
    base = params["w0"][None, :] + lin
    if model == "fm":
        xv = val[:, :, None, None] * params["V"][idx]  # (B, z, C, k)
        q = xv.sum(axis=1)  # (B, C, k)
        # the pair term scaled per row and factor (no overflow of q**2 where it fits)
        return base + fm_pair_sum(xv, axis=1), (xv, q)
    pw = _pair_weights(val)
    if model == "ffm":
        # vp[b, a, d] = V[idx_a, :, fld_d, :]: the factor feature a uses against d's field
        vp = params["V"][idx[:, :, None], :, fld[:, None, :], :]  # (B, z, z, C, k)
        dots = _einsum("badck,bdack->badc", vp, vp)
        return base + 0.5 * _einsum("bad,badc->bc", pw, dots), (vp, pw)
    xv = val[:, :, None, None] * params["V"][idx]  # (B, z, C, k)
    r_pair = jnp.moveaxis(_symmetric_r(params["r"]), 0, -1)[fld[:, :, None], fld[:, None, :]]
    off_diag = ~jnp.eye(val.shape[1], dtype=bool)[None, :, :, None]
    # pairs a != d only: the diagonal of both factors is zeroed
    r_pair = jnp.where(off_diag, r_pair, 0.0)  # (B, z, z, C)
    dots = jnp.where(off_diag, _contract("back,bdck->badc", xv, xv), 0.0)  # x_a x_d <v_a, v_d>
    return base + 0.5 * (r_pair * dots).sum(axis=(1, 2)), (xv, r_pair, dots)


def _loss_grad_and_value(loss, s, target):
    """dL/ds (B, C) and the per-row loss (B,)."""
    if loss == "logistic":
        value = jnp.maximum(s, 0) - s * target + jnp.log1p(jnp.exp(-jnp.abs(s)))
        return jax.nn.sigmoid(s) - target, value[:, 0]
    if loss == "squared":
        return s - target, 0.5 * ((s - target) ** 2)[:, 0]
    log_p = jax.nn.log_softmax(s, axis=-1)
    return jnp.exp(log_p) - target, -(target * log_p).sum(-1)


def _contributions(cfg: TrainConfig, params, idx, val, fld, coef, cache):
    """The batch gradient before it is summed per feature.

    ``coef`` (B, C) is weight_r dL/ds_r / B. Returns ``(small, r_touched, lin,
    factor_rows)``: the gradients of the small leaves (``w0``; FwFM's ``r``),
    FwFM's touched mask of ``r`` (else None), and two (B z, .) tables with one
    row per slot: ``lin`` holds the linear gradient (C), a touch count (1) and
    FFM's per-field touch counts (F); ``factor_rows`` the factor gradient.
    """
    bsz, z = idx.shape
    present = (val != 0).astype(val.dtype)  # (B, z)
    lin_rows = [coef[:, None, :] * val[:, :, None], present[:, :, None]]
    small = {"w0": coef.sum(axis=0)}
    r_touched = None
    if cfg.model == "fm":
        xv, q = cache
        dv = val[:, :, None, None] * q[:, None] - xv * val[:, :, None, None]
        factor_rows = coef[:, None, :, None] * dv  # (B, z, C, k)
    elif cfg.model == "ffm":
        vp, pw = cache
        onehot = jax.nn.one_hot(fld, cfg.n_fields, dtype=val.dtype)  # (B, z, F)
        # slot (idx_a, f) collects x_a x_d V[idx_d, f_a] over partners d in field f:
        # weight the partners first, then sum them per field (one small batched
        # matmul per row; no (B, z, z, F, k) intermediate)
        weighted = pw[:, :, :, None, None] * jnp.swapaxes(vp, 1, 2) * coef[:, None, None, :, None]
        factor_rows = _einsum("badck,bdf->bacfk", weighted, onehot)
        partners = (pw != 0).astype(val.dtype)
        lin_rows.append(_einsum("bad,bdf->baf", partners, onehot))  # slot touch counts
    else:
        xv, r_pair, dots = cache
        dv = val[:, :, None, None] * _contract("badc,bdck->back", r_pair, xv)
        factor_rows = coef[:, None, :, None] * dv
        onehot = jax.nn.one_hot(fld, cfg.n_fields, dtype=val.dtype)
        # ordered[c, f, g] = 1/2 sum_rows coef sum_{a != d} dots[a, d] [f_a = f][f_d = g],
        # contracted in two steps (partner fields first) to keep intermediates small
        per_field = _contract("badc,bdg->bacg", dots, onehot) * coef[:, None, :, None]
        small["r"] = _upper_from_ordered(0.5 * _contract("baf,bacg->cfg", onehot, per_field))
        partners = (_pair_weights(present) != 0).astype(val.dtype)
        pair_fields = _contract("bad,bdg->bag", partners, onehot)
        pair_counts = _upper_from_ordered(_contract("baf,bag->fg", onehot, pair_fields))
        r_touched = (pair_counts > 0)[None]
    lin = jnp.concatenate([r.reshape(bsz * z, -1) for r in lin_rows], axis=1)
    return small, r_touched, lin, factor_rows.reshape(bsz * z, -1)


def _summed(cfg: TrainConfig, contributions, slot_rows, n_rows: int):
    """Sum the slot contributions into ``n_rows`` gradient rows (slot e -> row
    ``slot_rows[e]``). Returns (grads, touched), both pytrees shaped like the
    parameters with ``n_rows`` feature rows (touched leaves broadcast)."""
    small, r_touched, lin, factor_rows = contributions
    scatter = _scatter_fn(cfg.backend)
    return _unpacked(cfg, small, r_touched, scatter(slot_rows, lin, n_rows),
                     scatter(slot_rows, factor_rows, n_rows))


def _unpacked(cfg: TrainConfig, small, r_touched, aux, factors):
    """(grads, touched) of summed rows: ``aux`` (rows, C + 1 [+ F]) holds the linear
    gradient and the touch counts, ``factors`` (rows, C [F] k) the factor gradient
    (the two tables :func:`_contributions` emits, summed per feature row)."""
    n_rows = aux.shape[0]
    n_classes = small["w0"].shape[0]
    grads = dict(small)
    grads["w"] = aux[:, :n_classes]
    feature_touched = (aux[:, n_classes] > 0)[:, None]
    touched = {"w0": jnp.ones((1,), bool), "w": feature_touched}
    if cfg.model == "ffm":
        grads["V"] = factors.reshape(n_rows, n_classes, cfg.n_fields, -1)
        touched["V"] = (aux[:, n_classes + 1:] > 0)[:, None, :, None]
    else:
        grads["V"] = factors.reshape(n_rows, n_classes, -1)
        touched["V"] = feature_touched[:, :, None]
    if cfg.model == "fwfm":
        touched["r"] = r_touched
    return grads, touched


def _gradients(cfg: TrainConfig, params, idx, val, fld, coef, cache):
    """Dense batch gradient (data part) and touched masks.

    ``coef`` (B, C) is weight_r dL/ds_r / B. Returns (grads, touched), both
    pytrees shaped like ``params`` (touched leaves broadcast).
    """
    contributions = _contributions(cfg, params, idx, val, fld, coef, cache)
    return _summed(cfg, contributions, idx.reshape(-1), cfg.n_features)


def _scatter_fn(backend):
    if backend == "reference":
        return scatter_add_rows_reference
    return functools.partial(scatter_add_rows, interpret=backend == "interpret")


def _add_l2(cfg: TrainConfig, grads, touched, params):
    """Couple L2 into the gradient of touched coordinates (w: l2_linear; V, r: l2_factors)."""
    out = dict(grads)
    for name, lam in (("w", cfg.l2_linear), ("V", cfg.l2_factors), ("r", cfg.l2_factors)):
        if name in grads and lam:
            out[name] = jnp.where(touched[name], grads[name] + lam * params[name], grads[name])
    return out


def _batch_inputs(cfg: TrainConfig, params, idx, val, fld, target, weight, count):
    """The batch's slots with ``coef`` = weight_r dL/ds_r / B, and its weighted loss.

    ``idx`` indexes the feature rows of ``params`` (all of them, or the gathered ones).
    """
    s, cache = _scores(cfg.model, params, idx, val, fld)
    dlds, row_loss = _loss_grad_and_value(cfg.loss, s, target)
    coef = dlds * (weight / count)[:, None]
    return (idx, val, fld, coef, cache), (weight * row_loss).sum()


def _dense_step(cfg: TrainConfig, params, opt_state, data: DeviceRows, rows, count):
    """A step of a user's transformation: the full (p, ...) gradient, zero off the batch."""
    inputs, batch_loss = _batch_inputs(cfg, params, *(leaf[rows] for leaf in data), count)
    grads, touched = _gradients(cfg, params, *inputs)
    grads = _add_l2(cfg, grads, touched, params)
    if cfg.lazy:
        updates, opt_state = cfg.tx.update(grads, opt_state, params, touched=touched)
    else:
        updates, opt_state = cfg.tx.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    return params, opt_state, batch_loss


_ROW_LEAVES = ("w", "V")  # leaves with a feature axis; w0 and r are stepped whole


def _gather_rows(tree, uniq):
    """The rows ``uniq`` of the feature-axis leaves (zeros at the fill index p)."""
    return {name: leaf.at[uniq].get(mode="fill", fill_value=0) if name in _ROW_LEAVES else leaf
            for name, leaf in tree.items()}


def _scatter_rows(tree, rows, uniq, ids_sorted: bool = True):
    """``tree`` with the rows ``uniq`` of its feature-axis leaves replaced by ``rows``
    (the fill index p is out of range: dropped)."""
    return {name: leaf.at[uniq].set(rows[name], mode="drop", indices_are_sorted=ids_sorted)
            if name in _ROW_LEAVES else rows[name] for name, leaf in tree.items()}


def _state_map(fn, state, *others):
    """Apply ``fn`` to each parameter-shaped field of a row-wise transformation's state."""
    return type(state)(*(fn(*fields) for fields in zip(state, *others)))


def touched_rows(idx, n_rows: int):
    """The rows ``idx`` (values in ``[0, n_rows]``) touches and each entry's position.

    Returns ``(uniq, local)``: the sorted unique ids padded with the out-of-range
    ``n_rows`` to the static size ``min(idx.size, n_rows + 1)``, and ``local`` shaped like
    ``idx``. With at least ``n_rows + 1`` entries the list is every row, ``arange(n_rows +
    1)`` and ``local = idx`` (no sort: the list could not be shorter; untouched rows get no
    gradient and the lazy step leaves them alone).
    """
    if idx.size >= n_rows + 1:
        return jnp.arange(n_rows + 1, dtype=idx.dtype), idx
    uniq, inverse = jnp.unique(idx.reshape(-1), size=idx.size, fill_value=n_rows,
                               return_inverse=True)
    return uniq, inverse.reshape(idx.shape)


def _sparse_step(cfg: TrainConfig, params, opt_state, data: DeviceRows, rows, count):
    """A step of a row-wise transformation on the rows of the features the batch touches.

    The batch's feature indices are made unique (:func:`touched_rows`: a fixed size,
    ``min(B z, p + 1)``, padded with the out-of-range index p) and the rows of the
    parameters gathered once; the
    batch is scored on them (slot indices into the gathered rows), its slot
    contributions are summed into them, and they and the gathered rows of the
    state are stepped and scattered back. Untouched gathered rows (the padding
    slots' feature) come back unchanged, as the lazy transformation leaves them.
    """
    uniq, local = touched_rows(data.idx[rows], cfg.n_features)
    sub = _gather_rows(params, uniq)
    inputs, batch_loss = _batch_inputs(cfg, sub, local, data.val[rows], data.fld[rows],
                                       data.target[rows], data.weight[rows], count)
    grads, touched = _summed(cfg, _contributions(cfg, sub, *inputs), local.reshape(-1),
                             uniq.shape[0])
    params, opt_state = _step_rows(cfg, params, opt_state, uniq, sub, grads, touched)
    return params, opt_state, batch_loss


def _step_rows(cfg: TrainConfig, params, opt_state, uniq, sub, grads, touched,
               ids_sorted: bool = True):
    """Step the rows ``uniq`` (distinct in-range ids, sorted where ``ids_sorted``; entries
    out of range are skipped) of the parameters and of the row-wise state, given their
    gathered parameter rows ``sub`` and the batch's summed (grads, touched) on them; the
    rest is left unchanged."""
    sub_state = _state_map(lambda field: _gather_rows(field, uniq), opt_state)
    grads = _add_l2(cfg, grads, touched, sub)
    updates, sub_state = cfg.tx.update(grads, sub_state, sub, touched=touched)
    sub = optax.apply_updates(sub, updates)
    params = _scatter_rows(params, sub, uniq, ids_sorted)
    opt_state = _state_map(lambda full, part: _scatter_rows(full, part, uniq, ids_sorted),
                           opt_state, sub_state)
    return params, opt_state


def _batch_step(cfg: TrainConfig, params, opt_state, data: DeviceRows, rows, count):
    step = _sparse_step if cfg.sparse else _dense_step
    return step(cfg, params, opt_state, data, rows, count)


def _epochs(cfg: TrainConfig, params, opt_state, data: DeviceRows, orders, counts, n_batches,
            n_epochs):
    def epoch(e, carry):
        def body(b, carry):
            params, opt_state, losses = carry
            params, opt_state, batch_loss = _batch_step(cfg, params, opt_state, data,
                                                        orders[e, b], counts[b])
            return params, opt_state, losses.at[e].add(batch_loss)

        return jax.lax.fori_loop(0, n_batches, body, carry)

    losses = jnp.zeros(orders.shape[0], data.val.dtype)  # one weighted loss sum per epoch
    return jax.lax.fori_loop(0, n_epochs, epoch, (params, opt_state, losses))


# XLA's fusion autotuner times candidate emitters for the training programs' small
# reductions (16 KiB each) while it compiles them. On an H200 (1M rows) it adds 0.02 /
# 0.09 / 0.14 s to the FM / FFM / FwFM program's compile and makes FwFM's epoch 3%
# faster (37.7 against 38.7 ms), FM's and FFM's no faster: it runs for FwFM only.
_AUTOTUNED_MODELS = frozenset({"fwfm"})
_UNTUNED = {"xla_gpu_experimental_enable_fusion_autotuner": False}


def _jitted(fn, **kwargs) -> dict:
    """``{autotuned: program}``: ``fn`` jitted with and without XLA's fusion autotuner."""
    return {tuned: jax.jit(fn, **kwargs, compiler_options=None if tuned else _UNTUNED)
            for tuned in (False, True)}


_train_epochs = _jitted(_epochs, static_argnums=0)
# the same program with the parameters and state donated: their buffers hold the result
# (a table near the device's memory has no room for a second copy)
_train_epochs_donated = _jitted(_epochs, static_argnums=0, donate_argnums=(1, 2))


def _fit_epochs(cfg: TrainConfig, z: int, params, opt_state, csr, orders, counts, n_batches,
                n_epochs):
    """:func:`_layout` of the transferred CSR arrays, then the epochs: one program.
    ``opt_state=None`` starts the transformation's state inside it."""
    if opt_state is None:
        opt_state = cfg.tx.init(params)
    return _epochs(cfg, params, opt_state, _layout(z, *csr), orders, counts, n_batches,
                   n_epochs)


_fit_epochs_programs = _jitted(_fit_epochs, static_argnums=(0, 1))


def _fit_program(cfg: TrainConfig):
    """The compiled :func:`_fit_epochs` of ``cfg``'s model."""
    return _fit_epochs_programs[cfg.model in _AUTOTUNED_MODELS]


@functools.partial(jax.jit, static_argnums=0)
def init_state(tx: optax.GradientTransformation, params):
    """``tx.init(params)`` as one compiled program (reused for equal ``tx`` and shapes)."""
    return tx.init(params)


def _plan_sizes(batch_size: int, n_pad: int, n_orders: int) -> tuple[int, int, int]:
    """``(batch rows, order slots per epoch, padded epochs)`` of :func:`_epoch_plan`."""
    # a batch larger than the data is one batch of every row (B = n either way): without
    # the clip each step would score batch_size padding rows (65536 for 1000 rows)
    bsz = min(batch_size, n_pad)
    slots = -(-n_pad // bsz) * bsz  # static: one compile per row bucket
    # epochs padded to a power of two, at least 16 while that stays under 256K slots
    # (one compile serves max_iter = 1..16 on small data; big data pay no extra transfer)
    small_data_epochs = min(16, next_pow2((1 << 18) // slots + 1) // 2)
    return bsz, slots, max(next_pow2(n_orders), small_data_epochs)


def _plan_shapes(batch_size: int, n_pad: int, n_orders: int, dtype) -> tuple:
    """The shapes and dtypes of :func:`_epoch_plan`'s arrays for ``n_orders`` orders."""
    bsz, slots, e_pad = _plan_sizes(batch_size, n_pad, n_orders)
    return (jax.ShapeDtypeStruct((e_pad, slots // bsz, bsz), np.int32),
            jax.ShapeDtypeStruct((slots // bsz,), dtype), jax.ShapeDtypeStruct((), np.int32),
            jax.ShapeDtypeStruct((), np.int32))


def _signature(tree) -> tuple:
    """What of ``tree`` keys a compiled program: its structure, and each leaf's shape,
    dtype and placement."""
    leaves, treedef = jax.tree.flatten(tree)
    return treedef, tuple((np.shape(x), np.dtype(getattr(x, "dtype", type(x))),
                           getattr(x, "sharding", None)) for x in leaves)


def _epoch_plan(batch_size: int, n_pad: int, orders, dtype):
    """Device inputs of :func:`_epochs` for the row orders ``orders`` (each of length n).

    Returns ``(orders (e_pad, slots / B, B), counts (slots / B,) in dtype, n_batches,
    n_epochs)`` on the device.
    """
    bsz, slots, e_pad = _plan_sizes(batch_size, n_pad, len(orders))
    n = len(orders[0])
    n_batches = -(-n // bsz)
    # the last row is padding (weight 0): it fills the tail of the last batch and the
    # unused epochs
    padded = np.full((e_pad, slots), n_pad - 1, np.int32)
    for e, order in enumerate(orders):
        padded[e, :n] = order
    counts = np.full(slots // bsz, bsz)
    counts[n_batches - 1] = n - (n_batches - 1) * bsz
    return jax.device_put((padded.reshape(e_pad, -1, bsz), counts.astype(dtype),
                           np.int32(n_batches), np.int32(len(orders))))


def train_epochs(cfg: TrainConfig, params, opt_state, data: DeviceRows, orders, *,
                 donate: bool = False):
    """Epochs over the rows in each of ``orders`` (contiguous batches of ``cfg.batch_size``).

    One compiled program runs them all (a loop over epochs around the loop over
    batches); the epoch count and the batch count are dynamic trip counts, so
    the compile is shared by every fit in the same shape bucket.

    Args:
        cfg: static settings.
        params: internal-layout parameters (device arrays).
        opt_state: the transformation's state.
        data: the training rows.
        orders: sequence of (n,) row visit orders, one per epoch (same n).
        donate: reuse the buffers of ``params`` and ``opt_state`` for the result
            (they must not be used after the call).

    Returns:
        ``(params, opt_state, losses)``: ``losses`` (e_pad,) holds each epoch's
        weighted loss sum over its rows (taken at each batch's frozen
        parameters) in its first ``len(orders)`` entries.
    """
    plan = _epoch_plan(cfg.batch_size, data.idx.shape[0], orders, data.val.dtype)
    run = (_train_epochs_donated if donate else _train_epochs)[cfg.model in _AUTOTUNED_MODELS]
    return run(cfg, params, opt_state, data, *plan)


def train_epoch(cfg: TrainConfig, params, opt_state, data: DeviceRows, order: np.ndarray, *,
                donate: bool = False):
    """One epoch over the rows in ``order``: :func:`train_epochs` with one order; the
    loss is the epoch's weighted loss sum (a scalar)."""
    params, opt_state, losses = train_epochs(cfg, params, opt_state, data, [order],
                                             donate=donate)
    return params, opt_state, losses[0]


# row-order slots held per call of the fused program (int32 on the host and the device)
_ORDER_SLOTS = 1 << 26
# from this many (padded) rows a call runs one epoch: the device starts on the first
# epoch while the host draws the next epochs' orders (numpy permutes 1M rows in ~28 ms
# on an H200 machine's host, most of a FM epoch's 33 ms there)
_EPOCH_PER_CALL_ROWS = 1 << 19


def fit_epochs(cfg: TrainConfig, params, opt_state, rows: HostRows, orders, epochs: int):
    """Transfer ``rows`` once and run an epoch per order of ``orders``, an iterator of
    ``epochs`` row orders.

    Each call of the compiled program builds the row layout from the CSR arrays
    and runs a power-of-two group of epochs (all of them unless their row orders
    would pass ``_ORDER_SLOTS``; one from ``_EPOCH_PER_CALL_ROWS`` rows); orders are
    drawn group by group, never all held at once. ``opt_state=None`` starts the
    transformation's state in the same program when the epochs make one group, so
    such a fit compiles one program; with one epoch per call it starts in
    :func:`init_state` first, so that every call runs the same program. The first fit
    of its settings and shapes in the process compiles its programs side by side
    while the rows go to the device and the first order is drawn.

    Returns:
        ``(params, opt_state, losses)``: ``losses`` a list of ``(sums, count)``,
        per group the device array of its epochs' weighted loss sums (padded:
        the first ``count`` are real, in order). Nothing is copied to the host.
    """
    per_call = rows.n_pad >= _EPOCH_PER_CALL_ROWS
    group = 1 if per_call else _ORDER_SLOTS // rows.n_pad
    group = min(next_pow2(group + 1) // 2, epochs)  # the largest power of two <= group
    if not group:
        return params, opt_state, []
    dtype = rows.arrays[4].dtype
    program = _fit_program(cfg)
    csr_shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), rows.arrays)
    plan_shapes = _plan_shapes(cfg.batch_size, rows.n_pad, group, dtype)
    key = ("fm.fit_epochs", cfg, rows.z, per_call, _signature((params, opt_state)),
           _signature(csr_shapes), _signature(plan_shapes),
           jax.dtypes.canonicalize_dtype(np.float64))
    with compiling_ahead(key) as ahead:
        if ahead is not None:
            state = ahead(init_state, cfg.tx, params) if per_call and opt_state is None \
                else opt_state
            ahead(program, cfg, rows.z, params, state, csr_shapes, *plan_shapes)
        csr = jax.device_put(rows.arrays)
        chunk = list(itertools.islice(orders, group))
        plan = _epoch_plan(cfg.batch_size, rows.n_pad, chunk, dtype)
    if per_call and opt_state is None:
        opt_state = init_state(cfg.tx, params)
    losses = []
    while chunk:
        params, opt_state, sums = program(cfg, rows.z, params, opt_state, csr, *plan)
        losses.append((sums, len(chunk)))
        if chunk := list(itertools.islice(orders, group)):
            plan = _epoch_plan(cfg.batch_size, rows.n_pad, chunk, dtype)
    return params, opt_state, losses


@functools.partial(jax.jit, static_argnums=(0, 2))
def _decision_scores(model, params, chunk, idx, val, fld):
    n_pad, z = idx.shape

    def one(args):
        return _scores(model, params, *args)[0]

    shaped = [a.reshape(n_pad // chunk, chunk, z) for a in (idx, val, fld)]
    return jax.lax.map(one, shaped).reshape(n_pad, -1)


def decision_scores(model: str, params, data: DeviceRows) -> jax.Array:
    """(n_pad, C) scores of every row of ``data`` (padding rows included), on the device."""
    n_pad, z = data.idx.shape
    # rows per mapped chunk: bounds the (chunk, z, z, C, k) pair tensors of FFM/FwFM
    chunk = max(1, min(n_pad, (1 << 21) // (z * z)))
    while n_pad % chunk:
        chunk //= 2
    return _decision_scores(model, params, chunk, data.idx, data.val, data.fld)


def scatter_backend(backend: str) -> str:
    """Resolve the estimators' ``backend=`` to the gradient scatter's path."""
    return resolve_backend(backend, op="estimators.fit", capability="estimators",
                           shape_class="scatter")
