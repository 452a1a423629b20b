"""Object, string and complex arrays are rejected at every public entry with a message that
names the argument: no error from inside JAX's tracing reaches the user."""

import jax.numpy as jnp
import numpy as np
import pytest

import gpustat
from gpustat import border, mixture, numerics

OBJECT = np.array([[1.0, "a"], [2.0, 3.0]], dtype=object)
STRINGS = np.array([["a", "b"], ["c", "d"]])
COMPLEX = np.ones((2, 2), complex)
PP = gpustat.PiecewisePolynomial(jnp.linspace(0.0, 1.0, 3), jnp.ones((2, 2)))
PARAMS = mixture.MixtureParams.from_covariances(np.ones(1), np.zeros((1, 2)), np.eye(2)[None])

# (public call taking the bad array, the argument its message must name)
CALLS = {
    "ppoly_eval": (lambda a: gpustat.ppoly_eval(PP, a), "x"),
    "PiecewisePolynomial": (lambda a: gpustat.PiecewisePolynomial(jnp.linspace(0, 1, 3), a),
                            "coeffs"),
    "fm_predict.X": (lambda a: gpustat.fm_predict(a, 0.0, np.ones(2), np.ones((2, 2))), "X"),
    "fm_predict.w": (lambda a: gpustat.fm_predict(np.ones((2, 2)), 0.0, a[0], np.ones((2, 2))),
                     "w"),
    "ffm_predict.V": (lambda a: gpustat.ffm_predict(np.ones((2, 2)), np.zeros(2, int), 0.0,
                                                    np.ones(2), a[:, :, None]), "V"),
    "CSR": (lambda a: gpustat.CSR.from_dense(a), "data"),
    "numerics.log_ndtr": (lambda a: numerics.log_ndtr(a), "x"),
    "mixture.log_prob": (lambda a: mixture.log_prob(a, PARAMS), "X"),
    "mixture.suff_stats": (lambda a: mixture.suff_stats(a, PARAMS), "X"),
    "solve_batched_border": (lambda a: border.BorderBatch.from_atoms(
        [a], [np.ones((2, 2, 1))], [np.ones((2, 2))], [np.eye(1)], [np.ones(1)]), "H_tt"),
    "dump_libffm": (lambda a: gpustat.dump_libffm("unused.ffm", a, np.ones(2), np.zeros(2, int)),
                    "X"),
}


@pytest.mark.parametrize("bad", [OBJECT, STRINGS, COMPLEX], ids=["object", "str", "complex"])
@pytest.mark.parametrize("name", sorted(CALLS))
def test_bad_dtypes_name_the_argument(name, bad):
    call, argument = CALLS[name]
    with pytest.raises((TypeError, ValueError)) as info:
        call(bad)
    message = str(info.value)
    assert argument in message, message
    assert "Error interpreting argument" not in message


@pytest.mark.parametrize("estimator", [gpustat.GaussianMixture(1), gpustat.FMRegressor()],
                         ids=["GaussianMixture", "FMRegressor"])
@pytest.mark.parametrize("bad", [OBJECT, STRINGS, COMPLEX], ids=["object", "str", "complex"])
def test_estimators_refuse_non_numeric_X_as_scikit_learn_does(estimator, bad):
    with pytest.raises(ValueError, match=r"float|numeric|Complex"):
        estimator.fit(bad, np.ones(2))


def test_bfloat16_and_integer_inputs_are_numbers():
    x = jnp.linspace(0.0, 1.0, 5)
    for values in (x.astype(jnp.bfloat16), x.astype(jnp.float16), jnp.arange(3)):
        np.testing.assert_allclose(np.asarray(gpustat.ppoly_eval(PP, values,
                                                                 backend="reference")),
                                   np.asarray(gpustat.ppoly_eval(PP, values.astype(jnp.float32),
                                                                 backend="reference")),
                                   rtol=1e-2)
