"""gpustat: JAX and Pallas GPU kernels for statistical computation.

Every op exists twice: a pure ``jax.numpy`` reference (the meaning) and a Pallas
kernel lowered through Triton (the speed). Public functions validate their input
and dispatch on ``backend="auto" | "pallas" | "reference" | "interpret"``.
"""

import warnings as _warnings

# The Pallas Triton lowering warns on every lowering in jax 0.11; gpustat knows
# (issue: a jax-triton backend) and filters exactly that one message.
_warnings.filterwarnings(
    "ignore", message="The Pallas Triton backend is deprecated", category=DeprecationWarning
)

from gpustat import bms as bms  # noqa: E402
from gpustat import distributed as distributed  # noqa: E402
from gpustat import mixture as mixture  # noqa: E402
from gpustat import numerics as numerics  # noqa: E402
from gpustat import testing as testing  # noqa: E402
from gpustat._backend import BackendUnavailableError as BackendUnavailableError  # noqa: E402
from gpustat._backend import available_backends as available_backends  # noqa: E402
from gpustat.border import BorderBatch as BorderBatch  # noqa: E402
from gpustat.border import BorderSolution as BorderSolution  # noqa: E402
from gpustat.border import retry_failed as retry_failed  # noqa: E402
from gpustat.border import solve_batched_border as solve_batched_border  # noqa: E402
from gpustat.csr import CSR as CSR  # noqa: E402
from gpustat.estimators import FFMClassifier as FFMClassifier  # noqa: E402
from gpustat.estimators import FFMRegressor as FFMRegressor  # noqa: E402
from gpustat.estimators import FMClassifier as FMClassifier  # noqa: E402
from gpustat.estimators import FMRegressor as FMRegressor  # noqa: E402
from gpustat.estimators import FwFMClassifier as FwFMClassifier  # noqa: E402
from gpustat.estimators import FwFMRegressor as FwFMRegressor  # noqa: E402
from gpustat.estimators import ftrl as ftrl  # noqa: E402
from gpustat.estimators import lazy_adagrad as lazy_adagrad  # noqa: E402
from gpustat.estimators import lazy_adam as lazy_adam  # noqa: E402
from gpustat.estimators import lazy_sgd as lazy_sgd  # noqa: E402
from gpustat.factorization import ffm_predict as ffm_predict  # noqa: E402
from gpustat.factorization import fm_predict as fm_predict  # noqa: E402
from gpustat.factorization import fwfm_predict as fwfm_predict  # noqa: E402
from gpustat.libffm import dump_libffm as dump_libffm  # noqa: E402
from gpustat.libffm import load_libffm as load_libffm  # noqa: E402
from gpustat.mixture_bayesian import BayesianGaussianMixture as BayesianGaussianMixture  # noqa: E402
from gpustat.mixture_estimator import GaussianMixture as GaussianMixture  # noqa: E402
from gpustat.mixture_params import MixtureParams as MixtureParams  # noqa: E402
from gpustat.piecewise import PiecewisePolynomial as PiecewisePolynomial  # noqa: E402
from gpustat.piecewise import ppoly_eval as ppoly_eval  # noqa: E402
from gpustat.piecewise_activations import activation as activation  # noqa: E402
from gpustat.piecewise_fit import fit_piecewise as fit_piecewise  # noqa: E402

__version__ = "0.1.0"

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
    "lazy_adagrad",
    "lazy_adam",
    "lazy_sgd",
    "load_libffm",
    "mixture",
    "numerics",
    "ppoly_eval",
    "retry_failed",
    "solve_batched_border",
    "testing",
]
