"""scikit-learn estimators for FM / FFM / FwFM, trained on the device with optax.

The estimator classes are in :mod:`gpustat.estimators._classes`, the compiled epoch in
:mod:`gpustat.estimators._train`, the lazy optax transformations in
:mod:`gpustat.estimators._optim`.
"""

from gpustat.estimators._classes import FFMClassifier as FFMClassifier
from gpustat.estimators._classes import FFMRegressor as FFMRegressor
from gpustat.estimators._classes import FMClassifier as FMClassifier
from gpustat.estimators._classes import FMRegressor as FMRegressor
from gpustat.estimators._classes import FwFMClassifier as FwFMClassifier
from gpustat.estimators._classes import FwFMRegressor as FwFMRegressor
from gpustat.estimators._optim import ftrl as ftrl
from gpustat.estimators._optim import lazy_adagrad as lazy_adagrad
from gpustat.estimators._optim import lazy_adam as lazy_adam
from gpustat.estimators._optim import lazy_sgd as lazy_sgd

__all__ = [
    "FFMClassifier",
    "FFMRegressor",
    "FMClassifier",
    "FMRegressor",
    "FwFMClassifier",
    "FwFMRegressor",
    "ftrl",
    "lazy_adagrad",
    "lazy_adam",
    "lazy_sgd",
]
