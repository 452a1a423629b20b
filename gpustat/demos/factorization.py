"""Demo: FM / FFM / FwFM scores of synthetic CTR-like CSR rows vs a dense numpy oracle.

Rows have ragged lengths (empty rows included) over one-hot fields; each model
is scored through the requested backend and compared with a dense assembly in
numpy (the pairwise interaction matrix ``A`` of all features, then
``x^T triu(A, 1) x`` per row), and the FM gradient rule is compared with
autodiff of the pure-jnp reference.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse as sp

from gpustat import factorization as fz
from gpustat.csr import CSR
from gpustat.demos import DemoRow, max_rel_error, timed
from gpustat.reference import factorization as ref

CAPABILITY = "factorization"


def _data(n: int, n_fields: int, vocab: int, k: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    # ragged rows of 0, 3 or 4 fields (one kernel bucket plus empty rows keeps the demo quick)
    lengths = rng.choice([0, 3, 4], n)
    rows = np.repeat(np.arange(n), lengths)
    fields = np.concatenate([rng.choice(n_fields, L, replace=False) for L in lengths])
    ranks = np.minimum(rng.zipf(1.3, fields.shape[0]) - 1, vocab - 1)
    X = CSR.from_scipy(sp.coo_array((rng.uniform(0.5, 1.5, rows.shape[0]),
                                     (rows, fields * vocab + ranks)),
                                    shape=(n, n_fields * vocab)))
    p = n_fields * vocab
    field_ids = jnp.asarray(np.arange(p) // vocab)
    params = {
        "w0": jnp.asarray(0.1), "w": jnp.asarray(0.1 * rng.standard_normal(p)),
        "V": jnp.asarray(0.3 * rng.standard_normal((p, k))),
        "V_ffm": jnp.asarray(0.3 * rng.standard_normal((p, n_fields, k))),
        "R": jnp.asarray(rng.uniform(0.5, 1.5, (n_fields, n_fields))),
    }
    return X, field_ids, params


def _dense_oracle(model: str, X: CSR, fid: np.ndarray, p: dict) -> np.ndarray:
    """Scores from the dense (p, p) matrix of pairwise interaction weights (numpy, float64)."""
    x = X.to_scipy().toarray()
    if model == "ffm":
        V = np.asarray(p["V_ffm"])  # A_ij = <V[i, f_j], V[j, f_i]>
        A = np.einsum("ijt,jit->ij", V[:, fid, :], V[:, fid, :])
    else:
        V = np.asarray(p["V"])
        A = V @ V.T
        if model == "fwfm":
            R = np.asarray(p["R"])
            A = A * np.triu(R)[np.minimum.outer(fid, fid), np.maximum.outer(fid, fid)]
    pairs = np.sum((x @ np.triu(A, 1)) * x, axis=1)
    return float(p["w0"]) + x @ np.asarray(p["w"]) + pairs


def run(backend: str, small: bool) -> list[DemoRow]:
    n = 200 if small else 100_000
    X, fid, p = _data(n, n_fields=6, vocab=50, k=4)
    backend_rows = []
    cases = {
        "fm": lambda b: fz.fm_predict(X, p["w0"], p["w"], p["V"], backend=b),
        "ffm": lambda b: fz.ffm_predict(X, fid, p["w0"], p["w"], p["V_ffm"], backend=b),
        "fwfm": lambda b: fz.fwfm_predict(X, fid, p["w0"], p["w"], p["V"], p["R"], backend=b),
    }
    for name, op in cases.items():
        scores, seconds = timed(lambda op=op: op(backend))
        expected = _dense_oracle(name, X, np.asarray(fid), p)
        backend_rows.append(DemoRow(CAPABILITY, f"{name}_predict n={n}", backend,
                                    max_rel_error(scores, expected), seconds,
                                    f"{n / seconds:.3g} rows/s"))

    def loss(V, scorer):
        return jnp.sum(jax.nn.log_sigmoid(scorer(V)))

    grad_public = jax.jit(jax.grad(lambda V: loss(V, lambda V: fz.fm_predict(
        X, p["w0"], p["w"], V, backend=backend))))(p["V"])
    grad_autodiff = jax.jit(jax.grad(lambda V: loss(V, lambda V: ref.fm_scores(
        X, p["w0"], p["w"], V))))(p["V"])
    backend_rows.append(DemoRow(CAPABILITY, "fm gradient dV (custom VJP vs autodiff)", backend,
                                max_rel_error(grad_public, grad_autodiff), 0.0))
    return backend_rows
