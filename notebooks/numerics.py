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
import tempfile

import jax

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp
import matplotlib.pyplot as plt
import mpmath as mp
import numpy as np

from gpustat import numerics

# Compiled programs persist across runs (JAX's compilation cache; the library itself never
# switches it on).
jax.config.update("jax_compilation_cache_dir",
                  os.path.join(os.path.expanduser("~"), ".cache", "gpustat-jax", "jax"))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)

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
axes[0].set(title="log Φ(x)", xlabel="x", ylabel="log Φ(x)")
axes[0].legend()
axes[1].plot(x, mills)
axes[1].set(title="Mills ratio λ(x)", xlabel="x", ylabel="λ(x)")
axes[2].plot(x, curvature)
axes[2].set(title="curvature C(x)", xlabel="x", ylabel="C(x)")
fig.tight_layout()
figure_path = os.path.join(tempfile.gettempdir(), "gpustat_numerics.png")
fig.savefig(figure_path, dpi=80)
print("figure written to", figure_path)

# %% [markdown]
# ## Accuracy against mpmath (float64 and float32)
#
# Relative errors of `log Φ`, `λ` and `C` against 30-digit mpmath values, each
# computed at the input as rounded to the dtype.

# %%
mp.mp.dps = 30
grid = np.linspace(-40.0, 10.0, 60 if SMALL else 400)


def mp_values(v):
    """(log Φ, λ, C) at v in mpmath (log Φ = log1p(-Φ(-v)) where Φ(v) is near 1)."""
    v = mp.mpf(v)
    cdf = mp.ncdf(v)
    lam = mp.npdf(v) / cdf
    log_cdf = mp.log(cdf) if v < 0 else mp.log1p(-mp.ncdf(-v))
    return float(log_cdf), float(lam), float(lam * (v + lam))


for dtype in (jnp.float64, jnp.float32):
    xs = jnp.asarray(grid, dtype)
    log_cdf_d, mills_d = numerics.log_ndtr_and_mills(xs)
    got = {"log Φ": log_cdf_d, "λ": mills_d, "C": numerics.probit_curvature(xs)}
    exact = np.array([mp_values(float(v)) for v in np.asarray(xs)]).T
    errors = ", ".join(
        f"{name} {np.max(np.abs(np.asarray(value, np.float64) - ref) / np.abs(ref)):.1e}"
        for (name, value), ref in zip(got.items(), exact, strict=True))
    print(jnp.dtype(dtype).name, "max relative error:", errors)

# %% [markdown]
# ## Derivatives are exact formulas
#
# `jax.grad(log_ndtr)` is the Mills ratio and `jax.grad` of the Mills ratio is
# `-C`, through custom JVP rules, not derivatives of the rational approximations.
# Both are checked against the mpmath values of λ and C (float64).

# %%
exact64 = np.array([mp_values(v) for v in grid]).T
grad_log_cdf = jax.vmap(jax.grad(numerics.log_ndtr))(jnp.asarray(grid))
grad_mills = jax.vmap(jax.grad(lambda v: numerics.log_ndtr_and_mills(v)[1]))(jnp.asarray(grid))
print(f"max |grad log_ndtr - λ| / λ: {np.max(np.abs(grad_log_cdf - exact64[1]) / exact64[1]):.1e}")
print(f"max |grad λ + C| / C: {np.max(np.abs(grad_mills + exact64[2]) / exact64[2]):.1e}")
