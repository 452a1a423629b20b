# %% [markdown]
# # Gaussian mixtures at scale: EM, BEM and Gibbs on flow-cytometry-like data
#
# Flow cytometry measures a handful of fluorescence markers on millions of cells;
# cell populations appear as (roughly) Gaussian clusters after an `arcsinh`
# transform. This notebook simulates such data, fits `gpustat.GaussianMixture`
# by EM (the fused E-step kernel on a GPU, the reference elsewhere), chooses the
# number of populations by BIC, and runs the blocked Gibbs sampler of the
# truncated Dirichlet-process mixture (`gpustat.mixture.fit_gibbs`) from the
# posterior-mode (BEM) fit. Set `GPUSTAT_NOTEBOOK_SMALL=1` for a quick run.

# %%
import os
import tempfile
import time

import arviz as az
import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

import gpustat
from gpustat import mixture

# Compiled programs persist across runs (JAX's compilation cache; the library itself never
# switches it on).
jax.config.update("jax_compilation_cache_dir",
                  os.path.join(os.path.expanduser("~"), ".cache", "gpustat-jax", "jax"))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)

SMALL = os.environ.get("GPUSTAT_NOTEBOOK_SMALL") == "1"
n_cells = 3_000 if SMALL else 200_000
print("backends here:", gpustat.available_backends())

# %% [markdown]
# ## Simulated cytometry: 5 populations, 6 markers, arcsinh-transformed intensities
#
# Each population is Gaussian on the transformed scale (spread 0.25 around the
# arcsinh of its marker levels), so the model is right and k = 5 is the truth.

# %%
rng = np.random.default_rng(42)
markers = ["CD3", "CD4", "CD8", "CD19", "CD56", "CD14"]
# population: (share, marker levels on the raw intensity scale)
populations = {
    "CD4 T": (0.30, [800, 900, 20, 10, 15, 30]),
    "CD8 T": (0.20, [850, 30, 700, 10, 40, 20]),
    "B": (0.15, [20, 25, 15, 900, 10, 40]),
    "NK": (0.10, [30, 20, 300, 15, 800, 20]),
    "monocytes": (0.25, [40, 300, 20, 30, 30, 1200]),
}
counts = rng.multinomial(n_cells, [share for share, _ in populations.values()])
raw = 150.0 * np.sinh(np.concatenate([
    rng.normal(np.arcsinh(np.asarray(levels) / 150.0), 0.25, size=(c, len(markers)))
    for c, (_, levels) in zip(counts, populations.values(), strict=True)]))
truth = np.repeat(np.arange(len(populations)), counts)
X = np.arcsinh(raw / 150.0).astype(np.float32)  # the usual cytometry cofactor transform
print(X.shape, X.dtype)

# %% [markdown]
# ## Number of populations by BIC (EM, batched restarts)

# %%
ks = range(4, 8) if SMALL else range(2, 10)
bics, models = [], {}
for k in ks:
    gm = mixture.GaussianMixture(k, n_init=3, random_state=0, max_iter=200).fit(X)
    bics.append(gm.bic(X))
    models[k] = gm
    print(f"k={k}: BIC {bics[-1]:.1f}, converged {gm.converged_} in {gm.n_iter_} iterations")
best_k = list(ks)[int(np.argmin(bics))]
print("BIC picks k =", best_k)

fig, ax = plt.subplots(figsize=(5, 3))
ax.plot(list(ks), bics, "o-")
ax.set(xlabel="components k", ylabel="BIC", title="BIC over k")
fig.tight_layout()
fig.savefig(os.path.join(tempfile.gettempdir(), "gpustat_mixture_bic.png"), dpi=80)

# %% [markdown]
# ## The EM fit at the chosen k; agreement with the simulated populations

# %%
gm = models[best_k]
start = time.perf_counter()
labels = gm.predict(X)
print(f"EM fit: lower bound {gm.lower_bound_:.4f}, {gm.n_iter_} iterations; "
      f"predict {time.perf_counter() - start:.3f} s")


def purity(labels, truth):
    """Share of cells whose cluster's majority population is their own."""
    total = 0
    for j in np.unique(labels):
        total += np.bincount(truth[labels == j]).max()
    return total / len(truth)


print(f"EM purity vs the simulated populations: {purity(labels, truth):.3f}")

# %% [markdown]
# ## Bayesian fit: BEM (posterior mode) then blocked Gibbs of the truncated DP mixture

# %%
Xj = jnp.asarray(X)
truncation = 8
init = mixture.initialize(jax.random.key(1), Xj, truncation, method="kmeans")
bem = mixture.fit_bem(Xj, jax.tree.map(lambda a: a[0], init), alpha=1.0, max_iter=200)
print("BEM status", int(bem.status), "weights", np.round(np.asarray(bem.params.weights), 3))
n_sweeps = 40 if SMALL else 400
start = time.perf_counter()
gibbs = mixture.fit_gibbs(jax.random.key(2), Xj, truncation, n_sweeps=n_sweeps, n_chains=2,
                          init=bem.params)
jax.block_until_ready(gibbs)
print(f"Gibbs: {n_sweeps} sweeps x 2 chains in {time.perf_counter() - start:.2f} s")
burn = n_sweeps // 2
occupied = np.asarray(gibbs.counts[:, burn:] > 0.01 * len(X)).sum(-1)
print("occupied components per sweep (after burn-in): mean",
      occupied.mean(), "range", occupied.min(), "-", occupied.max())
print("posterior mean of alpha:", float(gibbs.alpha[:, burn:].mean()))

# %% [markdown]
# ## Posterior summaries: relabelling, credible intervals, R-hat
#
# A component's label can switch between sweeps and chains, so the draws are
# relabelled before they are averaged: `relabel` permutes every kept draw to the
# one of highest log-likelihood (Hungarian assignment on means and weights). The
# summary gives posterior means and 90% credible intervals; ArviZ computes R-hat
# and effective sample sizes from `to_arviz()`. R-hat above about 1.01 or a bulk
# ESS of a few dozen says the chains have not mixed: run more sweeps (the quick
# run's 40 sweeps are far too few; the over-split populations below also keep
# components trading cells).

# %%
draws = mixture.relabel(gibbs, burn=burn)
summary = draws.summary(level=0.9)
heavy = summary.weights.mean >= 0.05
print(summary.table(min_weight=0.05))
tree = draws.to_arviz(feature_names=markers)
print("R-hat of the relabelled means (components of weight >= 5%):")
print(np.round(az.rhat(tree)["means"].values[heavy], 3))
print("bulk ESS of their weights:", np.round(az.ess(tree)["weights"].values[heavy]))

# %% [markdown]
# ## EM against Gibbs
#
# The same questions to both fits: how well they explain the cells (mean
# log-likelihood per cell; for Gibbs the average over the sweeps after burn-in),
# how pure their clusters are, and into how many clusters (holding more than 1% of
# a population) each simulated population is cut. Gibbs labels are the most
# probable component under chain 0's last draw. A truncated-DP sampler started
# from an over-split fit moves one label at a time and seldom merges two halves of
# a population, so its count of occupied components can overstate the number of
# populations: compare the counts below.

# %%
last = jax.tree.map(lambda a: a[0], gibbs.state.params)
gibbs_labels = np.asarray(jnp.argmax(mixture.responsibilities(Xj, last), axis=1))


def pieces(labels, truth):
    """For each population, the number of clusters holding more than 1% of its cells."""
    return [int(np.sum(np.bincount(labels[truth == t]) > 0.01 * np.sum(truth == t)))
            for t in range(len(populations))]


gibbs_loglik = float(np.asarray(gibbs.loglik[:, burn:]).mean()) / len(X)
print(f"EM (k={best_k}):   log-likelihood per cell {gm.score(X):.4f}, purity "
      f"{purity(labels, truth):.3f}, clusters per population {pieces(labels, truth)}")
print(f"Gibbs (m={truncation}): log-likelihood per cell {gibbs_loglik:.4f}, purity "
      f"{purity(gibbs_labels, truth):.3f}, clusters per population "
      f"{pieces(gibbs_labels, truth)}")

fig, axes = plt.subplots(1, 3, figsize=(13, 3.5))
axes[0].plot(np.asarray(gibbs.loglik).T / len(X))
axes[0].axhline(gm.score(X), color="k", ls="--", label=f"EM, k={best_k}")
axes[0].set(xlabel="sweep", ylabel="log-likelihood per cell", title="Gibbs traces (2 chains)")
axes[0].legend()
for ax, lab, title in ((axes[1], labels, f"EM clusters (k={best_k})"),
                       (axes[2], gibbs_labels, "Gibbs clusters (chain 0, last sweep)")):
    ax.scatter(X[:, 0], X[:, 5], s=1, c=lab, cmap="tab10")
    ax.set(xlabel=markers[0], ylabel=markers[5], title=title)
fig.tight_layout()
figure_path = os.path.join(tempfile.gettempdir(), "gpustat_mixture.png")
fig.savefig(figure_path, dpi=80)
print("figures written to", figure_path, "and gpustat_mixture_bic.png beside it")
