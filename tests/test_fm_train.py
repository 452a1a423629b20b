"""Training internals of FM / FFM / FwFM: the lazy optimizers and the shape buckets."""

import jax.numpy as jnp
import numpy as np
import pytest

from gpustat.estimators import ftrl, lazy_adagrad, lazy_adam, lazy_sgd
from gpustat.estimators._train import _contract, bucket


@pytest.mark.parametrize("tx", [lazy_adagrad(0.1, eps=0.0), lazy_adam(0.1, eps=0.0)])
def test_zero_eps_steps_a_zero_gradient_by_zero_not_nan(tx):
    """A touched coordinate whose gradients were all 0 has G = v = 0: with eps = 0 its
    step is 0 (it was 0/0 = NaN, which then spread through every score)."""
    params = {"w": jnp.zeros(3)}
    updates, _ = tx.update({"w": jnp.array([0.0, 2.0, 0.0])}, tx.init(params), params)
    # the first step of both is -lr g / |g| where g != 0
    np.testing.assert_array_equal(np.asarray(updates["w"]), [0.0, -0.1, 0.0])


@pytest.mark.parametrize("n", [65537, 98305, 1_050_000, (3 << 20) + 1])
def test_bucket_pads_at_most_one_eighth(n):
    """The documented grid of 8 steps per octave; it padded 65537 to 81920 (25 %)."""
    assert n <= bucket(n, 1) <= n * 1.125


@pytest.mark.parametrize(("make", "name"), [
    (lambda: lazy_sgd(0.0), "learning_rate"),
    (lambda: lazy_adagrad(-0.1), "learning_rate"),
    (lambda: lazy_adagrad(0.1, eps=-1.0), "eps"),
    (lambda: lazy_adam(0.1, b1=1.0), "b1"),
    (lambda: lazy_adam(0.1, b2=float("nan")), "b2"),
    (lambda: ftrl(0.0), "learning_rate"),
    (lambda: ftrl(0.1, beta=-1.0), "beta"),
    (lambda: ftrl(0.1, l1={"w": -1e-3, "V": 0.0}), "l1"),
])
def test_bad_hyperparameters_raise_value_error(make, name):
    """They gave NaN parameters (ftrl(0.0), b1 = 1) or ascent (lazy_sgd(-lr)) silently."""
    with pytest.raises(ValueError, match=name):
        make()


@pytest.mark.parametrize("spec", ["back,bdck->badc", "badc,bdck->back", "badc,bdg->bacg",
                                  "baf,bacg->cfg", "bad,bdg->bag", "baf,bag->fg", "ij,jk->ki"])
def test_contract_equals_numpy_einsum(spec):
    """FwFM's contractions as broadcast products (no GEMM) against numpy's einsum."""
    rng = np.random.default_rng(7)
    sizes = dict(zip("badckfgijz", (3, 4, 5, 2, 6, 7, 3, 2, 5, 4)))
    spec_a, spec_b = spec.split("->")[0].split(",")
    a = rng.normal(size=[sizes[c] for c in spec_a])
    b = rng.normal(size=[sizes[c] for c in spec_b])
    np.testing.assert_allclose(np.asarray(_contract(spec, jnp.asarray(a), jnp.asarray(b))),
                               np.einsum(spec, a, b), rtol=1e-12, atol=1e-12)
