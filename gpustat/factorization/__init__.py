"""Factorization machines (FM, FFM, FwFM): scores on CSR rows, libffm files.

Scores and their dispatch are in :mod:`gpustat.factorization._predict`, the closed-form
backward in :mod:`gpustat.factorization._vjp`, libffm input and output in
:mod:`gpustat.factorization._libffm`.
"""

from gpustat.csr import CSR as CSR
from gpustat.factorization._libffm import dump_libffm as dump_libffm
from gpustat.factorization._libffm import iter_libffm as iter_libffm
from gpustat.factorization._libffm import iter_svmlight as iter_svmlight
from gpustat.factorization._libffm import load_libffm as load_libffm
from gpustat.factorization._libffm import load_svmlight as load_svmlight
from gpustat.factorization._predict import ffm_predict as ffm_predict
from gpustat.factorization._predict import fm_predict as fm_predict
from gpustat.factorization._predict import fwfm_predict as fwfm_predict

__all__ = [
    "CSR",
    "dump_libffm",
    "ffm_predict",
    "fm_predict",
    "fwfm_predict",
    "iter_libffm",
    "iter_svmlight",
    "load_libffm",
    "load_svmlight",
]
