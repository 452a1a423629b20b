"""Gaussian mixtures at scale: fused E-step kernels, EM / MAP-EM (BEM) / Gibbs, estimator.

The model (Suchard et al. 2010, "Understanding GPU programming for statistical
computation: studies in massively parallel massive mixtures", JCGS 19(2)):

    x_i ~ sum_j w_j N(mu_j, Sigma_j),  j = 1..m,

fitted by EM (Dempster, Laird and Rubin 1977), posterior-mode EM under stick-breaking and
normal-inverse-Wishart priors, or blocked Gibbs sampling of the truncated Dirichlet-process
mixture (Ishwaran and James 2001). The E-step and its statistics run as two kernel passes
per chunk of rows (no n x m matrix): memory O(n p + chunk m + m p^2).

This module is the functional namespace: ops (:func:`mvn_logpdf`, :func:`log_prob`,
:func:`responsibilities`, :func:`suff_stats`, :func:`sample_labels`,
:func:`suff_stats_from_labels`), the M-step, the drivers (:func:`fit_em`, :func:`fit_bem`,
:func:`fit_gibbs`, streaming :func:`online_em_step`), the Gibbs output's relabelling and
summaries (:func:`relabel`, :class:`MixtureDraws`) and their data types. The
scikit-learn-compatible estimator is :class:`gpustat.GaussianMixture`.
"""

from gpustat.mixture._bayesian import BayesianGaussianMixture as BayesianGaussianMixture
from gpustat.mixture._em import STATUS_ILL_DEFINED_COVARIANCE as STATUS_ILL_DEFINED_COVARIANCE
from gpustat.mixture._em import STATUS_OK as STATUS_OK
from gpustat.mixture._em import EMResult as EMResult
from gpustat.mixture._em import OnlineEMState as OnlineEMState
from gpustat.mixture._em import fit_bem as fit_bem
from gpustat.mixture._em import fit_em as fit_em
from gpustat.mixture._em import online_em_init as online_em_init
from gpustat.mixture._em import online_em_step as online_em_step
from gpustat.mixture._em import online_params as online_params
from gpustat.mixture._estimator import ConvergenceWarning as ConvergenceWarning
from gpustat.mixture._estimator import GaussianMixture as GaussianMixture
from gpustat.mixture._gibbs import GibbsResult as GibbsResult
from gpustat.mixture._gibbs import GibbsState as GibbsState
from gpustat.mixture._gibbs import fit_gibbs as fit_gibbs
from gpustat.mixture._gibbs import gibbs_sweep as gibbs_sweep
from gpustat.mixture._gibbs import sample_niw_posterior as sample_niw_posterior
from gpustat.mixture._gibbs import sample_sticks as sample_sticks
from gpustat.mixture._initialize import initialize as initialize
from gpustat.mixture._initialize import kmeans_plusplus as kmeans_plusplus
from gpustat.mixture._mstep import m_step as m_step
from gpustat.mixture._ops import log_prob as log_prob
from gpustat.mixture._ops import mvn_logpdf as mvn_logpdf
from gpustat.mixture._ops import responsibilities as responsibilities
from gpustat.mixture._ops import sample_labels as sample_labels
from gpustat.mixture._ops import suff_stats as suff_stats
from gpustat.mixture._ops import suff_stats_from_labels as suff_stats_from_labels
from gpustat.mixture._posterior import MixtureDraws as MixtureDraws
from gpustat.mixture._posterior import PosteriorEstimate as PosteriorEstimate
from gpustat.mixture._posterior import PosteriorSummary as PosteriorSummary
from gpustat.mixture._posterior import relabel as relabel
from gpustat.mixture._priors import DirichletPrior as DirichletPrior
from gpustat.mixture._priors import NIWPrior as NIWPrior
from gpustat.mixture._priors import StickBreakingPrior as StickBreakingPrior
from gpustat.mixture._priors import stick_weights as stick_weights
from gpustat.reference.mixture import MixtureParams as MixtureParams
from gpustat.reference.mixture import SuffStats as SuffStats

__all__ = [
    "STATUS_ILL_DEFINED_COVARIANCE",
    "STATUS_OK",
    "BayesianGaussianMixture",
    "ConvergenceWarning",
    "DirichletPrior",
    "EMResult",
    "GaussianMixture",
    "GibbsResult",
    "GibbsState",
    "MixtureDraws",
    "MixtureParams",
    "NIWPrior",
    "OnlineEMState",
    "PosteriorEstimate",
    "PosteriorSummary",
    "StickBreakingPrior",
    "SuffStats",
    "fit_bem",
    "fit_em",
    "fit_gibbs",
    "gibbs_sweep",
    "initialize",
    "kmeans_plusplus",
    "log_prob",
    "m_step",
    "mvn_logpdf",
    "online_em_init",
    "online_em_step",
    "online_params",
    "relabel",
    "responsibilities",
    "sample_labels",
    "sample_niw_posterior",
    "sample_sticks",
    "stick_weights",
    "suff_stats",
    "suff_stats_from_labels",
]
