"""Public fm/ffm/fwfm_predict: dispatch, multiclass, jit/vmap, gradients, bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gpustat
from gpustat import factorization as fz
from gpustat._backend import BackendUnavailableError, cuda_gpu_available
from gpustat.csr import CSR
from tests.helpers import assert_close, tol
from tests.oracles import factorization_oracle as oracle
from tests.oracles.factorization_cases import (
    make_large_value_problem,
    make_one_hot_problem,
    make_problem,
)

P = make_problem(seed=11, row_lengths=(0, 2, 3, 1, 4))
X = CSR.from_scipy(P.X)
FID = jnp.asarray(P.field_ids)
C = 2  # classes in the multiclass tests


def _args(model, classes=None):
    rng = np.random.default_rng(7)

    def param(a):
        if classes is None:
            return jnp.asarray(a)
        return jnp.asarray(np.stack([a * (1 + 0.5 * c) + 0.1 * rng.normal(size=np.shape(a))
                                     for c in range(classes)]))

    V = P.V_ffm if model == "ffm" else P.V
    args = [param(np.asarray(P.w0)), param(P.w), param(V)]
    if model == "fwfm":
        args.append(param(P.R))
    return args


def _predict(model, X, args, backend, fid=FID):
    if model == "fm":
        return fz.fm_predict(X, *args, backend=backend)
    if model == "ffm":
        return fz.ffm_predict(X, fid, *args, backend=backend)
    return fz.fwfm_predict(X, fid, *args, backend=backend)


def _oracle(model, args):
    a = [np.asarray(v) for v in args]
    if model == "fm":
        return oracle.fm_scores(P.X, *a)
    if model == "ffm":
        return oracle.ffm_scores(P.X, P.field_ids, *a)
    return oracle.fwfm_scores(P.X, P.field_ids, *a)


@pytest.mark.parametrize("model", ["fm", "ffm", "fwfm"])
def test_public_api_reference_and_dense_input(model):
    args = _args(model)
    expected = _oracle(model, args)
    assert_close(_predict(model, X, args, "reference"), expected, rtol=1e-12, atol=1e-12)
    # scipy input converts, dense input skips exact zeros
    assert_close(_predict(model, P.X, args, "reference"), expected, rtol=1e-12, atol=1e-12)
    assert_close(_predict(model, P.X.toarray(), args, "reference"), expected, rtol=1e-12,
                 atol=1e-12)


@pytest.mark.parametrize("backend", ["reference", "interpret"])
def test_multiclass_logits_under_jit_match_per_class_oracle(backend):
    args = _args("fwfm", classes=C)
    logits = jax.jit(lambda X, *a: _predict("fwfm", X, a, backend))(X, *args)
    assert logits.shape == (X.shape[0], C)
    for c in range(C):
        assert_close(logits[:, c], _oracle("fwfm", [a[c] for a in args]), rtol=1e-12,
                     atol=1e-12)


def test_multiclass_fwfm_on_a_field_slot_table_branches_once_for_all_classes():
    P = ONE_HOT
    X_slots = CSR.from_scipy(P.X).with_field_slots(P.field_ids)
    _, _, fid, args = _gradient_case("fwfm_slots", C)
    logits = _predict("fwfm", X_slots, args, "interpret", fid)
    for c in range(C):
        assert_close(logits[:, c], oracle.fwfm_scores(P.X, P.field_ids, *[
            np.asarray(a[c]) for a in args]), rtol=1e-12, atol=1e-12)
    # the fallback predicate is reduced over the class vmap: a real branch, not a select
    # that would run the row-bucket kernel as well
    jaxpr = str(jax.make_jaxpr(lambda *a: _predict("fwfm", X_slots, a, "interpret", fid))(
        *args))
    assert "cond[" in jaxpr


def test_vmap_over_parameter_sets_and_dense_rows():
    args = _args("fm", classes=3)
    batched = jax.vmap(lambda w0, w, V: fz.fm_predict(X, w0, w, V, backend="interpret"))(*args)
    for c in range(3):
        assert_close(batched[c], _oracle("fm", [a[c] for a in args]), rtol=1e-12, atol=1e-12)
    dense = jnp.asarray(P.X.toarray())
    rows = jax.vmap(lambda x: fz.fm_predict(x[None, :], *_args("fm"), backend="reference"))(dense)
    assert_close(rows[:, 0], _oracle("fm", _args("fm")), rtol=1e-12, atol=1e-12)


def _reference_scores(model, X, fid, args):
    from gpustat.reference import factorization as ref

    if model == "fm":
        return ref.fm_scores(X, *args)
    if model == "ffm":
        return ref.ffm_scores(X, fid, *args)
    return ref.fwfm_scores(X, fid, *args)


ONE_HOT = make_one_hot_problem(seed=4, n_rows=6)


def _gradient_case(case, classes):
    """(model, X, field_ids, parameters) of a gradient test case."""
    if case != "fwfm_slots":
        return case, X, FID, _args(case, classes)
    # one-hot rows carrying the field-slot table, FwFM parameters sized for them
    rng = np.random.default_rng(5)
    P, lead = ONE_HOT, (() if classes is None else (classes,))
    params = [rng.normal(size=lead + shape) for shape in
              ((), P.w.shape, P.V.shape, P.R.shape)]
    X_slots = CSR.from_scipy(P.X).with_field_slots(P.field_ids)
    return "fwfm", X_slots, jnp.asarray(P.field_ids), [jnp.asarray(a) for a in params]


def _slow(*values):
    return pytest.param(*values, marks=pytest.mark.slow)


# every model once in CI (one of them multiclass; FwFM through the field-slot kernel,
# which also traces the row-bucket fallback), the other cases under -m slow
@pytest.mark.parametrize(("case", "classes"), [
    ("fm", None), ("ffm", C), ("fwfm_slots", None),
    _slow("fm", C), _slow("ffm", None), _slow("fwfm", None), _slow("fwfm", C),
    _slow("fwfm_slots", C),
])
def test_gradients_through_kernel_path_match_reference_autodiff(case, classes):
    """grad of the public op (interpret kernel forward + custom VJP) w.r.t. the x values,
    w0, w, V (and R) vs jax.grad of the reference scores, float64."""
    model, X_, fid, args = _gradient_case(case, classes)
    n = X_.shape[0]
    weights = jnp.linspace(0.5, 1.5, n * (classes or 1)).reshape((n, classes) if classes
                                                                  else (n,))

    def loss_public(d, *params):
        return jnp.sum(weights * jnp.sin(_predict(model, X_.with_data(d), params, "interpret",
                                                  fid)))

    def loss_reference(d, *params):
        def scores(*p):
            return _reference_scores(model, X_.with_data(d), fid, p)

        logits = scores(*params) if classes is None else jax.vmap(scores, out_axes=1)(*params)
        return jnp.sum(weights * jnp.sin(logits))

    argnums = tuple(range(len(args) + 1))
    got = jax.jit(jax.grad(loss_public, argnums=argnums))(X_.data, *args)
    want = jax.jit(jax.grad(loss_reference, argnums=argnums))(X_.data, *args)
    assert len(got) == (5 if model == "fwfm" else 4)  # x values, w0, w, V (, R)
    for g, e in zip(got, want, strict=True):
        assert np.any(np.asarray(e) != 0)
        assert_close(g, e, rtol=tol(np.float64, "autodiff"), atol=1e-12)


def test_float32_inputs_give_float32_scores_and_16_bit_compute_in_float32():
    args32 = [a.astype(jnp.float32) for a in _args("fm")]
    X16 = CSR.from_scipy(P.X, dtype=jnp.bfloat16)
    out = fz.fm_predict(X16, *args32, backend="reference")
    assert out.dtype == jnp.float32
    assert fz.fm_predict(CSR.from_scipy(P.X, dtype=np.float32), *args32,
                         backend="reference").dtype == jnp.float32


def test_exports_and_docstrings():
    for name in ("CSR", "fm_predict", "ffm_predict", "fwfm_predict"):
        assert name in fz.__all__
        assert getattr(fz, name).__doc__


# -- bad input -------------------------------------------------------------------------------

@pytest.mark.parametrize("model", ["ffm", "fwfm"])
@pytest.mark.parametrize("bad", [-1, 3])
def test_field_ids_out_of_range(model, bad):
    fid = np.asarray(P.field_ids).copy()
    fid[2] = bad
    args = _args(model)
    fn = fz.ffm_predict if model == "ffm" else fz.fwfm_predict
    with pytest.raises(ValueError, match=r"field_ids must lie in \[0, f=3\)"):
        fn(X, fid, *args, backend="reference")


def test_shape_mismatches_raise_value_error():
    w0, w, V = _args("fm")
    with pytest.raises(ValueError, match="w must have at least one class"):  # c = 0 crashed
        fz.fm_predict(X, w0[None][:0], w[None][:0], V[None][:0], backend="interpret")
    with pytest.raises(ValueError, match="w must have p=11"):
        fz.fm_predict(X, w0, w[:-1], V, backend="reference")
    with pytest.raises(ValueError, match="V must have shape"):
        fz.fm_predict(X, w0, w, V[:-1], backend="reference")
    with pytest.raises(ValueError, match="w0 must have shape"):
        fz.fm_predict(X, jnp.zeros(2), w, V, backend="reference")
    with pytest.raises(ValueError, match="V must have shape"):
        fz.ffm_predict(X, FID, w0, w, V, backend="reference")  # FM-shaped V for FFM
    w0, w, V, R = _args("fwfm")
    with pytest.raises(ValueError, match="R must have shape"):
        fz.fwfm_predict(X, FID, w0, w, V, R[:2], backend="reference")
    with pytest.raises(ValueError, match=r"R .* is required"):
        fz.fwfm_predict(X, FID, w0, w, V, None, backend="reference")
    with pytest.raises(ValueError, match="field_ids must have shape"):
        fz.fwfm_predict(X, FID[:-1], w0, w, V, R, backend="reference")
    with pytest.raises(ValueError, match="2-D"):
        fz.fm_predict(jnp.ones(11), *_args("fm"), backend="reference")
    cw0, cw, _ = _args("fm", classes=2)
    with pytest.raises(ValueError, match="V must have shape"):
        fz.fm_predict(X, cw0, cw, V, backend="reference")  # single-class V with 2 classes


def test_non_finite_values_raise_value_error():
    w0, w, V = _args("fm")
    with pytest.raises(ValueError, match="V must be finite"):
        fz.fm_predict(X, w0, w, V.at[0, 0].set(jnp.nan), backend="reference")
    with pytest.raises(ValueError, match="w must be finite"):
        fz.fm_predict(X, w0, w.at[1].set(jnp.inf), V, backend="reference")
    dense = P.X.toarray()
    dense[0, 0] = np.nan
    with pytest.raises(ValueError, match="X must be finite"):
        fz.fm_predict(dense, w0, w, V, backend="reference")
    with pytest.raises(ValueError, match="data must be finite"):
        bad = P.X.copy()
        bad.data[0] = np.inf
        fz.fm_predict(bad, w0, w, V, backend="reference")



@pytest.mark.gpu
def test_value_checks_copy_no_parameter_to_the_host():
    """Finiteness is reduced on the device: the host copy of V it made cost 32x the FM
    kernel (eager call 12.7-13.1 ms, now 1.3-1.5, kernel 0.35-0.40 ms; H100, 1M x 16
    float32 factors, 100k rows of 24)."""
    w0, w, V = _args("fm")
    with jax.transfer_guard_device_to_host("disallow"):
        scores = fz.fm_predict(X, w0, w, V, backend="pallas")
    assert_close(scores, _oracle("fm", (w0, w, V)), rtol=1e-10, atol=1e-12)

def test_type_errors_and_backend_errors():
    w0, w, V = _args("fm")
    with pytest.raises(TypeError, match="X must hold floating"):
        fz.fm_predict(np.ones((5, 11), dtype=np.int32), w0, w, V, backend="reference")
    with pytest.raises(TypeError, match="V must be floating"):
        fz.fm_predict(X, w0, w, V.astype(jnp.int32), backend="reference")
    with pytest.raises(TypeError, match="field_ids must hold integers"):
        fz.ffm_predict(X, FID.astype(jnp.float32), *_args("ffm"), backend="reference")
    with pytest.raises(ValueError, match="backend must be one of"):
        fz.fm_predict(X, w0, w, V, backend="cuda")
    if not cuda_gpu_available():
        with pytest.raises(BackendUnavailableError):
            fz.fm_predict(X, w0, w, V, backend="pallas")


def test_value_checks_are_skipped_under_jit_but_shapes_are_not():
    w0, w, V = _args("fm")
    out = jax.jit(lambda V: fz.fm_predict(X, w0, w, V, backend="reference"))(V.at[0, 0].set(0.5))
    assert out.shape == (X.shape[0],)
    with pytest.raises(ValueError, match="w must have p=11"):
        jax.jit(lambda w: fz.fm_predict(X, w0, w, V, backend="reference"))(w[:-1])


def test_top_level_reexports_when_present():
    for name in ("CSR", "fm_predict", "ffm_predict", "fwfm_predict"):
        if name in gpustat.__all__:
            assert getattr(gpustat, name) is getattr(fz, name)


# -- field-slot layout -----------------------------------------------------------------------

def test_field_slot_table_matches_brute_force_and_travels_through_jit():
    P = ONE_HOT
    X_slots = CSR.from_scipy(P.X).with_field_slots(P.field_ids, n_fields=7)
    table = np.asarray(X_slots.field_slots)
    assert table.shape == (P.X.shape[0], 7)
    expected = np.full(table.shape, -1)
    for r in range(P.X.shape[0]):
        for pos in range(P.X.indptr[r], P.X.indptr[r + 1]):
            expected[r, P.field_ids[P.X.indices[pos]]] = pos
    np.testing.assert_array_equal(table, expected)
    assert X.field_slots is None  # the plain CSR is unchanged
    doubled = X_slots.with_data(2 * X_slots.data)
    assert doubled.field_slots is X_slots.field_slots  # positions, not values
    out = jax.jit(lambda M: M.field_slots + 1)(X_slots)
    np.testing.assert_array_equal(np.asarray(out), table + 1)


def test_field_slot_table_bad_input():
    # P's rows hold same-field pairs: the table cannot hold them
    with pytest.raises(ValueError, match=r"row \d+ stores \d+ entries of field"):
        X.with_field_slots(P.field_ids)
    one_hot = CSR.from_scipy(ONE_HOT.X)
    with pytest.raises(ValueError, match=r"field_ids must lie in \[0, n_fields=3\)"):
        one_hot.with_field_slots(ONE_HOT.field_ids, n_fields=3)
    with pytest.raises(ValueError, match="field_ids must have shape"):
        one_hot.with_field_slots(ONE_HOT.field_ids[:-1])
    with pytest.raises(TypeError, match="field_ids must hold integers"):
        one_hot.with_field_slots(ONE_HOT.field_ids.astype(float))
    with pytest.raises(TypeError, match="concrete"):
        jax.jit(lambda f: one_hot.with_field_slots(f).field_slots)(ONE_HOT.field_ids)


@pytest.mark.parametrize("backend", ["reference", "interpret"])
def test_float32_values_near_1e20_through_the_public_api_and_fm_regressor(backend):
    """fm_predict and a float32 FMRegressor's predict give the float64 oracle's scores
    where (sum v x)**2 overflows float32 (FM's identity error is relative to sum (v x)**2)."""
    large, error = make_large_value_problem()
    expected = oracle.fm_scores(large.X, large.w0, large.w, large.V)
    eps = np.finfo(np.float32).eps
    got = np.asarray(fz.fm_predict(large.X.astype(np.float32), np.float32(large.w0),
                                   large.w.astype(np.float32), large.V.astype(np.float32),
                                   backend=backend))
    assert np.all(np.isfinite(got)) and np.all(np.abs(got - expected) <= 16 * eps * error["fm"])
    if backend == "interpret":
        return
    rng = np.random.default_rng(0)
    est = gpustat.FMRegressor(n_factors=large.V.shape[1], max_iter=1, dtype="float32",
                              random_state=0).fit(rng.normal(size=(8, large.X.shape[1])),
                                                  rng.normal(size=8))
    est.w0_, est.w_, est.V_ = (np.float32(large.w0), large.w.astype(np.float32),
                               large.V.astype(np.float32))
    got = est.predict(large.X)
    assert np.all(np.isfinite(got)) and np.all(np.abs(got - expected) <= 16 * eps * error["fm"])
