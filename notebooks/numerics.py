# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Probit numerics in kernels
#
# `gpustat.numerics` gives `log Φ`, the Mills ratio `λ = φ/Φ` and the probit
# curvature `C = λ(x + λ)` from operations that lower inside Triton kernels.
# This notebook shows the tails where naive formulas fail, and the accuracy
# against mpmath. Set `GPUSTAT_NOTEBOOK_SMALL=1` for a quick run.

# %%
import os

import jax

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp
import matplotlib.pyplot as plt
import mpmath as mp
import numpy as np

from gpustat import numerics

SMALL = os.environ.get("GPUSTAT_NOTEBOOK_SMALL") == "1"
n = 200 if SMALL else 4000

# %% [markdown]
# ## Naive vs stable log Φ in the left tail

# %%
x = jnp.linspace(-60.0, 8.0, n)
naive = jnp.log(jax.scipy.stats.norm.cdf(x))
stable = numerics.log_ndtr(x)
print("naive log(Φ) is -inf for x <", float(x[jnp.argmax(jnp.isfinite(naive))]))

log_cdf, mills = numerics.log_ndtr_and_mills(x)
curvature = numerics.probit_curvature(x)
fig, axes = plt.subplots(1, 3, figsize=(12, 3))
axes[0].plot(x, stable, label="gpustat log_ndtr")
axes[0].plot(x, naive, "--", label="log(norm.cdf)")
axes[0].legend()
axes[1].plot(x, mills)
axes[1].set_title("Mills ratio λ(x)")
axes[2].plot(x, curvature)
axes[2].set_title("curvature C(x)")
fig.tight_layout()

# %% [markdown]
# ## Accuracy against mpmath (float64 and float32)

# %%
mp.mp.dps = 30
grid = np.linspace(-40.0, 10.0, 60 if SMALL else 400)


def mp_curvature(v):
    v = mp.mpf(v)
    lam = mp.npdf(v) / mp.ncdf(v)
    return float(lam * (v + lam))


expected = np.array([mp_curvature(v) for v in grid])
for dtype in (jnp.float64, jnp.float32):
    got = np.asarray(numerics.probit_curvature(jnp.asarray(grid, dtype)), np.float64)
    exact = np.array([mp_curvature(float(v)) for v in grid.astype(dtype)])
    print(jnp.dtype(dtype).name, "max relative error of C:",
          f"{np.max(np.abs(got - exact) / exact):.2e}")

# %% [markdown]
# ## Derivatives are exact formulas
#
# `jax.grad(log_ndtr)` is the Mills ratio and `jax.grad` of the Mills ratio is
# `-C`, through custom JVP rules, not derivatives of the rational approximations.

# %%
g = jax.vmap(jax.grad(numerics.log_ndtr))(jnp.asarray(grid))
print("max |grad log_ndtr - λ| / λ:",
      float(jnp.max(jnp.abs(g - numerics.log_ndtr_and_mills(jnp.asarray(grid))[1]) / g)))
