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
# row gradients and Hessians (Stage 2) and make Newton steps in the joint coefficients
# [β_m | β_g | β_h | β_w] with the matrix-free joint Hessian-vector product.

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
# ## Newton steps with the joint operators
# The data part of the joint Hessian is Σ_i J_iᵀ H_i J_i (not necessarily positive
# definite away from the optimum); the damped Newton direction solves (H + λI) d = score
# by conjugate gradients with the resident-Hessian HVP, using the diagonal as a Jacobi
# preconditioner, then halves the step until the objective drops. Where H has an
# eigenvalue below -λ the direction can point uphill (score·d < 0), so λ grows tenfold
# until the direction descends and a step length lowers the objective
# (Levenberg-Marquardt). The dense block checks the CG solution.

# %%
def split(flat):
    return dict(zip(("m", "g", "h", "w"), np.split(flat, np.cumsum([2, 2, p_h])), strict=True))


def total_neglog(beta):
    derivs = bms.row_derivatives(rows_at(beta))
    ok = bool(np.all(np.asarray(derivs.status) == 0))
    return float(np.sum(derivs.neglog)) if ok else np.inf


def newton_step(beta):
    derivs = bms.row_derivatives(rows_at(beta))
    op = bms.JointOperator.from_rows(derivs, x, g)
    loglik_score = bms.joint_gradient(derivs, x, g)
    score_vec = loglik_score[1:]
    print(f"  loglik={float(loglik_score[0]):.6f}  |score|={float(np.linalg.norm(score_vec)):.2e}")
    flat = np.concatenate([beta["m"], beta["g"], beta["h"], beta["w"]])
    current = -float(loglik_score[0])
    for ridge in (1.0, 10.0, 100.0):
        precond = 1.0 / (op.diagonal() + ridge)
        direction, _ = jax.scipy.sparse.linalg.cg(
            lambda v, ridge=ridge: op.hvp(v) + ridge * v, score_vec,
            M=lambda v, precond=precond: precond * v, tol=1e-12)
        exact = np.linalg.solve(np.asarray(op.dense()) + ridge * np.eye(op.p_total), score_vec)
        slope = float(score_vec @ direction)
        print(f"  λ={ridge:g}: CG vs dense solve {float(np.max(np.abs(direction - exact))):.1e}"
              f", score·d {slope:.2e}")
        if slope <= 0:  # uphill: more damping
            continue
        # step halving: accept the first step that lowers the objective with every row ok
        for step in 0.5 ** np.arange(5):
            trial = split(flat + step * np.asarray(direction))
            value = total_neglog(trial)
            if value < current:
                return trial, value, step
    return beta, current, 0.0


for it in range(1 if SMALL else 6):
    print(f"step {it}")
    beta, value, step = newton_step(beta)
    print(f"  step length {step:g}, neglog {value:.6f}")
    assert step > 0, "no damping and step length lowered the objective"


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
