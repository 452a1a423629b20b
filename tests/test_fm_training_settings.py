"""FM training settings: lazy Adam on 16-bit parameters, optimizer argument types, and
batches larger than the data."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from gpustat.estimators import FMRegressor, ftrl, lazy_adagrad, lazy_adam, lazy_sgd
from gpustat.estimators import _train as fm_train
from tests.oracles import fm_trainer as oracle


def test_lazy_adam_steps_bfloat16_parameters_and_counts_every_touch():
    """Constant gradient g: m_hat = g and v_hat = g^2 at every step, so Adam steps
    -lr g / (|g| + eps). On bfloat16 parameters b2 = 0.999 rounded to 1, 1 - b2^t was 0
    and every step was 0; the bfloat16 step count also stopped at 256."""
    lr, g = 0.01, np.array([1.0, -0.5, 2.0])
    params = {"w": jnp.zeros(3, jnp.bfloat16)}
    grads = {"w": jnp.asarray(g, jnp.bfloat16)}
    touched = {"w": jnp.array([True, True, False])}
    tx = lazy_adam(lr)
    update = jax.jit(lambda s: tx.update(grads, s, params, touched=touched))
    state = tx.init(params)
    expected = np.where([True, True, False], -lr * g / (np.abs(g) + 1e-8), 0.0)
    for _ in range(5):  # bfloat16 moments: the closed form holds to ~1 % in early steps
        updates, state = update(state)
        np.testing.assert_allclose(np.asarray(updates["w"], np.float64), expected, rtol=2e-2)
    for _ in range(295):
        _, state = update(state)
    np.testing.assert_array_equal(np.asarray(state.count["w"]), [300, 300, 0])


@pytest.mark.parametrize("make", [
    lambda: lazy_sgd(optax.exponential_decay(0.1, 10, 0.9)),
    lambda: lazy_adagrad("0.1"),
    lambda: lazy_adam(0.1, b2=None),
    lambda: ftrl(0.1, l1={"w0": 0.0, "w": "1e-3"}),
])
def test_hyperparameter_of_the_wrong_type_raises_type_error_naming_it(make):
    """They were accepted and failed inside update ("bad operand type for unary -:
    'function'" for an optax schedule), naming no argument."""
    with pytest.raises(TypeError, match=r"(learning_rate|b2|l1) must be a real number"):
        make()


def test_batch_larger_than_the_data_is_one_batch_of_every_row(monkeypatch):
    """batch_size=4096 on 23 rows equals one full batch (the spec's B = rows in the
    batch) and is run as one batch no wider than the padded data: every step scored
    4096 rows, 4073 of them padding (65536 on 1000 FFM rows: 47 s instead of 0.7 s)."""
    rng = np.random.default_rng(3)
    n, p, k = 23, 6, 2
    X = rng.normal(size=(n, p)) * (rng.random((n, p)) < 0.5)
    y = rng.normal(size=n)
    widths = []
    train = fm_train._fit_epochs_programs[False]

    def spy(cfg, z, params, opt_state, csr, orders, *args):
        widths.append((orders.shape[-1], csr[0].shape[0] - 1))  # batch width, padded rows
        return train(cfg, z, params, opt_state, csr, orders, *args)

    spy.lower, spy.eval_shape = train.lower, train.eval_shape  # compiled ahead as the program
    monkeypatch.setitem(fm_train._fit_epochs_programs, False, spy)
    est = FMRegressor(n_factors=k, optimizer="sgd", learning_rate=0.05, max_iter=2,
                      batch_size=4096, init_scale=0.3, random_state=4, dtype="float64",
                      backend="reference").fit(X, y)
    assert widths and all(width <= n_pad for width, n_pad in widths), widths
    r = np.random.default_rng(4)
    params = oracle.init_params("fm", r, 1, p, 1, k, 0.3, True)
    opt = oracle.Optimizer("sgd", params, lr=0.05)
    oracle.train("fm", "squared", oracle.dense_rows(X), np.zeros(p, int), y[:, None],
                 np.ones(n), params, opt, [r.permutation(n) for _ in range(2)], batch_size=n,
                 l2_linear=1e-5, l2_factors=1e-5)
    np.testing.assert_allclose(est.V_, params["V"][0], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(est.w_, params["w"][0], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(est.w0_, params["w0"][0], rtol=1e-9, atol=1e-12)
