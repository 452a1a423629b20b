"""gpustat.testing.check_derivatives must pass right derivatives and catch wrong ones."""

import jax.numpy as jnp
import pytest

from gpustat.testing import check_derivatives


def objective(x):
    return jnp.sum(jnp.exp(0.3 * x) * x**2) + x[0] * x[1]


def analytic(x):
    g = jnp.exp(0.3 * x) * (0.3 * x**2 + 2 * x) + jnp.array([x[1], x[0], 0.0])
    h = jnp.diag(jnp.exp(0.3 * x) * (0.09 * x**2 + 1.2 * x + 2))
    h = h.at[0, 1].add(1.0).at[1, 0].add(1.0)
    return objective(x), g, h


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_right_derivatives_pass(dtype):
    report = check_derivatives(analytic, objective, jnp.array([0.5, -1.2, 2.0], dtype))
    report.assert_ok()
    assert len(report.comparisons) == 5


def test_wrong_gradient_fails_with_worst_entry():
    def wrong(x):
        v, g, h = analytic(x)
        return v, g.at[2].multiply(1.001), h

    report = check_derivatives(wrong, objective, jnp.array([0.5, -1.2, 2.0]))
    assert not report.ok
    text = str(report)
    assert "FAIL gradient vs jax.grad" in text and "at (2,)" in text
    with pytest.raises(AssertionError, match="derivative check failed"):
        report.assert_ok()


def test_wrong_hessian_symmetry_fails():
    def wrong(x):
        v, g, h = analytic(x)
        return v, g, h.at[0, 1].add(1e-6)

    report = check_derivatives(wrong, objective, jnp.array([0.5, -1.2, 2.0]))
    assert [c.what for c in report.comparisons if not c.ok] == ["Hessian vs jax.hessian"]


def test_bad_input():
    with pytest.raises(TypeError, match="x must be floating"):
        check_derivatives(analytic, objective, jnp.array([1, 2, 3]))
    with pytest.raises(ValueError, match="analytic must return"):
        check_derivatives(lambda x: objective(x), objective, jnp.ones(3))


def test_nan_on_both_sides_fails():
    # sqrt at negative points: value, gradient and its references are all NaN, and the
    # analytic gradient is wrong by a factor 6; nothing was checked, so nothing passes
    def wrong(x):
        return jnp.sum(jnp.sqrt(x)), 3.0 / jnp.sqrt(x)

    report = check_derivatives(wrong, lambda x: jnp.sum(jnp.sqrt(x)), jnp.array([-1.0, -2.0]))
    assert not any(c.ok for c in report.comparisons)
