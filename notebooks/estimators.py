# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Factorization machines trained on the device
#
# CTR-style data (one-hot features in Zipf-like fields, labels from a planted
# field-weighted FM), three models (FM, FFM, FwFM) trained with gpustat's
# scikit-learn estimators: learning curves per epoch, optimizers compared, and
# the same fit with modern_fm (the CPU peer) when it is installed.
# `GPUSTAT_NOTEBOOK_SMALL=1` runs a small version (CI).

# %%
import os
import tempfile
import time

import jax
import matplotlib.pyplot as plt
import numpy as np
from sklearn.metrics import log_loss, roc_auc_score

from gpustat import FFMClassifier, FMClassifier, FwFMClassifier
from gpustat.estimators._data import make_ctr

# Compiled programs persist across runs (JAX's compilation cache; the library itself never
# switches it on).
jax.config.update("jax_compilation_cache_dir",
                  os.path.join(os.path.expanduser("~"), ".cache", "gpustat-jax", "jax"))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)

SMALL = os.environ.get("GPUSTAT_NOTEBOOK_SMALL") == "1"
n_train, n_test = (6_000, 2_000) if SMALL else (200_000, 50_000)
n_features, n_fields = (1_600, 8) if SMALL else (100_000, 16)
epochs = 3 if SMALL else 5
X, y, fields = make_ctr(n_train + n_test, n_features=n_features, n_fields=n_fields, seed=0)
X_tr, y_tr, X_te, y_te = X[:n_train], y[:n_train], X[n_train:], y[n_train:]
print(f"{n_train} training rows, {n_features} features in {n_fields} fields, "
      f"click rate {y.mean():.3f}")

# %% [markdown]
# ## Learning curves
#
# One `partial_fit` call per epoch over a permutation of the rows, scored on the
# test rows after each. The permutations are the ones `fit(max_iter=epochs)`
# draws (the documented random stream: `default_rng(random_state)` draws the
# factors, then one permutation per epoch), so each curve is the trajectory of
# that `fit`; checked for the FM below.

# %%
hyper = dict(n_factors=8, batch_size=512 if SMALL else 4096, learning_rate=0.05,
             random_state=0)
models = {"FM": FMClassifier, "FFM": FFMClassifier, "FwFM": FwFMClassifier}


def fit_orders(name):
    """The epoch permutations of ``fit``: drawn after the factors from the same stream."""
    rng = np.random.default_rng(hyper["random_state"])
    shape = (n_features, n_fields, hyper["n_factors"]) if name == "FFM" else (
        n_features, hyper["n_factors"])
    rng.uniform(size=shape) if name == "FFM" else rng.normal(size=shape)
    return [rng.permutation(n_train) for _ in range(epochs)]


curves, estimators = {}, {}
for name, cls in models.items():
    est = cls(**hyper)
    losses, aucs = [], []
    for order in fit_orders(name):
        est.partial_fit(X_tr[order], y_tr[order], classes=[0, 1], field_ids=fields)
        p = est.predict_proba(X_te)[:, 1]
        losses.append(log_loss(y_te, p))
        aucs.append(roc_auc_score(y_te, p))
    curves[name], estimators[name] = (losses, aucs), est
    print(f"{name}: test logloss {losses[-1]:.4f}, AUC {aucs[-1]:.4f} after {epochs} epochs")

fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
for name, (losses, aucs) in curves.items():
    axes[0].plot(range(1, epochs + 1), losses, marker="o", label=name)
    axes[1].plot(range(1, epochs + 1), aucs, marker="o", label=name)
axes[0].set(xlabel="epoch", ylabel="test logloss", title="test logloss per epoch")
axes[1].set(xlabel="epoch", ylabel="test AUC", title="test AUC per epoch")
axes[0].legend()
fig.tight_layout()
figure_path = os.path.join(tempfile.gettempdir(), "gpustat_estimators.png")
fig.savefig(figure_path, dpi=80)
print("figure written to", figure_path)

whole = FMClassifier(**hyper, max_iter=epochs).fit(X_tr, y_tr, field_ids=fields)
print(f"FM: epoch-by-epoch partial_fit vs fit(max_iter={epochs}), max |V difference|: "
      f"{np.max(np.abs(whole.V_ - estimators['FM'].V_)):.1e}")

# %% [markdown]
# ## Optimizers
#
# The four built-in optax transformations (lazy: only coordinates a batch
# touches move); FTRL with L1 gives exact zeros. Features no training row holds keep
# their initial w = 0 under every optimizer; only FTRL zeroes factors.

# %%
for optimizer in ("sgd", "adagrad", "adam", "ftrl"):
    extra = {"l1_linear": 1e-4, "l1_factors": 1e-5} if optimizer == "ftrl" else {}
    lr = {"sgd": 0.5, "adam": 0.01, "ftrl": 0.5}.get(optimizer, 0.05)
    est = FwFMClassifier(**{**hyper, "learning_rate": lr}, optimizer=optimizer, max_iter=2,
                         **extra).fit(X_tr, y_tr, field_ids=fields)
    p = est.predict_proba(X_te)[:, 1]
    print(f"{optimizer:8s} AUC {roc_auc_score(y_te, p):.4f}  exact zeros: "
          f"w {np.mean(est.w_ == 0):.1%}, V {np.mean(est.V_ == 0):.1%}")

# %% [markdown]
# ## Comparison with modern_fm
#
# Same hyperparameters and `random_state`, hence the same initial factors and
# row order; one epoch.

# %%
try:
    import modern_fm
except ImportError:
    modern_fm = None
    print("modern_fm is not installed (pip install modern-fm): comparison not run")

if modern_fm is not None:
    peers = {"FM": modern_fm.FMClassifier, "FFM": modern_fm.FFMClassifier,
             "FwFM": modern_fm.FwFMClassifier}
    for name, cls in models.items():
        ours = cls(**hyper, max_iter=1).fit(X_tr, y_tr, field_ids=fields)  # compile
        start = time.perf_counter()
        ours.fit(X_tr, y_tr, field_ids=fields)
        t_ours = time.perf_counter() - start
        peer = peers[name](**hyper, max_iter=1)
        start = time.perf_counter()
        peer.fit(X_tr, y_tr) if name == "FM" else peer.fit(X_tr, y_tr, field_ids=fields)
        t_peer = time.perf_counter() - start
        auc_ours = roc_auc_score(y_te, ours.predict_proba(X_te)[:, 1])
        auc_peer = roc_auc_score(y_te, peer.predict_proba(X_te)[:, 1])
        print(f"{name}: gpustat fit {t_ours:.3f} s AUC {auc_ours:.4f} | modern_fm fit "
              f"{t_peer:.3f} s AUC {auc_peer:.4f}")
