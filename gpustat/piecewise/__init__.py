"""Piecewise polynomials: evaluate, differentiate, fit, ready-made activations.

The object and its evaluation are in :mod:`gpustat.piecewise._polynomial`, fitting in
:mod:`gpustat.piecewise._fit`, the activation table in :mod:`gpustat.piecewise._activations`.
"""

from gpustat.piecewise._activations import ACTIVATIONS as ACTIVATIONS
from gpustat.piecewise._activations import ActivationSpec as ActivationSpec
from gpustat.piecewise._activations import activation as activation
from gpustat.piecewise._fit import FIT_METHODS as FIT_METHODS
from gpustat.piecewise._fit import PiecewiseFit as PiecewiseFit
from gpustat.piecewise._fit import fit_piecewise as fit_piecewise
from gpustat.piecewise._polynomial import EXTRAPOLATE_MODES as EXTRAPOLATE_MODES
from gpustat.piecewise._polynomial import PiecewisePolynomial as PiecewisePolynomial
from gpustat.piecewise._polynomial import aos_to_soa as aos_to_soa
from gpustat.piecewise._polynomial import ppoly_eval as ppoly_eval
from gpustat.piecewise._polynomial import soa_to_aos as soa_to_aos

__all__ = [
    "ACTIVATIONS",
    "EXTRAPOLATE_MODES",
    "FIT_METHODS",
    "ActivationSpec",
    "PiecewiseFit",
    "PiecewisePolynomial",
    "activation",
    "aos_to_soa",
    "fit_piecewise",
    "ppoly_eval",
    "soa_to_aos",
]
