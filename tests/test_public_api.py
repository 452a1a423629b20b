"""No public name disappears: gpustat.__all__ and every capability's __all__ hold at least
the names of the flat layout before the capability packages (new names may be added), and
the layout's import rules hold when a kernel tree is missing."""

import importlib
import subprocess
import sys

import pytest

# the public names of each module before the move into capability packages
PUBLIC_BEFORE = {
    "gpustat": [
        "BackendUnavailableError", "BorderBatch", "BorderSolution", "CSR", "FFMClassifier",
        "FFMRegressor", "FMClassifier", "FMRegressor", "FwFMClassifier", "FwFMRegressor",
        "GaussianMixture", "MixtureParams", "PiecewisePolynomial", "activation",
        "available_backends", "bms", "distributed", "dump_libffm", "ffm_predict",
        "fit_piecewise", "fm_predict", "ftrl", "fwfm_predict", "lazy_adagrad", "lazy_adam",
        "lazy_sgd", "load_libffm", "mixture", "numerics", "ppoly_eval", "retry_failed",
        "solve_batched_border", "testing",
    ],
    "gpustat.piecewise": [
        "ACTIVATIONS", "ActivationSpec", "EXTRAPOLATE_MODES", "FIT_METHODS", "PiecewiseFit",
        "PiecewisePolynomial", "activation", "aos_to_soa", "fit_piecewise", "ppoly_eval",
        "soa_to_aos",
    ],
    "gpustat.factorization": [
        "CSR", "dump_libffm", "ffm_predict", "fm_predict", "fwfm_predict", "load_libffm",
    ],
    "gpustat.estimators": [
        "FFMClassifier", "FFMRegressor", "FMClassifier", "FMRegressor", "FwFMClassifier",
        "FwFMRegressor", "ftrl", "lazy_adagrad", "lazy_adam", "lazy_sgd",
    ],
    "gpustat.bms": [
        "BmsRows", "CellStatus", "JointOperator", "RowDerivatives", "RowStatus", "build_rows",
        "cell_moments", "flat_cubic_basis", "joint_dense", "joint_diagonal", "joint_gradient",
        "joint_hvp", "row_derivatives",
    ],
    "gpustat.mixture": [
        "ConvergenceWarning", "DirichletPrior", "EMResult", "GaussianMixture", "GibbsResult",
        "GibbsState", "MixtureParams", "NIWPrior", "OnlineEMState",
        "STATUS_ILL_DEFINED_COVARIANCE", "STATUS_OK", "StickBreakingPrior", "SuffStats",
        "fit_bem", "fit_em", "fit_gibbs", "gibbs_sweep", "initialize", "kmeans_plusplus",
        "log_prob", "m_step", "mvn_logpdf", "online_em_init", "online_em_step", "online_params",
        "responsibilities", "sample_labels", "sample_niw_posterior", "sample_sticks",
        "stick_weights", "suff_stats", "suff_stats_from_labels",
    ],
    "gpustat.distributed": [
        "ROW_AXIS", "ShardedBmsRows", "ShardedBorderBatch", "ShardedBorderSolution",
        "ShardedCSR", "ShardedRows", "ffm_predict", "fit_em", "fit_gibbs", "fm_predict",
        "fwfm_predict", "global_order", "joint_dense", "joint_diagonal", "joint_gradient",
        "joint_hvp", "make_mesh", "map_rows", "mesh_size", "ppoly_eval", "replicate",
        "row_derivatives", "shard_bms_rows", "shard_border_batch", "shard_csr", "shard_rows",
        "shard_training_rows", "solve_batched_border", "suff_stats", "sum_rows", "train_epoch",
    ],
    "gpustat.numerics": [
        "erfc", "erfcx", "log_ndtr", "log_ndtr_and_mills", "ndtr", "probit_curvature",
    ],
    "gpustat.border": [
        "BorderBatch", "BorderLayout", "BorderSolution", "STATUS_NONFINITE", "STATUS_OK",
        "STATUS_ROW_NOT_PD", "STATUS_SCHUR_NOT_PD", "retry_failed", "solve_batched_border",
    ],
    "gpustat.csr": [
        "CSR", "RowBuckets", "dense_as_csr",
    ],
    "gpustat.testing": [
        "Comparison", "DerivativeReport", "check_derivatives", "default_tolerances",
    ],
}

@pytest.mark.parametrize("module", sorted(PUBLIC_BEFORE))
def test_public_names_are_kept(module):
    mod = importlib.import_module(module)
    missing = sorted(set(PUBLIC_BEFORE[module]) - set(mod.__all__))
    assert not missing, f"{module} lost public names {missing}"
    for name in mod.__all__:
        assert getattr(mod, name) is not None


def _run_without(blocked: str, code: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter where importing ``blocked`` fails."""
    prelude = f"import sys; sys.modules[{blocked!r}] = None\n"
    return subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True,
                          timeout=300)


REFERENCES = ("bms", "border", "estimators", "factorization", "mixture", "numerics", "piecewise")


def test_reference_tree_stands_without_the_pallas_tree():
    code = "".join(f"import gpustat.reference.{m}\n" for m in REFERENCES) + "print('ok')"
    result = _run_without("gpustat.pallas", code)
    assert result.stdout.strip() == "ok", result.stderr


def test_capabilities_run_their_reference_without_the_triton_tree():
    code = """
import jax.numpy as jnp
import gpustat
from gpustat import bms, border, distributed, estimators, factorization, mixture, piecewise
pp = gpustat.PiecewisePolynomial(jnp.linspace(0.0, 1.0, 5), jnp.ones((4, 4)))
print(float(pp(jnp.asarray(0.5), backend="reference")))
"""
    result = _run_without("gpustat.triton", code)
    assert result.returncode == 0 and result.stdout.strip() == "1.0", result.stderr  # p(x_2) = c[D, 2]
