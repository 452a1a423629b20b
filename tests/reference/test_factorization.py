"""Reference FM / FFM / FwFM scores vs the brute-force per-pair oracle, and the
closed-form gradient rule vs jax.grad of the reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gpustat.csr import CSR, dense_as_csr
from gpustat.factorization._vjp import scores_with_vjp
from gpustat.reference import factorization as ref
from tests.helpers import assert_close, tol
from tests.oracles import factorization_oracle as oracle
from tests.oracles.factorization_cases import make_large_value_problem, make_problem

PROBLEM = make_problem()
X = CSR.from_scipy(PROBLEM.X)


def _scale(expected):
    return np.maximum(np.abs(expected), 1.0)


_REF = {"fm": jax.jit(lambda X, f, w0, w, V, R: ref.fm_scores(X, w0, w, V)),
        "ffm": jax.jit(lambda X, f, w0, w, V, R: ref.ffm_scores(X, f, w0, w, V)),
        "fwfm": jax.jit(ref.fwfm_scores)}


def _ref_scores(model, X, P, dtype=jnp.float64):
    def cast(a):
        return jnp.asarray(a, dtype)
    V = P.V_ffm if model == "ffm" else P.V
    return _REF[model](X, jnp.asarray(P.field_ids), cast(P.w0), cast(P.w), cast(V), cast(P.R))


def _oracle_scores(model, P):
    if model == "fm":
        return oracle.fm_scores(P.X, P.w0, P.w, P.V)
    if model == "ffm":
        return oracle.ffm_scores(P.X, P.field_ids, P.w0, P.w, P.V_ffm)
    return oracle.fwfm_scores(P.X, P.field_ids, P.w0, P.w, P.V, P.R)


@pytest.mark.parametrize("model", ["fm", "ffm", "fwfm"])
def test_reference_matches_per_pair_oracle_float64(model):
    expected = _oracle_scores(model, PROBLEM)
    actual = np.asarray(_ref_scores(model, X, PROBLEM))
    assert np.max(np.abs(actual - expected) / _scale(expected)) < 1e-10
    # empty rows score the bias, one-nonzero rows the bias plus their linear term
    lengths = np.diff(PROBLEM.X.indptr)
    assert np.all(actual[lengths == 0] == PROBLEM.w0)
    for r in np.flatnonzero(lengths == 1):
        c, v = PROBLEM.X.indices[PROBLEM.X.indptr[r]], PROBLEM.X.data[PROBLEM.X.indptr[r]]
        assert actual[r] == pytest.approx(PROBLEM.w0 + PROBLEM.w[c] * v, rel=1e-14)


@pytest.mark.parametrize("model", ["fm", "ffm", "fwfm"])
def test_reference_float32_matches_oracle(model):
    expected = _oracle_scores(model, PROBLEM)
    X32 = CSR.from_scipy(PROBLEM.X, dtype=np.float32)
    actual = np.asarray(_ref_scores(model, X32, PROBLEM, jnp.float32))
    assert actual.dtype == np.float32
    assert np.max(np.abs(actual - expected) / _scale(expected)) < 50 * tol(np.float32, "oracle")


def test_same_field_pairs_are_scored():
    """One field only: every pair is a same-field pair and still contributes."""
    P = make_problem(seed=3, n_fields=1)
    expected = oracle.ffm_scores(P.X, P.field_ids, P.w0, P.w, P.V_ffm)
    linear_only = oracle.ffm_scores(P.X, P.field_ids, P.w0, P.w, 0 * P.V_ffm)
    assert np.max(np.abs(expected - linear_only)) > 0.1
    assert_close(_ref_scores("ffm", CSR.from_scipy(P.X), P), expected, rtol=1e-12, atol=1e-12)


def test_fwfm_with_unit_field_weights_is_fm():
    R = np.triu(np.ones((3, 3))) + np.tril(np.full((3, 3), 7.0), -1)  # lower ignored
    fwfm = _REF["fwfm"](X, jnp.asarray(PROBLEM.field_ids), PROBLEM.w0, jnp.asarray(PROBLEM.w),
                        jnp.asarray(PROBLEM.V), jnp.asarray(R))
    expected = oracle.fm_scores(PROBLEM.X, PROBLEM.w0, PROBLEM.w, PROBLEM.V)
    assert np.max(np.abs(np.asarray(fwfm) - expected) / _scale(expected)) < 1e-10


def test_dense_input_skips_zeros_like_csr():
    dense = PROBLEM.X.toarray()
    V = PROBLEM.V.copy()
    unused = np.setdiff1d(np.arange(dense.shape[1]), PROBLEM.X.indices)
    V[unused] = np.nan  # parameters of features absent from the data are never read
    scores = jax.jit(lambda x, w, V: ref.fm_scores(dense_as_csr(x), PROBLEM.w0, w, V))(
        jnp.asarray(dense), jnp.asarray(PROBLEM.w), jnp.asarray(V))
    expected = oracle.fm_scores(PROBLEM.X, PROBLEM.w0, PROBLEM.w, PROBLEM.V)
    assert_close(scores, expected, rtol=1e-12, atol=1e-12)


def _forward(model):
    return lambda X, f, w0, w, V, R: {
        "fm": lambda: ref.fm_scores(X, w0, w, V),
        "ffm": lambda: ref.ffm_scores(X, f, w0, w, V),
        "fwfm": lambda: ref.fwfm_scores(X, f, w0, w, V, R),
    }[model]()


@pytest.mark.parametrize("model", ["fm", "ffm", "fwfm"])
def test_gradient_rule_matches_autodiff_of_reference(model):
    """Closed-form VJP (w0, w, V, R and X.data) vs jax.grad through the reference."""
    P = PROBLEM
    forward = _forward(model)
    fid = jnp.asarray(P.field_ids)
    V = jnp.asarray(P.V_ffm if model == "ffm" else P.V)
    R = jnp.asarray(P.R) if model == "fwfm" else None
    cotangent = jnp.asarray(np.random.default_rng(1).normal(size=X.shape[0]))
    params = (X.data, jnp.asarray(P.w0), jnp.asarray(P.w), V, R)
    argnums = (0, 1, 2, 3, 4) if model == "fwfm" else (0, 1, 2, 3)

    def custom(d, w0, w, V, R):
        return jnp.vdot(cotangent, scores_with_vjp(model, forward, X.with_data(d), fid,
                                                   w0, w, V, R))

    def autodiff(d, w0, w, V, R):
        return jnp.vdot(cotangent, forward(X.with_data(d), fid, w0, w, V, R))

    both = jax.jit(lambda *a: (jax.grad(custom, argnums)(*a), jax.grad(autodiff, argnums)(*a)))
    got, want = both(*params)
    for name, g, e in zip(["X.data", "w0", "w", "V", "R"], got, want):
        assert_close(g, e, rtol=tol(np.float64, "autodiff"), atol=1e-12, err_msg=name)
    if model == "fwfm":  # R's lower triangle is never read: zero gradient there
        assert np.all(np.asarray(got[4])[np.tril_indices(3, -1)] == 0)
        assert np.any(np.asarray(got[4])[np.triu_indices(3)] != 0)


def test_gradient_rule_takes_numpy_and_python_parameters():
    """jax.grad hands the custom VJP its primals as given (numpy arrays, a Python float):
    the backward indexes them with traced ids, so it must convert them first."""
    P = make_problem(seed=2, row_lengths=(3, 4))  # one bucket: the backward runs eagerly
    X = CSR.from_scipy(P.X)
    forward = jax.jit(_forward("ffm"))

    def custom(w0, V):
        return jnp.sum(scores_with_vjp("ffm", forward, X, P.field_ids, w0, P.w, V))

    def autodiff(V):
        return jnp.sum(forward(X, jnp.asarray(P.field_ids), P.w0, jnp.asarray(P.w), V, None))

    got = jax.grad(custom, (0, 1))(float(P.w0), P.V_ffm)
    assert got[0] == pytest.approx(X.shape[0])
    assert_close(got[1], jax.jit(jax.grad(autodiff))(jnp.asarray(P.V_ffm)),
                 rtol=tol(np.float64, "autodiff"), atol=1e-12)


LARGE, LARGE_ERROR = make_large_value_problem()


def _large_value_oracle(model):
    return _oracle_scores(model, LARGE)


def test_large_value_case_overflows_the_unscaled_fm_identity():
    """The data exercise the overflow: float32 (sum_i v_i x_i)**2 is inf on row 0."""
    lo, hi = LARGE.X.indptr[0], LARGE.X.indptr[1]
    u = LARGE.V[LARGE.X.indices[lo:hi]].astype(np.float32) * LARGE.X.data[lo:hi, None].astype(
        np.float32)
    with np.errstate(over="ignore"):
        assert np.isinf(np.sum(u, axis=0) ** 2).any()
    assert np.isfinite(np.float32(_large_value_oracle("fm")[0]))


@pytest.mark.parametrize("model", ["fm", "ffm", "fwfm"])
def test_float32_values_near_1e20_score_like_float64(model):
    """FM's pair term is scaled per row and factor; FFM/FwFM multiply V by x first."""
    actual = np.asarray(_ref_scores(model, CSR.from_scipy(LARGE.X, dtype=np.float32), LARGE,
                                    jnp.float32))
    expected = _large_value_oracle(model)
    assert np.all(np.isfinite(actual))
    eps = np.finfo(np.float32).eps
    assert np.all(np.abs(actual - expected) <= 16 * eps * LARGE_ERROR[model])
