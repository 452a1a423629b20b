# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Backfitting sweeps with batched border solves
#
# In SAC-style backfitting each atom is refit against its leave-one-out
# residual. Atoms with disjoint supports are independent, so one *colour class*
# of them is a batch of small bordered Newton systems, which
# `gpustat.solve_batched_border` solves at once.
#
# Toy model: points $y_j \in \mathbb{R}^2$ on a line. Atom $a$ covers a window of
# points; on each of them it contributes $t_{a,i} + W_a\beta_a$ (a per-row latent
# $t_{a,i}\in\mathbb{R}^2$ plus a shared border term, $\beta_a \in \mathbb{R}^3$).
# Two colour classes of windows tile the line, the second shifted, so every point
# is covered once per class. The objective
#
# $$\tfrac12\sum_j w_j\Big\|y_j - \sum_a c_{a,j}\Big\|^2
#   + \tfrac{\lambda}2\sum\|t\|^2 + \tfrac{\mu}2\sum\|\beta\|^2$$
#
# is quadratic per atom, so one Newton step is the exact block update and each
# sweep over the classes cannot increase it. Set `GPUSTAT_NOTEBOOK_SMALL=1` for
# a quick run.

# %%
import itertools
import os
import tempfile

import jax

jax.config.update("jax_enable_x64", True)
import matplotlib.pyplot as plt
import numpy as np

import gpustat

# Compiled programs persist across runs (JAX's compilation cache; the library itself never
# switches it on).
jax.config.update("jax_compilation_cache_dir",
                  os.path.join(os.path.expanduser("~"), ".cache", "gpustat-jax", "jax"))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)

SMALL = os.environ.get("GPUSTAT_NOTEBOOK_SMALL") == "1"
rng = np.random.default_rng(0)
M = 400 if SMALL else 50_000
D, K, LAM, MU = 2, 3, 0.1, 0.1
x = np.linspace(0, 8 * np.pi, M)
y = np.stack([np.sin(x), np.cos(0.5 * x)], axis=1) + 0.1 * rng.normal(size=(M, D))
w = rng.uniform(0.5, 2.0, size=M)


WIDTHS = (9, 17) if SMALL else (8, 41)  # small: one padded size, so one compile per class


def windows(start: int):
    """Contiguous windows of ``WIDTHS`` points tiling [0, M), the first one ``start`` long."""
    bounds = [0, start] if start else [0]
    while bounds[-1] < M:
        bounds.append(min(M, bounds[-1] + int(rng.integers(*WIDTHS))))
    return [np.arange(a, b) for a, b in itertools.pairwise(bounds)]


classes = [windows(0), windows(WIDTHS[0] + 3)]
atoms = [[{"rows": rows, "W": rng.normal(size=(D, K)) / np.sqrt(K),
           "t": np.zeros((rows.size, D)), "beta": np.zeros(K)} for rows in cls]
         for cls in classes]
print({f"class {c}": len(cls) for c, cls in enumerate(atoms)}, "atoms")


# %%
def contribution(atom):
    return atom["t"] + atom["W"] @ atom["beta"]


def fitted():
    total = np.zeros((M, D))
    for cls in atoms:
        for atom in cls:
            total[atom["rows"]] += contribution(atom)
    return total


def objective():
    resid = y - fitted()
    penalty = sum(LAM * np.sum(a["t"] ** 2) + MU * np.sum(a["beta"] ** 2)
                  for cls in atoms for a in cls)
    return 0.5 * np.sum(w[:, None] * resid**2) + 0.5 * penalty


def newton_systems(cls, total):
    """Each atom's gradient and Hessian against its leave-one-out residual."""
    H_tt, H_tb, g_t, H_bb, g_b = [], [], [], [], []
    for atom in cls:
        rows, W = atom["rows"], atom["W"]
        wi = w[rows][:, None]
        loo = y[rows] - (total[rows] - contribution(atom))
        err = wi * (contribution(atom) - loo)
        H_tt.append((wi[:, :, None] + LAM) * np.eye(D))
        H_tb.append(wi[:, :, None] * W)
        g_t.append(err + LAM * atom["t"])
        H_bb.append(np.sum(w[rows]) * W.T @ W + MU * np.eye(K))
        g_b.append(W.T @ err.sum(axis=0) + MU * atom["beta"])
    return gpustat.BorderBatch.from_atoms(H_tt, H_tb, g_t, H_bb, g_b)


solve = jax.jit(lambda batch: gpustat.solve_batched_border(batch, 0.0, 0.0))

# %% [markdown]
# ## Sweeps
#
# Each class is one batched solve; the layout of a class is the same every sweep,
# so the jitted solve compiles once per class.

# %%
history = [objective()]
for sweep in range(4 if SMALL else 8):
    for cls in atoms:
        sol = solve(newton_systems(cls, fitted()))
        status = np.asarray(sol.status)
        assert np.all(status == 0), f"failed atoms: {np.flatnonzero(status)}"
        for a, atom in enumerate(cls):
            delta_t, delta_beta = (np.asarray(v) for v in sol.atom(a))
            atom["t"] += delta_t
            atom["beta"] += delta_beta
    history.append(objective())
    print(f"sweep {sweep + 1}: objective {history[-1]:.6f}")
assert all(b <= a * (1 + 1e-12) for a, b in itertools.pairwise(history))

# the Newton step was the exact block update: solving the class updated last
# again, against the new residuals, moves nothing
again = solve(newton_systems(atoms[-1], fitted()))
print("largest step of a repeated solve of the last class:",
      f"{max(float(np.max(np.abs(np.asarray(v)))) for v in (again.delta_t, again.delta_beta)):.1e}")

# %%
fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
axes[0].semilogy(np.asarray(history) - min(history) + 1e-12, marker="o")
axes[0].set(xlabel="sweep", ylabel="objective - min", title="backfitting sweeps")
fit = fitted()
axes[1].plot(x, y[:, 0], ".", ms=2, label="y[0]")
axes[1].plot(x, fit[:, 0], label="fit[0]")
axes[1].legend()
axes[1].set(xlabel="x", ylabel="first coordinate", title="fit after the last sweep")
fig.tight_layout()
figure_path = os.path.join(tempfile.gettempdir(), "gpustat_border.png")
fig.savefig(figure_path, dpi=80)
print("figure written to", figure_path)
