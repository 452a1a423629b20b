r"""Factorization machine scores (FM, FFM, FwFM) on CSR or dense rows, differentiable.

For a row with nonzeros :math:`x_i` (feature :math:`i`, field :math:`f(i)`):

* FM (Rendle, "Factorization Machines", ICDM 2010):
  :math:`s = w_0 + \sum_i w_i x_i + \sum_{i<j} \langle v_i, v_j\rangle x_i x_j`,
  computed as :math:`\tfrac12 \sum_t [(\sum_i V_{it} x_i)^2 - \sum_i V_{it}^2 x_i^2]`.
* FFM (Juan, Zhuang, Chin, Lin, "Field-aware Factorization Machines for CTR
  Prediction", RecSys 2016): :math:`s = w_0 + \sum_i w_i x_i + \sum_{i<j}
  \langle V_{i, f(j)}, V_{j, f(i)}\rangle x_i x_j` (bias and linear term kept,
  same-field pairs included).
* FwFM (Pan et al., "Field-weighted Factorization Machines for Click-Through
  Rate Prediction in Display Advertising", WWW 2018): :math:`s = w_0 + \sum_i w_i x_i
  + \sum_{i<j} r_{f(i) f(j)} \langle v_i, v_j\rangle x_i x_j` with
  :math:`r_{ab} = R_{\min(a,b),\max(a,b)}` (upper triangle of ``R`` read).

An empty row scores ``w0``; exact zeros are skipped (dense input behaves like
CSR input). Parameters with a leading class axis ``c`` give ``(n, c)`` logits.

**Range**: FM's pair term is scaled per row and factor by a power of two near
:math:`\max_i |V_{it} x_i|`, so :math:`(\sum_i V_{it} x_i)^2` cannot overflow
where the score fits (values near 1e20 in float32); FFM and FwFM multiply each
factor by its value before the dot (``docs/factorization.md``, "Range").

**Gradients** (what training calls): every ``*_predict`` is differentiable with
``jax.grad``/``jax.vjp`` with respect to ``w0, w, V, R`` and the values of ``X``
through a custom VJP (:func:`gpustat.factorization._vjp.scores_with_vjp`) whose
backward is the closed form of the scores, never autodiff through a kernel. To
differentiate with respect to a CSR's values use ``X.with_data(d)``.

**Validation**: shapes and dtypes are checked at trace time; value checks
(``field_ids`` in range, finite parameters and dense ``X``) run only on
concrete arrays and are skipped for tracers inside ``jax.jit``. A :class:`CSR`
is validated once, when it is built.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from gpustat._backend import factorization_shape_class, resolve_backend
from gpustat._checks import as_array
from gpustat.csr import CSR, check_field_ids, dense_as_csr
from gpustat.factorization._vjp import scores_with_vjp
from gpustat.pallas import factorization as kernels
from gpustat.reference import factorization as reference

__all__ = ["CSR", "ffm_predict", "fm_predict", "fwfm_predict"]


# -- forward functions (stable identities: they are static arguments of the custom VJP) ------

def _reference_forward(model: str):
    def forward(X, field_ids, w0, w, V, R):
        if model == "fm":
            return reference.fm_scores(X, w0, w, V)
        if model == "ffm":
            return reference.ffm_scores(X, field_ids, w0, w, V)
        return reference.fwfm_scores(X, field_ids, w0, w, V, R)
    return forward


def _kernel_forward(model: str, interpret: bool, class_axis: str | None):
    def forward(X, field_ids, w0, w, V, R):
        if model == "fm":
            return kernels.fm_scores(X, w0, w, V, interpret=interpret)
        if model == "ffm":
            return kernels.ffm_scores(X, field_ids, w0, w, V, interpret=interpret)
        return kernels.fwfm_scores(X, field_ids, w0, w, V, R, interpret=interpret,
                                   class_axis=class_axis)
    return forward


# name of the vmap over classes in multiclass calls (the FwFM kernel reduces over it)
_CLASS_AXIS = "classes"


@functools.cache
def _forward(model: str, backend: str, class_axis: str | None = None):
    if backend == "reference":
        return _reference_forward(model)
    if backend == "triton":
        from gpustat.triton.factorization import scores_forward

        return scores_forward(model)
    return _kernel_forward(model, backend == "interpret", class_axis)


# -- validation ------------------------------------------------------------------------------

def _is_concrete(x) -> bool:
    return not isinstance(x, jax.core.Tracer)


@jax.jit
def _finite_flags_program(arrays: tuple) -> jax.Array:
    return jnp.stack([jnp.all(jnp.isfinite(a)) for a in arrays])


def _finite_flags(arrays: tuple) -> np.ndarray:
    """Whether each concrete array is all finite, reduced where the arrays live (one program,
    one sync): a host copy of ``V`` for this check would cost many times the FM kernel.
    Evaluated now even when called while an enclosing ``jax.jit`` traces."""
    with jax.ensure_compile_time_eval():
        return jax.device_get(_finite_flags_program(arrays))


def _as_rows(op: str, X) -> CSR:
    """A CSR (as given, converted from scipy, or a view of a dense array)."""
    if isinstance(X, CSR):
        return X
    try:
        import scipy.sparse as sp

        if sp.issparse(X):
            return CSR.from_scipy(X)
    except ImportError:  # pragma: no cover - scipy is a dependency
        pass
    x = as_array(X, "X", op=op)
    if x.ndim != 2:
        raise ValueError(f"{op}: X must be a CSR or a 2-D (n, p) array, got {x.shape=}")
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"{op}: X must hold floating values, got {x.dtype=}")
    if _is_concrete(x) and not _finite_flags((x,))[0]:
        raise ValueError(f"{op}: X must be finite; it holds NaN or inf")
    return dense_as_csr(x)


def _check_params(op: str, model: str, p: int, field_ids, w0, w, V, R):
    """Shapes/dtypes of the parameters; returns (params as arrays, n_classes or None)."""
    w = as_array(w, "w", op=op)
    if w.ndim not in (1, 2):
        raise ValueError(f"{op}: w must be (p,) or, multiclass, (c, p), got {w.shape=}")
    classes = w.shape[:-1]
    if classes == (0,):
        raise ValueError(f"{op}: w must have at least one class, got {w.shape=}")
    w0 = as_array(w0, "w0", op=op)
    V = as_array(V, "V", op=op)
    R = None if R is None else as_array(R, "R", op=op)
    v_tail = "p, f, k" if model == "ffm" else "p, k"
    v_ndim = len(classes) + (3 if model == "ffm" else 2)
    lead = f"{classes[0]}, " if classes else ""
    if w0.shape != classes:
        raise ValueError(f"{op}: w0 must have shape {classes} to match w, got {w0.shape=}")
    if w.shape[-1] != p:
        raise ValueError(f"{op}: w must have p={p} entries (X has {p} columns), got {w.shape=}")
    if V.ndim != v_ndim or V.shape[: len(classes)] != classes or V.shape[len(classes)] != p:
        raise ValueError(f"{op}: V must have shape ({lead}{v_tail}) with p={p}, got {V.shape=}")
    if model == "fwfm":
        if R is None:
            raise ValueError(f"{op}: R (the ({lead}f, f) field-pair weights) is required")
        f = R.shape[-1] if R.ndim else 0
        if R.shape != (*classes, f, f):
            raise ValueError(f"{op}: R must have shape ({lead}f, f), got {R.shape=}")
    given = {name: value for name, value in (("w0", w0), ("w", w), ("V", V), ("R", R))
             if value is not None}
    for name, value in given.items():
        if not jnp.issubdtype(value.dtype, jnp.floating):
            raise TypeError(f"{op}: {name} must be floating, got {name}.dtype={value.dtype}")
    concrete = {name: value for name, value in given.items() if _is_concrete(value)}
    if concrete:
        for name, finite in zip(concrete, _finite_flags(tuple(concrete.values()))):
            if not finite:
                raise ValueError(f"{op}: {name} must be finite; it holds NaN or inf")
    if model != "fm":
        field_ids = check_field_ids(op, field_ids, p, V.shape[-2] if model == "ffm"
                                    else R.shape[-1], origin=" (f from the parameters)")
    return (field_ids, w0, w, V, R), (classes[0] if classes else None)


# -- dispatch --------------------------------------------------------------------------------

def _predict(op: str, model: str, X, field_ids, w0, w, V, R, backend: str):
    rows = _as_rows(op, X)
    params, n_classes = _check_params(op, model, rows.shape[1], field_ids, w0, w, V, R)
    dtype = reference.score_dtype(rows.data, *(a for a in params[1:] if a is not None))
    path = resolve_backend(backend, op=op, capability="factorization",
                           shape_class=factorization_shape_class(model, dtype),
                           kernels=("pallas",) if model == "fm" else ("pallas", "triton"))
    return _compiled_scores(model, path, n_classes is not None)(rows, *params)


@functools.cache
def _compiled_scores(model: str, path: str, multiclass: bool):
    """One jitted scorer per (model, backend, multiclass): eager calls reuse compilations."""
    forward = _forward(model, path, _CLASS_AXIS if multiclass else None)

    def scores(rows, field_ids, w0, w, V, R):
        def one_class(w0, w, V, R):
            return scores_with_vjp(model, forward, rows, field_ids, w0, w, V, R)

        if not multiclass:
            return one_class(w0, w, V, R)
        in_axes = (0, 0, 0, None if R is None else 0)
        return jax.vmap(one_class, in_axes=in_axes, axis_name=_CLASS_AXIS)(w0, w, V, R).T

    return jax.jit(scores)


def fm_predict(X: CSR | Float[Array, "n p"], w0: Float[Array, ""] | Float[Array, " c"],
               w: Float[Array, " p"] | Float[Array, "c p"],
               V: Float[Array, "p k"] | Float[Array, "c p k"], *,
               backend: str = "auto") -> Float[Array, " n"] | Float[Array, "n c"]:
    """Factorization machine scores of the rows of ``X``.

    Args:
        X: ``(n, p)`` rows: a :class:`CSR`, a scipy sparse matrix (converted) or
            a dense floating array (exact zeros skipped). Any float dtype.
        w0: bias, ``()``; multiclass ``(c,)``.
        w: linear weights ``(p,)``; multiclass ``(c, p)``.
        V: factors ``(p, k)``; multiclass ``(c, p, k)``.
        backend: ``"auto"``, ``"pallas"``, ``"interpret"`` or ``"reference"``.

    Returns:
        Scores ``(n,)`` (multiclass: logits ``(n, c)``) in float64 if any input is
        float64, else float32 (16-bit inputs compute in float32).

    Raises:
        ValueError: parameter shapes that do not match ``X`` or each other,
            non-finite values, an unknown backend.
        TypeError: non-floating ``X`` or parameters.
    """
    return _predict("fm_predict", "fm", X, None, w0, w, V, None, backend)


def ffm_predict(X: CSR | Float[Array, "n p"], field_ids: Int[Array, " p"],
                w0: Float[Array, ""] | Float[Array, " c"],
                w: Float[Array, " p"] | Float[Array, "c p"],
                V: Float[Array, "p f k"] | Float[Array, "c p f k"], *,
                backend: str = "auto") -> Float[Array, " n"] | Float[Array, "n c"]:
    """Field-aware factorization machine scores of the rows of ``X``.

    Every pair ``i < j`` of a row's nonzeros contributes
    ``<V[i, field_ids[j]], V[j, field_ids[i]]> x_i x_j`` (same-field pairs too).

    Args:
        X: ``(n, p)`` rows: a :class:`CSR`, a scipy sparse matrix or a dense array.
        field_ids: ``(p,)`` integer field of each feature, in ``[0, f)``.
        w0: bias, ``()``; multiclass ``(c,)``.
        w: linear weights ``(p,)``; multiclass ``(c, p)``.
        V: field-aware factors ``(p, f, k)``; multiclass ``(c, p, f, k)``.
        backend: ``"auto"``, ``"pallas"``, ``"triton"``, ``"interpret"`` or ``"reference"``.

    Returns:
        Scores ``(n,)`` (multiclass ``(n, c)``), float64 if any input is float64
        else float32.

    Raises:
        ValueError: mismatched shapes, ``field_ids`` outside ``[0, f)`` (concrete
            input), non-finite values, an unknown backend.
        TypeError: non-floating ``X``/parameters or non-integer ``field_ids``.
    """
    return _predict("ffm_predict", "ffm", X, field_ids, w0, w, V, None, backend)


def fwfm_predict(X: CSR | Float[Array, "n p"], field_ids: Int[Array, " p"],
                 w0: Float[Array, ""] | Float[Array, " c"],
                 w: Float[Array, " p"] | Float[Array, "c p"],
                 V: Float[Array, "p k"] | Float[Array, "c p k"],
                 R: Float[Array, "f f"] | Float[Array, "c f f"], *,
                 backend: str = "auto") -> Float[Array, " n"] | Float[Array, "n c"]:
    """Field-weighted factorization machine scores of the rows of ``X``.

    Every pair ``i < j`` contributes ``r * <V[i], V[j]> x_i x_j`` with
    ``r = R[min(a, b), max(a, b)]`` for the fields ``a, b`` of the pair: only the
    upper triangle of ``R`` (diagonal included) is read, and its gradient is zero
    below the diagonal. ``R = 1`` everywhere gives the FM with the same ``V``.

    One-hot rows (at most one nonzero per field) score fastest as a CSR carrying
    its field-slot table, built once: ``X = X.with_field_slots(field_ids)``; the
    kernel then needs no per-pair field lookup (``docs/factorization.md``).

    Args:
        X: ``(n, p)`` rows: a :class:`CSR` (with or without a field-slot table),
            a scipy sparse matrix or a dense array.
        field_ids: ``(p,)`` integer field of each feature, in ``[0, f)``.
        w0: bias, ``()``; multiclass ``(c,)``.
        w: linear weights ``(p,)``; multiclass ``(c, p)``.
        V: factors ``(p, k)``; multiclass ``(c, p, k)``.
        R: field-pair weights ``(f, f)``; multiclass ``(c, f, f)``.
        backend: ``"auto"``, ``"pallas"``, ``"triton"``, ``"interpret"`` or ``"reference"``.

    Returns:
        Scores ``(n,)`` (multiclass ``(n, c)``), float64 if any input is float64
        else float32.

    Raises:
        ValueError: mismatched shapes, ``field_ids`` outside ``[0, f)`` (concrete
            input), non-finite values, an unknown backend.
        TypeError: non-floating ``X``/parameters or non-integer ``field_ids``.
    """
    return _predict("fwfm_predict", "fwfm", X, field_ids, w0, w, V, R, backend)
