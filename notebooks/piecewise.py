# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Piecewise polynomial activations
#
# Fit activations as piecewise polynomials (`gpustat.fit_piecewise`,
# `gpustat.activation`), look at accuracy against pieces and degree, then replace
# the GELU of a small MLP by the fitted one and compare accuracy and speed.
# Set `GPUSTAT_NOTEBOOK_SMALL=1` for the quick CI run.

# %%
import os
import tempfile
import time

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import optax

jax.config.update("jax_enable_x64", True)
import gpustat
from gpustat.piecewise import ACTIVATIONS

# Compiled programs persist across runs (JAX's compilation cache; the library itself never
# switches it on).
jax.config.update("jax_compilation_cache_dir",
                  os.path.join(os.path.expanduser("~"), ".cache", "gpustat-jax", "jax"))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)

SMALL = os.environ.get("GPUSTAT_NOTEBOOK_SMALL") == "1"
FIGURES = tempfile.gettempdir()  # where the figures are written
print("backends:", gpustat.available_backends(), "| small run:", SMALL)

# %% [markdown]
# ## 1. Fitted activations and their error
#
# Each activation is a cubic on 64 uniform pieces of its domain plus one
# asymptotic tail piece on each side ("extend" continues the tails to +-inf);
# exp has only the left tail and is shown for x <= 0, where it is meant to be used.
# `ACTIVATIONS[name].fn` is the exact float64 function.

# %%
x = np.linspace(-12.0, 12.0, 4001)
fig, axes = plt.subplots(2, 3, figsize=(12, 6))
for ax, name in zip(axes.flat, ACTIVATIONS, strict=True):
    pp = gpustat.activation(name, num_pieces=64, degree=3, dtype=jnp.float64)
    points = x[x <= 0.0] if name == "exp" else x
    exact = ACTIVATIONS[name].fn(points)
    error = np.asarray(pp(points)) - exact
    ax.semilogy(points, np.abs(error) + 1e-18)
    ax.set(title=f"{name}: max |error| {np.max(np.abs(error)):.1e}", xlabel="x",
           ylabel="|fit - exact|")
    print(f"{name:>8s} P=64 D=3: max |error| on [{points[0]:g}, {points[-1]:g}] "
          f"{np.max(np.abs(error)):.1e}")
fig.tight_layout()
fig.savefig(os.path.join(FIGURES, "gpustat_piecewise_activations.png"), dpi=80)

# %% [markdown]
# ## 2. Accuracy against pieces and degree
#
# The interpolation error scales as h^(D+1): a slope that tends to -(D+1) on a
# log-log plot as P grows (the slope printed is fitted to the last three P; the
# small run stops at P = 64, where the higher degrees are not yet asymptotic). Then three other fitting
# methods and adaptive breakpoints at P = 64, D = 3.

# %%
gelu_exact = ACTIVATIONS["gelu"].fn
pieces = [8, 16, 32, 64] if SMALL else [8, 16, 32, 64, 128, 256, 512]
fig, ax = plt.subplots(figsize=(6, 4))
for degree in (1, 2, 3, 5):
    errors = [gpustat.fit_piecewise(gelu_exact, -8.0, 8.0, p, degree).max_error for p in pieces]
    slope = np.polyfit(np.log(pieces[-3:]), np.log(errors[-3:]), 1)[0]
    ax.loglog(pieces, errors, "o-", label=f"D={degree} (slope {slope:.1f})")
    print(f"GELU D={degree}: " + ", ".join(f"P={p}: {e:.1e}" for p, e in
                                              zip(pieces, errors, strict=True))
          + f" | slope {slope:.2f} (expected {-(degree + 1)})")
for method in ("lstsq", "hermite", "chord"):
    err = gpustat.fit_piecewise(gelu_exact, -8.0, 8.0, 64, 3, method=method).max_error
    print(f"GELU P=64 D=3 {method}: {err:.1e}")
adaptive = gpustat.fit_piecewise(gelu_exact, -8.0, 8.0, 64, 3, breakpoints="adaptive")
print(f"GELU P=64 D=3 chebyshev, adaptive breakpoints: {adaptive.max_error:.1e}")
ax.set_xlabel("pieces P")
ax.set_ylabel("max |p - GELU| on [-8, 8]")
ax.set_title("GELU, Chebyshev fit on uniform pieces")
ax.legend()
fig.tight_layout()
fig.savefig(os.path.join(FIGURES, "gpustat_piecewise_convergence.png"), dpi=80)
print("figures written to", FIGURES)

# %% [markdown]
# ## 3. A small MLP with the fitted GELU
#
# Train a 2-layer MLP with the exact GELU on a synthetic regression task, then
# swap in the piecewise GELU (P = 256, D = 3, float32) without retraining:
# the predictions differ by at most the activation's error on the hidden
# pre-activations times sum |w2| (checked below), and the loss does not move.

# %%
rng = np.random.default_rng(0)
n_train, width = (2048, 64) if SMALL else (16384, 256)
features = rng.normal(size=(n_train, 8)).astype(np.float32)
target = np.sin(features @ rng.normal(size=8)) + 0.1 * features[:, 0] ** 2
features, target = jnp.asarray(features), jnp.asarray(target, jnp.float32)


def init(key):
    k1, k2 = jax.random.split(key)
    return {"w1": jax.random.normal(k1, (8, width), jnp.float32) / np.sqrt(8),
            "b1": jnp.zeros(width, jnp.float32),
            "w2": jax.random.normal(k2, (width,), jnp.float32) / np.sqrt(width)}


def mlp(params, inputs, activation):
    return activation(inputs @ params["w1"] + params["b1"]) @ params["w2"]


def exact_gelu(v):
    return jax.nn.gelu(v, approximate=False)


fitted = gpustat.activation("gelu", num_pieces=256, degree=3, dtype=jnp.float32)


def fitted_gelu(v):
    return fitted(v)


optimizer = optax.adam(3e-3)


@jax.jit
def train_step(params, state):
    loss, grads = jax.value_and_grad(
        lambda p: jnp.mean((mlp(p, features, exact_gelu) - target) ** 2))(params)
    updates, state = optimizer.update(grads, state)
    return optax.apply_updates(params, updates), state, loss


params = init(jax.random.key(0))
state = optimizer.init(params)
for _ in range(100 if SMALL else 1000):
    params, state, loss = train_step(params, state)
print(f"training loss (exact GELU): {float(loss):.4f} (target variance {float(jnp.var(target)):.4f})")

# %%
predict_exact = jax.jit(lambda p, v: mlp(p, v, exact_gelu))
predict_fitted = jax.jit(lambda p, v: mlp(p, v, fitted_gelu))
y_exact, y_fitted = predict_exact(params, features), predict_fitted(params, features)
hidden = features @ params["w1"] + params["b1"]
activation_error = float(jnp.max(jnp.abs(fitted_gelu(hidden) - exact_gelu(hidden))))
bound = activation_error * float(jnp.sum(jnp.abs(params["w2"])))
difference = float(jnp.max(jnp.abs(y_exact - y_fitted)))
print(f"max |GELU difference| on the hidden layer (float32): {activation_error:.2e}")
print(f"max |prediction difference|: {difference:.2e} (bound: {bound:.2e})")
assert difference <= 1.01 * bound + 1e-6, "the fitted GELU moved the predictions too far"
print(f"loss exact {float(jnp.mean((y_exact - target) ** 2)):.6f}, "
      f"fitted {float(jnp.mean((y_fitted - target) ** 2)):.6f}")

# the GELU alone on the hidden pre-activations, and the whole forward pass; on a
# CPU the piecewise GELU runs its jnp reference (a gather), on a CUDA GPU the
# Pallas kernel
gelu_fns = {"exact": jax.jit(exact_gelu), "fitted": jax.jit(fitted_gelu),
            "exact fwd": lambda: predict_exact(params, features),
            "fitted fwd": lambda: predict_fitted(params, features)}
for label, fn in gelu_fns.items():
    call = (lambda f=fn: f(hidden)) if "fwd" not in label else fn
    jax.block_until_ready(call())
    start = time.perf_counter()
    for _ in range(20):
        out = call()
    jax.block_until_ready(out)
    print(f"{label:>10s}: {(time.perf_counter() - start) / 20 * 1e3:.3f} ms per call")

# %% [markdown]
# ## 4. Learning the activation
#
# Gradients flow to the coefficients: fine-tune the piecewise GELU's
# coefficients together with the weights (breakpoints stay fixed).

# %%
def fitted_loss(p, coeffs):
    act = gpustat.PiecewisePolynomial(fitted.breakpoints, coeffs)
    return jnp.mean((mlp(p, features, act) - target) ** 2)


@jax.jit
def joint_step(p, coeffs, lr=1e-3):
    loss, (gp, gc) = jax.value_and_grad(fitted_loss, argnums=(0, 1))(p, coeffs)
    p = jax.tree.map(lambda a, g: a - lr * g, p, gp)
    return p, coeffs - lr * gc, loss


coeffs = fitted.coeffs
for _ in range(20 if SMALL else 200):
    params, coeffs, loss = joint_step(params, coeffs)
print(f"loss after joint fine-tuning: {float(loss):.6f}")
print(f"largest coefficient change: {float(jnp.max(jnp.abs(coeffs - fitted.coeffs))):.2e}")
