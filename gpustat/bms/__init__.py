"""Bernoulli marginal-slope (BMS) FLEX rows: from model parameters to row and joint derivatives.

The public ops are in :mod:`gpustat.bms._ops`, the Stage-0 row builder in
:mod:`gpustat.bms._stage0` (its numpy twin, the test oracle, in :mod:`gpustat.bms._rows`),
the Newton driver in :mod:`gpustat.bms._fit`.
"""

from gpustat.bms._fit import FitResult as FitResult
from gpustat.bms._fit import FitStatus as FitStatus
from gpustat.bms._fit import fit as fit
from gpustat.bms._ops import BmsRows as BmsRows
from gpustat.bms._ops import CellStatus as CellStatus
from gpustat.bms._ops import JointOperator as JointOperator
from gpustat.bms._ops import RowDerivatives as RowDerivatives
from gpustat.bms._ops import RowStatus as RowStatus
from gpustat.bms._ops import build_rows as build_rows
from gpustat.bms._ops import cell_moments as cell_moments
from gpustat.bms._ops import flat_cubic_basis as flat_cubic_basis
from gpustat.bms._ops import joint_dense as joint_dense
from gpustat.bms._ops import joint_diagonal as joint_diagonal
from gpustat.bms._ops import joint_gradient as joint_gradient
from gpustat.bms._ops import joint_hvp as joint_hvp
from gpustat.bms._ops import row_derivatives as row_derivatives

__all__ = [
    "BmsRows",
    "CellStatus",
    "FitResult",
    "FitStatus",
    "JointOperator",
    "RowDerivatives",
    "RowStatus",
    "build_rows",
    "cell_moments",
    "fit",
    "flat_cubic_basis",
    "joint_dense",
    "joint_diagonal",
    "joint_gradient",
    "joint_hvp",
    "row_derivatives",
]
