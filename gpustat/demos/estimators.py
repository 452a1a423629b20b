"""Demo: train FM / FFM / FwFM classifiers on small CTR-style data.

Each model trains two epochs at batch 64 through ``backend`` (the gradient
scatter: Pallas kernel, its interpreter, or the XLA reference) in float64 and
is compared with the same training through the reference scatter; the note
gives the test AUC.
"""

from __future__ import annotations

import time

from sklearn.metrics import roc_auc_score

from gpustat.demos import DemoRow, max_rel_error
from gpustat.estimators import FFMClassifier, FMClassifier, FwFMClassifier
from gpustat.estimators._data import make_ctr

CAPABILITY = "estimators"


def run(backend: str, small: bool) -> list[DemoRow]:
    n_train = 600 if small else 20_000
    X, y, fields = make_ctr(n_train + 400, n_features=160 if small else 4_000, n_fields=8,
                            seed=0)
    X_tr, y_tr, X_te, y_te = X[:n_train], y[:n_train], X[n_train:], y[n_train:]
    rows = []
    for cls in (FMClassifier, FFMClassifier, FwFMClassifier):
        kw = dict(n_factors=4, max_iter=2, batch_size=64, random_state=0, dtype="float64",
                  learning_rate=0.1)
        start = time.perf_counter()
        est = cls(backend=backend, **kw).fit(X_tr, y_tr, field_ids=fields)
        seconds = time.perf_counter() - start
        ref = cls(backend="reference", **kw).fit(X_tr, y_tr, field_ids=fields)
        error = max_rel_error([est.w0_, est.w_, est.V_], [ref.w0_, ref.w_, ref.V_])
        auc = roc_auc_score(y_te, est.predict_proba(X_te)[:, 1])
        rows.append(DemoRow(CAPABILITY, f"{cls.__name__} fit, 2 epochs, n={n_train}", backend,
                            error, seconds, note=f"test AUC {auc:.3f}; first fit compiles"))
    return rows

