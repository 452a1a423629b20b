"""Gibbs output a statistician can use: degenerate data give finite chains, relabelling
against label switching, posterior means and credible intervals, ArviZ draws."""

import itertools

import jax
import numpy as np
import pytest

from gpustat import mixture

N, P, M, SWEEPS, CHAINS = 40, 3, 3, 30, 2
CENTRES = np.array([[-4.0, 0.0, -4.0], [4.0, 0.0, 4.0]])


def _gibbs(X):
    """Every fit_gibbs call of this file has one set of shapes and settings: one compile."""
    return mixture.fit_gibbs(jax.random.key(3), X, M, n_sweeps=SWEEPS, n_chains=CHAINS,
                             backend="reference")


@pytest.fixture(scope="module")
def constant_feature():
    """Two clusters, feature 1 constant at 1e4, float32 (the NaN-chain case)."""
    rng = np.random.default_rng(0)
    X = (CENTRES.repeat(N // 2, axis=0) + 0.5 * rng.normal(size=(N, P))).astype(np.float32)
    X[:, 1] = 1e4
    return X, _gibbs(X)


def _all_finite(result) -> bool:
    return all(bool(np.isfinite(np.asarray(a)).all()) for a in jax.tree.leaves(result))


def test_weak_prior_floors_the_feature_variances():
    """v_a = max(var X_a, 1e-6 s), s = max_a var X_a, or max(max_a mean(X_a)^2, 1) when
    every feature is constant; Phi = 0.1 (nu - p - 1) diag(v), nu = p + 2."""
    rng = np.random.default_rng(1)
    X = rng.normal(size=(50, 3)) * np.array([2.0, 1.0, 1.0])
    X[:, 1] = 7.0
    for data, floor in ((X, 1e-6 * np.var(X[:, 0])), (np.full((5, 2), 3.0), 9e-6),
                        (np.full((5, 2), 1e-3), 1e-6), (np.zeros((5, 2)), 1e-6)):
        prior = mixture.NIWPrior.weak(data)
        expected = np.maximum(np.var(data, axis=0), floor) * 0.1
        np.testing.assert_allclose(np.asarray(prior.scale), np.diag(expected), rtol=1e-12)
        np.testing.assert_allclose(np.asarray(prior.mean), data.mean(0), rtol=1e-12)
    assert float(np.asarray(mixture.NIWPrior.weak(X).scale)[0, 0]) == pytest.approx(
        0.1 * np.var(X[:, 0]), rel=1e-12)  # the floor leaves a varying feature alone
    with pytest.raises(ValueError, match="var_floor"):
        mixture.NIWPrior.weak(X, var_floor=0.0)


def test_constant_feature_gives_finite_chains(constant_feature):
    """A constant feature made NIWPrior.weak's scale singular: log-likelihood
    [161.0, nan, nan] and NaN means, no error. Now every trace is finite, the constant
    feature's mean draws sit on the constant and its variance draws are tiny."""
    X, result = constant_feature
    assert _all_finite(result)
    means = np.asarray(result.means)
    covariances = np.asarray(result.covariances)
    occupied = np.asarray(result.counts) > 0
    np.testing.assert_allclose(means[..., 1][occupied], 1e4, rtol=1e-6)
    assert np.all(covariances[..., 1, 1][occupied] < 1e-4 * np.var(X[:, 0]))
    # the two clusters are found: after relabelling, the two heaviest components' posterior
    # means are the clusters' sample means (computed from the rows). The chains label the
    # clusters differently: with method="none" (or "order" by weight) the pooled means
    # miss by 3.5-4.1, with the Hungarian relabelling by 0.03
    summary = mixture.relabel(result, burn=10).summary()
    heavy = np.argsort(summary.weights.mean)[-2:]
    found = summary.means.mean[heavy][np.argsort(summary.means.mean[heavy, 0])]
    truth = np.stack([X[: N // 2].mean(0), X[N // 2:].mean(0)])
    np.testing.assert_allclose(found, truth, atol=0.3)


def test_identical_points_give_finite_chains():
    """All points identical (every feature constant): the prior's variances are floored
    at 1e-6 max(mean^2, 1); the chains are finite and an occupied component's mean draws
    lie within 5 posterior standard deviations sqrt(Sigma_aa / kappa_n) of the point."""
    X = np.full((N, P), 3.0, np.float32)
    result = _gibbs(X)
    assert _all_finite(result)
    counts = np.asarray(result.counts)
    occupied = counts > 0
    variances = np.diagonal(np.asarray(result.covariances), axis1=-2, axis2=-1)
    sd = np.sqrt(variances[occupied] / (counts[occupied, None] + 0.01))
    deviation = np.abs(np.asarray(result.means)[occupied] - 3.0)
    assert np.all(deviation < 5 * sd + 1e-6), np.max(deviation / sd)


def _constructed_result(rng, perms, ref_weights, ref_means, ref_covs, noise=1e-3,
                        loglik=None):
    """A GibbsResult whose draw (c, s) is the reference, perturbed by ``noise``, with its
    components permuted: the draw's component j is reference component perms[c, s, j]."""
    c, t, m = perms.shape
    p = ref_means.shape[1]
    weights = ref_weights[perms] * (1 + noise * rng.uniform(size=(c, t, m)))
    weights /= weights.sum(-1, keepdims=True)
    means = ref_means[perms] + noise * rng.normal(size=(c, t, m, p))
    covs = ref_covs[perms] * (1 + noise * rng.uniform(size=(c, t, m, 1, 1)))
    counts = np.round(100 * weights)
    loglik = rng.normal(size=(c, t)) if loglik is None else loglik
    return mixture.GibbsResult(None, loglik, rng.uniform(size=(c, t)), counts, weights,
                               means, covs)


def _reference(rng, m=4, p=3):
    """Well-separated components, one nearly empty with a far mean (the prior's draw)."""
    weights = np.array([0.4, 0.3, 0.3 - 1e-4, 1e-4])[:m]
    means = rng.normal(size=(m, p)) * 5.0
    means[-1] += 40.0
    A = rng.normal(size=(m, p, p))
    covs = A @ A.transpose(0, 2, 1) / p + np.eye(p)
    return weights, means, covs


def test_hungarian_relabelling_recovers_the_permutations():
    """Draws built by permuting a reference: relabelling to the unpermuted draw (0, 0)
    returns exactly the inverse permutations, and the relabelled draws are the
    unpermuted perturbed ones."""
    rng = np.random.default_rng(2)
    c, t, m = 2, 6, 4
    ref = _reference(rng, m)
    perms = np.stack([rng.permutation(m) for _ in range(c * t)]).reshape(c, t, m)
    perms[0, 0] = np.arange(m)
    # the empty component's mean in the draws wanders far (as a prior draw does)
    result = _constructed_result(rng, perms, *ref)
    means = np.asarray(result.means).copy()
    means[perms == m - 1] += rng.normal(size=(c * t, 3)) * 30.0
    result = mixture.GibbsResult(None, result.loglik, result.alpha, result.counts,
                                 result.weights, means, result.covariances)
    draws = mixture.relabel(result, reference=(0, 0))
    inverse = np.argsort(perms, axis=-1)
    np.testing.assert_array_equal(draws.permutation, inverse)
    for name in ("weights", "means", "covariances", "counts"):
        raw = np.asarray(getattr(result, name))
        unpermuted = np.empty_like(raw)
        for i, s in itertools.product(range(c), range(t)):
            unpermuted[i, s, perms[i, s]] = raw[i, s]
        np.testing.assert_array_equal(getattr(draws, name), unpermuted)


def test_hungarian_relabelling_minimises_the_documented_cost():
    """Random draws, m = 4: the permutation of every draw is the cheapest of all 4! under
    C_jl = m (w_j + w*_l) / 2 sum_a (mu_ja - mu*_la)^2 / s_a^2 + m^2 (w_j - w*_l)^2,
    s_a^2 = sum_l w*_l Sigma*_l,aa, summed over the pairs (l, permutation[l])."""
    rng = np.random.default_rng(8)
    c, t, m, p = 2, 30, 4, 2
    weights = rng.dirichlet(np.ones(m), size=(c, t))
    means = rng.normal(size=(c, t, m, p))
    A = rng.normal(size=(c, t, m, p, p))
    covs = A @ A.transpose(0, 1, 2, 4, 3) + np.eye(p)
    result = mixture.GibbsResult(None, rng.normal(size=(c, t)), np.ones((c, t)),
                                 weights * 50, weights, means, covs)
    draws = mixture.relabel(result, reference=(1, 7))
    w_ref, mu_ref, cov_ref = weights[1, 7], means[1, 7], covs[1, 7]
    s2 = sum(w_ref[l] * np.diag(cov_ref[l]) for l in range(m))
    greedy_is_a_permutation = []
    for i, s in itertools.product(range(c), range(t)):
        def cost(j, l, i=i, s=s):
            distance = np.sum((means[i, s, j] - mu_ref[l]) ** 2 / s2)
            return (m * (weights[i, s, j] + w_ref[l]) / 2 * distance
                    + m**2 * (weights[i, s, j] - w_ref[l]) ** 2)
        table = np.array([[cost(j, l) for j in range(m)] for l in range(m)])
        best = min(itertools.permutations(range(m)),
                   key=lambda perm: sum(table[l, j] for l, j in enumerate(perm)))
        np.testing.assert_array_equal(draws.permutation[i, s], best)
        greedy_is_a_permutation.append(len(set(np.argmin(table, axis=1))) == m)
    # both ways to the optimum ran: the row minima and the Hungarian algorithm
    assert any(greedy_is_a_permutation) and not all(greedy_is_a_permutation)


def test_hungarian_reference_defaults_to_the_best_scored_draw():
    """loglik[:, s] scores the draw of sweep s - 1: the default reference is the kept
    draw before the highest score, whose labelling the relabelled draws take."""
    rng = np.random.default_rng(3)
    c, t, m = 2, 5, 4
    perms = np.stack([rng.permutation(m) for _ in range(c * t)]).reshape(c, t, m)
    loglik = np.zeros((c, t))
    loglik[1, 4] = 10.0  # scores draw (1, 3)
    loglik[0, 1] = 20.0  # scores draw (0, 0), which burn=1 drops
    result = _constructed_result(rng, perms, *_reference(rng, m), loglik=loglik)
    draws = mixture.relabel(result, burn=1)
    # relabelled component l is reference component perms[1, 3, l] in every draw
    expected = np.argsort(perms[:, 1:], axis=-1)[..., perms[1, 3]]
    np.testing.assert_array_equal(draws.permutation, expected)
    assert draws.weights.shape == (c, t - 1, m)


def test_ordering_constraint_sorts_every_draw():
    rng = np.random.default_rng(4)
    c, t, m = 2, 4, 5
    perms = np.stack([rng.permutation(m) for _ in range(c * t)]).reshape(c, t, m)
    result = _constructed_result(rng, perms, rng.dirichlet(np.ones(m)),
                                 rng.normal(size=(m, 3)), np.stack([np.eye(3)] * m))
    raw_w, raw_mu = np.asarray(result.weights), np.asarray(result.means)
    by_weight = mixture.relabel(result, method="order")
    by_mean = mixture.relabel(result, burn=1, method="order", order_by=2)
    for i, s in itertools.product(range(c), range(t)):
        np.testing.assert_array_equal(by_weight.weights[i, s], sorted(raw_w[i, s])[::-1])
        if s >= 1:
            order = sorted(range(m), key=lambda j, i=i, s=s: raw_mu[i, s, j, 2])
            np.testing.assert_array_equal(by_mean.means[i, s - 1], raw_mu[i, s, order])
    none = mixture.relabel(result, burn=2, method="none")
    np.testing.assert_array_equal(none.means, raw_mu[:, 2:])


def _quantile(values, q):
    """The linear-interpolation quantile from the sorted values (numpy's default rule)."""
    values = np.sort(values)
    position = (len(values) - 1) * q
    below = int(np.floor(position))
    above = min(below + 1, len(values) - 1)
    return values[below] + (position - below) * (values[above] - values[below])


def test_summary_means_and_credible_intervals():
    rng = np.random.default_rng(5)
    c, t, m, p = 2, 50, 4, 2
    perms = np.broadcast_to(np.arange(m), (c, t, m))
    result = _constructed_result(rng, perms, *_reference(rng, m, p), noise=0.2)
    draws = mixture.relabel(result, method="none")
    summary = draws.summary(level=0.8)
    assert summary.level == 0.8
    for name in ("weights", "means", "covariances"):
        raw = np.asarray(getattr(result, name))
        estimate = getattr(summary, name)
        for index in np.ndindex(raw.shape[2:]):
            pooled = raw[(slice(None), slice(None), *index)].ravel()
            assert estimate.mean[index] == pytest.approx(np.sum(pooled) / (c * t), rel=1e-12)
            assert estimate.lower[index] == pytest.approx(_quantile(pooled, 0.1), rel=1e-12)
            assert estimate.upper[index] == pytest.approx(_quantile(pooled, 0.9), rel=1e-12)
    params = summary.params
    np.testing.assert_allclose(np.asarray(params.covariances), summary.covariances.mean)
    text = summary.table(min_weight=0.01)
    assert "80% interval" in text
    assert f"{summary.means.upper[0, 1]:.5g}" in text
    assert text.count("weight") == 3  # the 1e-4 component is left out
    assert str(summary).count("weight") == 4


def test_draws_convert_to_arviz():
    az = pytest.importorskip("arviz")
    rng = np.random.default_rng(6)
    c, t, m, p = 2, 400, 2, 2
    perms = np.broadcast_to(np.arange(m), (c, t, m))
    result = _constructed_result(rng, perms, *_reference(rng, m, p), noise=0.1)
    means = np.asarray(result.means).copy()
    means[1, :, 1] += 1.0  # chain 1 disagrees on component 1's mean
    result = mixture.GibbsResult(None, result.loglik, result.alpha, result.counts,
                                 result.weights, means, result.covariances)
    draws = mixture.relabel(result, method="none")
    tree = draws.to_arviz(feature_names=["a", "b"])
    posterior = tree["posterior"]
    assert posterior["means"].dims == ("chain", "draw", "component", "feature")
    assert posterior["covariances"].dims[-2:] == ("feature", "feature_bis")
    assert list(posterior["means"].coords["feature"].values) == ["a", "b"]
    np.testing.assert_array_equal(posterior["covariances"].values, draws.covariances)
    np.testing.assert_array_equal(tree["sample_stats"]["loglik"].values, draws.loglik)
    np.testing.assert_array_equal(posterior["alpha"].values, draws.alpha)
    fixed = mixture.relabel(mixture.GibbsResult(
        None, result.loglik, np.ones((c, t)), result.counts, result.weights, means,
        result.covariances), method="none")
    assert "alpha" not in fixed.to_arviz()["posterior"]  # alpha was not sampled
    rhat = az.rhat(tree)["means"].values
    # iid draws agree across chains (R-hat ~ 1); the shifted component does not
    assert np.all(np.abs(rhat[0] - 1) < 0.02), rhat
    assert np.all(rhat[1] > 1.5), rhat
    ess = az.ess(tree)["weights"].values
    assert np.all((ess > 0.7 * c * t) & (ess < 1.3 * c * t)), ess  # iid: ess ~ c t


def test_bad_arguments_are_named():
    rng = np.random.default_rng(7)
    perms = np.broadcast_to(np.arange(3), (1, 4, 3))
    result = _constructed_result(rng, perms, *_reference(rng, 3, 2))
    with pytest.raises(TypeError, match="GibbsResult"):
        mixture.relabel({"weights": 1})
    for bad, name in (({"method": "stephens"}, "method"), ({"burn": 4}, "burn"),
                      ({"burn": -1}, "burn"), ({"reference": (1, 0)}, "reference"),
                      ({"reference": 3}, "reference"),
                      ({"method": "order", "reference": (0, 0)}, "reference"),
                      ({"method": "order", "order_by": 2}, "order_by"),
                      ({"method": "order", "order_by": "means"}, "order_by")):
        with pytest.raises(ValueError, match=name):
            mixture.relabel(result, **bad)
    draws = mixture.relabel(result)
    for level in (0.0, 1.0, float("nan")):
        with pytest.raises(ValueError, match="level"):
            draws.summary(level)
    with pytest.raises(ValueError, match="min_weight"):
        draws.summary().table(min_weight=-1.0)
    pytest.importorskip("arviz")
    with pytest.raises(ValueError, match="feature_names"):
        draws.to_arviz(feature_names=["x"])
