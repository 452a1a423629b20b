"""gpustat: JAX GPU kernels for statistical computation.

Every op exists twice: a pure ``jax.numpy`` reference (the meaning) and GPU kernels
(Pallas, jax-triton) for the speed. Public functions validate their input and dispatch
on ``backend="auto" | "pallas" | "reference" | "interpret"`` (and ``"triton"`` where a
jax-triton kernel exists).

Capabilities are imported on first use (PEP 562), so ``import gpustat`` stays cheap:
``gpustat.mixture``, ``gpustat.GaussianMixture`` and friends load their modules the
first time they are touched.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

# public name -> the module that defines it (capability faces and single-file modules)
_NAMES = {
    "BackendUnavailableError": "gpustat._backend",
    "available_backends": "gpustat._backend",
    "BorderBatch": "gpustat.border",
    "BorderSolution": "gpustat.border",
    "retry_failed": "gpustat.border",
    "solve_batched_border": "gpustat.border",
    "BayesianGaussianMixture": "gpustat.mixture",
    "CSR": "gpustat.csr",
    "FFMClassifier": "gpustat.estimators",
    "FFMRegressor": "gpustat.estimators",
    "FMClassifier": "gpustat.estimators",
    "FMRegressor": "gpustat.estimators",
    "FwFMClassifier": "gpustat.estimators",
    "FwFMRegressor": "gpustat.estimators",
    "ftrl": "gpustat.estimators",
    "lazy_adagrad": "gpustat.estimators",
    "lazy_adam": "gpustat.estimators",
    "lazy_sgd": "gpustat.estimators",
    "dump_libffm": "gpustat.factorization",
    "ffm_predict": "gpustat.factorization",
    "fm_predict": "gpustat.factorization",
    "fwfm_predict": "gpustat.factorization",
    "iter_libffm": "gpustat.factorization",
    "iter_svmlight": "gpustat.factorization",
    "load_libffm": "gpustat.factorization",
    "load_svmlight": "gpustat.factorization",
    "GaussianMixture": "gpustat.mixture",
    "MixtureParams": "gpustat.mixture",
    "PiecewisePolynomial": "gpustat.piecewise",
    "activation": "gpustat.piecewise",
    "fit_piecewise": "gpustat.piecewise",
    "ppoly_eval": "gpustat.piecewise",
}
_SUBMODULES = ("bms", "border", "distributed", "estimators", "factorization", "mixture",
               "numerics", "piecewise", "testing")

__all__ = [
    "CSR",
    "BackendUnavailableError",
    "BayesianGaussianMixture",
    "BorderBatch",
    "BorderSolution",
    "FFMClassifier",
    "FFMRegressor",
    "FMClassifier",
    "FMRegressor",
    "FwFMClassifier",
    "FwFMRegressor",
    "GaussianMixture",
    "MixtureParams",
    "PiecewisePolynomial",
    "activation",
    "available_backends",
    "bms",
    "distributed",
    "dump_libffm",
    "ffm_predict",
    "fit_piecewise",
    "fm_predict",
    "ftrl",
    "fwfm_predict",
    "iter_libffm",
    "iter_svmlight",
    "lazy_adagrad",
    "lazy_adam",
    "lazy_sgd",
    "load_libffm",
    "load_svmlight",
    "mixture",
    "numerics",
    "ppoly_eval",
    "retry_failed",
    "solve_batched_border",
    "testing",
]


def __getattr__(name: str):
    if name in _NAMES:
        value = getattr(importlib.import_module(_NAMES[name]), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"gpustat.{name}")
    else:
        raise AttributeError(f"module 'gpustat' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__, *_SUBMODULES})


if TYPE_CHECKING:
    from gpustat import bms, distributed, mixture, numerics, testing
    from gpustat._backend import BackendUnavailableError, available_backends
    from gpustat.border import BorderBatch, BorderSolution, retry_failed, solve_batched_border
    from gpustat.csr import CSR
    from gpustat.estimators import (
        FFMClassifier,
        FFMRegressor,
        FMClassifier,
        FMRegressor,
        FwFMClassifier,
        FwFMRegressor,
        ftrl,
        lazy_adagrad,
        lazy_adam,
        lazy_sgd,
    )
    from gpustat.factorization import (
        dump_libffm,
        ffm_predict,
        fm_predict,
        fwfm_predict,
        iter_libffm,
        iter_svmlight,
        load_libffm,
        load_svmlight,
    )
    from gpustat.mixture import BayesianGaussianMixture, GaussianMixture, MixtureParams
    from gpustat.piecewise import PiecewisePolynomial, activation, fit_piecewise, ppoly_eval
