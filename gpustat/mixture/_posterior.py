"""Posterior output of the Gibbs sampler: relabelling, summaries and ArviZ draws.

**Label switching.** The mixture likelihood is the same under every permutation of the
components, so a component index of :func:`gpustat.mixture.fit_gibbs` need not name the
same population from sweep to sweep, nor across chains. :func:`relabel` gives every kept
draw a permutation before anything is averaged:

* ``method="hungarian"`` (default): the permutation of each draw (w, mu, Sigma) nearest
  a reference draw (w*, mu*, Sigma*), found by the Hungarian algorithm
  (``scipy.optimize.linear_sum_assignment``) on the m x m cost

      C_jl = m (w_j + w*_l) / 2 * sum_a (mu_ja - mu*_la)^2 / s_a^2 + m^2 (w_j - w*_l)^2,
      s_a^2 = sum_l w*_l Sigma*_l,aa:

  the squared distance of the means in units of the reference's average within-component
  standard deviation, weighted by the two components' weights (relative to 1/m), so that
  the means of (nearly) empty components, which are draws from the prior, count little;
  between components of weight 1/m a mean one unit away costs as much as a weight
  difference of 1/m. The reference
  is, unless given, the kept draw whose parameters had the highest log-likelihood (the
  pivot of Marin, Mengersen and Robert 2005, section 4.2).
* ``method="order"``: an ordering constraint, the components of every draw sorted by
  decreasing weight or by increasing mean of one feature (``order_by``). It is cheap,
  but relabels well only where the ordered quantity separates the components.
* ``method="none"``: the sampler's labels.

**Summaries** (:meth:`MixtureDraws.summary`) pool the chains: posterior means and
equal-tailed credible intervals (quantiles (1 - level) / 2 and (1 + level) / 2 of the
draws) of the weights, means and covariances. **Diagnostics** come from ArviZ
(:meth:`MixtureDraws.to_arviz`, the optional ``arviz`` extra): ``arviz.rhat``,
``arviz.ess`` and ``arviz.summary`` of the relabelled draws.

Marin, J.-M., Mengersen, K. and Robert, C. P. (2005), Bayesian modelling and inference on
mixtures of distributions, Handbook of Statistics 25, 459-507. Stephens, M. (2000),
Dealing with label switching in mixture models, JRSS B 62(4), 795-809.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import scipy.optimize

from gpustat._checks import check_int, check_real
from gpustat.mixture._gibbs import GibbsResult
from gpustat.reference.mixture import MixtureParams

__all__ = ["MixtureDraws", "PosteriorEstimate", "PosteriorSummary", "relabel"]

RELABEL_METHODS = ("hungarian", "order", "none")
_COST_CHUNK = 1 << 22  # cost-matrix entries formed at once (32 MiB of float64)


@dataclasses.dataclass(frozen=True)
class PosteriorEstimate:
    """Posterior mean and equal-tailed credible interval of one parameter, elementwise.

    Attributes:
        mean: posterior mean (the parameter's shape).
        lower: lower end, the (1 - level) / 2 quantile of the draws.
        upper: upper end, the (1 + level) / 2 quantile of the draws.
    """

    mean: np.ndarray
    lower: np.ndarray
    upper: np.ndarray


@dataclasses.dataclass(frozen=True)
class PosteriorSummary:
    """Posterior means and credible intervals of a mixture's parameters (chains pooled).

    Attributes:
        level: credible level of the intervals.
        weights: :class:`PosteriorEstimate` of the weights, (m,).
        means: :class:`PosteriorEstimate` of the means, (m, p).
        covariances: :class:`PosteriorEstimate` of the covariances, (m, p, p).
    """

    level: float
    weights: PosteriorEstimate
    means: PosteriorEstimate
    covariances: PosteriorEstimate

    @property
    def params(self) -> MixtureParams:
        """The posterior means as full-covariance :class:`MixtureParams` (a mean of
        positive definite draws is positive definite; the mean weights sum to 1)."""
        return MixtureParams.from_covariances(jnp.asarray(self.weights.mean),
                                              jnp.asarray(self.means.mean),
                                              jnp.asarray(self.covariances.mean), "full")

    def table(self, min_weight: float = 0.0) -> str:
        """A text table: per component of posterior mean weight >= ``min_weight``, the
        weight, every mean and every standard deviation sqrt(Sigma_aa) (posterior mean of
        Sigma_aa, square-rooted), each with its credible interval."""
        min_weight = check_real(min_weight, "min_weight", 0.0)
        pct = f"{100 * self.level:g}%"
        lines = [f"{'component':>9}  {'parameter':<12} {'mean':>12}  {pct + ' interval':>27}"]

        def row(j, name, mean, lower, upper):
            lines.append(f"{j:>9}  {name:<12} {mean:>12.5g}  [{lower:>12.5g}, {upper:>12.5g}]")

        w, mu, cov = self.weights, self.means, self.covariances
        for j in np.flatnonzero(w.mean >= min_weight):
            row(j, "weight", w.mean[j], w.lower[j], w.upper[j])
            for a in range(mu.mean.shape[1]):
                row(j, f"mean[{a}]", mu.mean[j, a], mu.lower[j, a], mu.upper[j, a])
            for a in range(mu.mean.shape[1]):
                row(j, f"sd[{a}]", *(np.sqrt(e[j, a, a]) for e in
                                     (cov.mean, cov.lower, cov.upper)))
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


@dataclasses.dataclass(frozen=True)
class MixtureDraws:
    """Relabelled posterior draws of c chains x t kept sweeps (numpy arrays).

    Attributes:
        loglik: (c, t) log-likelihood of the data under the parameters of the previous
            sweep (what :class:`~gpustat.mixture.GibbsResult` records).
        alpha: (c, t) concentration draws.
        counts: (c, t, m) component sizes N_j (of the labels the draw was made from).
        weights: (c, t, m) weights.
        means: (c, t, m, p) means.
        covariances: (c, t, m, p, p) covariances.
        permutation: (c, t, m) integers: relabelled component l of a draw is the
            sampler's component ``permutation[..., l]`` of that draw.
    """

    loglik: np.ndarray
    alpha: np.ndarray
    counts: np.ndarray
    weights: np.ndarray
    means: np.ndarray
    covariances: np.ndarray
    permutation: np.ndarray

    def summary(self, level: float = 0.95) -> PosteriorSummary:
        """Posterior means and equal-tailed ``level`` credible intervals, chains pooled.

        Args:
            level: credible level in (0, 1).

        Returns:
            :class:`PosteriorSummary` of the weights (m,), means (m, p) and
            covariances (m, p, p).
        """
        level = check_real(level, "level", 0.0, 1.0, low_open=True)
        probs = [(1.0 - level) / 2.0, (1.0 + level) / 2.0]

        def estimate(draws):
            pooled = draws.reshape(-1, *draws.shape[2:])
            lower, upper = np.quantile(pooled, probs, axis=0)
            return PosteriorEstimate(pooled.mean(axis=0), lower, upper)

        return PosteriorSummary(level, estimate(self.weights), estimate(self.means),
                                estimate(self.covariances))

    def to_arviz(self, feature_names=None):
        """The draws as an ArviZ ``DataTree`` (``arviz.from_dict``; needs ``arviz>=1.0``,
        the ``arviz`` extra), for ``arviz.rhat``, ``arviz.ess``, ``arviz.summary``.

        Group ``posterior``: ``weights`` (chain, draw, component), ``means`` (chain, draw,
        component, feature), ``covariances`` (chain, draw, component, feature,
        feature_bis) and, when it was sampled (not constant), ``alpha`` (chain, draw);
        group ``sample_stats``: ``loglik`` (chain, draw) and ``counts`` (chain, draw,
        component).

        Args:
            feature_names: p names for the ``feature`` coordinate; default 0..p-1.
        """
        try:
            import arviz
        except ImportError as error:
            raise ImportError("MixtureDraws.to_arviz needs ArviZ >= 1.0: "
                              "pip install 'gpustat[arviz]'") from error
        m, p = self.means.shape[2:]
        features = np.arange(p) if feature_names is None else np.asarray(feature_names)
        if features.shape != (p,):
            raise ValueError(f"feature_names must be p={p} names, got shape "
                             f"{features.shape}")
        component = ["component"]
        posterior = {"weights": self.weights, "means": self.means,
                     "covariances": self.covariances}
        if np.any(self.alpha != self.alpha.flat[0]):
            posterior["alpha"] = self.alpha
        return arviz.from_dict(
            {"posterior": posterior,
             "sample_stats": {"loglik": self.loglik, "counts": self.counts}},
            dims={"weights": component, "means": [*component, "feature"],
                  "covariances": [*component, "feature", "feature_bis"],
                  "counts": component},
            coords={"component": np.arange(m), "feature": features,
                    "feature_bis": features})


def relabel(result: GibbsResult, *, burn: int = 0, method: str = "hungarian",
            reference: tuple[int, int] | None = None,
            order_by: str | int = "weights") -> MixtureDraws:
    """Drop the burn-in and relabel every draw of a Gibbs run against label switching.

    Args:
        result: :class:`~gpustat.mixture.GibbsResult` of :func:`~gpustat.mixture.fit_gibbs`.
        burn: sweeps dropped at the start of every chain (0 <= burn < t).
        method: "hungarian" (to a reference draw), "order" (an ordering constraint) or
            "none" (see the module docstring).
        reference: ``(chain, sweep)`` of the reference draw for "hungarian" (any sweep,
            burn-in included); default the kept draw of highest log-likelihood.
        order_by: for "order": "weights" (decreasing) or a feature index a (increasing
            mu_a).

    Returns:
        :class:`MixtureDraws` of the c chains' t - burn kept sweeps.
    """
    if not isinstance(result, GibbsResult):
        raise TypeError(f"result must be a GibbsResult, got {type(result).__name__}")
    if method not in RELABEL_METHODS:
        raise ValueError(f"method must be one of {RELABEL_METHODS}, got {method=!r}")
    if reference is not None and method != "hungarian":
        raise ValueError(f"reference is for method='hungarian', got {method=!r}")
    loglik, alpha, counts, weights, means, covariances = (np.asarray(a) for a in (
        result.loglik, result.alpha, result.counts, result.weights, result.means,
        result.covariances))
    c, t, m, p = means.shape
    burn = check_int(burn, "burn", 0)
    if burn >= t:
        raise ValueError(f"burn must leave a draw of the t={t} sweeps, got {burn=}")
    if method == "hungarian":
        if reference is None:
            reference = _best_draw(loglik, burn)
        reference = _check_reference(reference, c, t)
        permutation = _hungarian(weights[:, burn:], means[:, burn:],
                                 weights[reference], means[reference], covariances[reference])
    elif method == "order":
        if isinstance(order_by, str) and order_by == "weights":
            key = -weights[:, burn:]
        elif isinstance(order_by, (int, np.integer)) and not isinstance(order_by, bool) \
                and 0 <= order_by < p:
            key = means[:, burn:, :, order_by]
        else:
            raise ValueError(f"order_by must be 'weights' or a feature index in [0, {p}), "
                             f"got {order_by=!r}")
        permutation = np.argsort(key, axis=-1, kind="stable")
    else:
        permutation = np.broadcast_to(np.arange(m), (c, t - burn, m))

    chains, sweeps = np.ogrid[:c, burn:t]

    def take(draws):  # draws[i, burn + s, permutation[i, s, l], ...]
        return draws[chains[:, :, None], sweeps[:, :, None], permutation]

    return MixtureDraws(loglik[:, burn:], alpha[:, burn:], take(counts), take(weights),
                        take(means), take(covariances), np.array(permutation))


def _best_draw(loglik: np.ndarray, burn: int) -> tuple[int, int]:
    """(chain, sweep) of the kept draw whose parameters scored the highest log-likelihood:
    ``loglik[:, s]`` is that of the parameters drawn at sweep s - 1."""
    scored = loglik[:, burn + 1:]
    if scored.shape[1] == 0:
        return 0, burn
    chain, sweep = np.unravel_index(np.argmax(np.where(np.isnan(scored), -np.inf, scored)),
                                    scored.shape)
    return int(chain), burn + int(sweep)


def _check_reference(reference, c: int, t: int) -> tuple[int, int]:
    ok = (isinstance(reference, tuple) and len(reference) == 2
          and all(isinstance(i, (int, np.integer)) and not isinstance(i, bool)
                  for i in reference)
          and 0 <= reference[0] < c and 0 <= reference[1] < t)
    if not ok:
        raise ValueError(f"reference must be a (chain, sweep) pair in [0, {c}) x [0, {t}), "
                         f"got {reference=!r}")
    return int(reference[0]), int(reference[1])


def _hungarian(weights, means, ref_weights, ref_means, ref_covariances) -> np.ndarray:
    """(c, t, m) permutations minimising the module docstring's cost C to the reference."""
    c, t, m, p = means.shape
    ref_weights = ref_weights.astype(np.float64)
    spread = np.einsum("l,laa->a", ref_weights, ref_covariances.astype(np.float64))
    scale = 1.0 / np.sqrt(np.maximum(spread, np.finfo(np.float64).tiny))
    draws = means.reshape(c * t, m, p)
    weights = weights.reshape(c * t, m)
    b = ref_means * scale
    permutation = np.empty((c * t, m), np.int64)
    chunk = max(1, _COST_CHUNK // (m * m))
    for start in range(0, c * t, chunk):
        a = draws[start:start + chunk] * scale  # float64
        # |a_j - b_l|^2 expanded: (draws, m, m) costs without a (draws, m, m, p) array
        distance = ((a * a).sum(-1)[:, :, None] + (b * b).sum(-1)[None, None, :]
                    - 2.0 * np.matmul(a, b.T))
        w = weights[start:start + chunk, :, None].astype(np.float64)
        w_ref = ref_weights[None, None, :]
        cost = m * (w + w_ref) / 2.0 * np.maximum(distance, 0.0) + (m * (w - w_ref)) ** 2
        # rows: reference components l; columns: the draw's components j
        cost = cost.transpose(0, 2, 1)
        # where every reference component's cheapest draw component is a different one,
        # that permutation is optimal (its cost is the sum of the row minima, a lower bound
        # on every assignment's); the Hungarian algorithm runs on the other draws only
        greedy = np.argmin(cost, axis=-1)
        permutation[start:start + len(cost)] = greedy
        for d in np.flatnonzero(np.any(np.sort(greedy, axis=-1) != np.arange(m), axis=-1)):
            _, permutation[start + d] = scipy.optimize.linear_sum_assignment(cost[d])
    return permutation.reshape(c, t, m)
