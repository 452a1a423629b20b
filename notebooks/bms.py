# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # BMS FLEX: a probit GAM with a flexible link, row derivatives and a Newton step
#
# The Bernoulli marginal-slope model keeps the population-averaged success probability
# at Φ(q_i) with q_i = x_iᵀβ_m, while the conditional probit predictor
# η(z) = a + b z + b h(z) + w(a + b z) bends with a latent score z ~ N(0, 1) through a
# score warp h and a link deviation w (cubic splines). The intercept a is solved per
# row from ∫Φ(η)φ = Φ(q). Here: simulate data, build the rows (Stage 0 + 1), take the
# row gradients and Hessians (Stage 2) and fit the joint coefficients
# [β_m | β_g | β_h | β_w] with `bms.fit`, a Newton-CG loop on the matrix-free joint
# Hessian-vector product.

# %%
import os
import tempfile

import jax
import matplotlib.pyplot as plt
import numpy as np

jax.config.update("jax_enable_x64", True)

from gpustat import bms

# Compiled programs persist across runs (JAX's compilation cache; the library itself never
# switches it on).
jax.config.update("jax_compilation_cache_dir",
                  os.path.join(os.path.expanduser("~"), ".cache", "gpustat-jax", "jax"))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)

SMALL = os.environ.get("GPUSTAT_NOTEBOOK_SMALL") == "1"
n = 40 if SMALL else 2000
rng = np.random.default_rng(0)

# %% [markdown]
# ## Data and bases
# Marginal design x = (1, x1), slope design g = (1, x2); the bases are C² cubic
# B-spline combinations that are flat at their ends (constant continuation).

# %%
x = np.c_[np.ones(n), rng.normal(size=n)]
g = np.c_[np.ones(n), rng.normal(size=n)]
score = bms.flat_cubic_basis(np.linspace(-2.5, 2.5, 6))
link = bms.flat_cubic_basis(np.linspace(-3.0, 3.0, 6))
p_h, p_w = score.coeffs.shape[2], link.coeffs.shape[2]
z_obs = rng.normal(size=n)
true_q = x @ np.array([0.3, 0.8])
true_b = g @ np.array([0.9, 0.3])
y = (rng.random(n) < 0.5 * (1 + np.tanh(0.8 * (true_q + true_b * z_obs)))).astype(float)
print(f"n={n}, p_h={p_h}, p_w={p_w}, mean(y)={y.mean():.2f}")

# %% [markdown]
# ## Row derivatives at a starting point

# %%
beta = {"m": np.zeros(2), "g": np.array([0.5, 0.0]), "h": np.zeros(p_h),
        "w": 0.05 * np.ones(p_w)}


def rows_at(beta):
    return bms.build_rows(x @ beta["m"], g @ beta["g"], beta["h"], beta["w"], score, link,
                          z_obs, y, np.ones(n), 1.0)


rows = rows_at(beta)
derivs = bms.row_derivatives(rows)
print("cells per row:", np.diff(np.asarray(rows.cell_offsets))[:5], "...")
print("status counts:", np.bincount(np.asarray(derivs.status)))
print("total neglog:", float(np.sum(derivs.neglog)))
print("H_0 bitwise symmetric:", bool(np.array_equal(derivs.hess[0], derivs.hess[0].T)))

# %% [markdown]
# ## Fitting: damped Newton-CG in one compiled loop
# `bms.fit` minimises Σ_i ℓ_i + ½ βᵀSβ over the joint coefficients [β_m | β_g | β_h | β_w].
# Every iteration rebuilds the rows from β on the device (the intercept calibration
# included), solves (Σ_i J_iᵀ H_i J_i + S) d = -∇f by conjugate gradients on the
# resident-Hessian HVP with the Jacobi preconditioner of `joint_diagonal`, and backtracks
# the step until Armijo's condition holds; the whole loop is one `lax.while_loop`. A ridge
# S on the spline coefficients keeps them where every row calibrates.

# %%
p_total = 4 + p_h + p_w
penalty = np.diag([0.0] * 4 + [2.0] * (p_h + p_w))
start = np.concatenate([beta["m"], beta["g"], beta["h"], beta["w"]])
result = bms.fit(x, g, score, link, z_obs, y, np.ones(n), 1.0, beta0=start, penalty=penalty)
print(f"status {bms.FitStatus(int(result.status)).name}, {int(result.iterations)} Newton "
      f"steps, {int(result.cg_iterations)} CG iterations, objective {float(result.objective):.6f}, "
      f"max |gradient| {float(result.gradient_norm):.1e}")
assert int(result.status) == bms.FitStatus.CONVERGED


def split(flat):
    return dict(zip(("m", "g", "h", "w"), np.split(np.asarray(flat), np.cumsum([2, 2, p_h])),
                    strict=True))


beta = split(result.beta)
# the gradient at the optimum from the public operators: score = S β
derivs = bms.row_derivatives(rows_at(beta))
score_vec = np.asarray(bms.joint_gradient(derivs, x, g)[1:])
print("max |score - S beta|:", float(np.max(np.abs(score_vec - penalty @ np.asarray(result.beta)))))


# %% [markdown]
# ## The fitted link deviation and score warp

# %%
grid = np.linspace(-4, 4, 201)
fig, ax = plt.subplots(1, 2, figsize=(9, 3))
ax[0].plot(grid, np.asarray(score(grid)) @ beta["h"])
ax[0].set(title="score warp h(z)", xlabel="z", ylabel="h(z)")
ax[1].plot(grid, np.asarray(link(grid)) @ beta["w"])
ax[1].set(title="link deviation w(u)", xlabel="u", ylabel="w(u)")
fig.tight_layout()
figure_path = os.path.join(tempfile.gettempdir(), "gpustat_bms.png")
fig.savefig(figure_path, dpi=80)
print("figure written to", figure_path)
