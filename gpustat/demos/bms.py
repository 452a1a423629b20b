"""BMS FLEX demo: a small flexible probit model, its row derivatives and a joint Newton direction.

Builds 24 rows with score-warp and link-deviation splines, runs Stage 1 and Stage 2
and the joint operators on ``backend`` and compares with the jnp reference.
"""

from __future__ import annotations

import numpy as np

from gpustat import bms
from gpustat.demos import DemoRow, max_rel_error, timed

CAPABILITY = "bms"
FLOAT64_ONLY = True  # skipped when 64-bit types are off (GPUSTAT_X32=1)


def run(backend: str, small: bool) -> list[DemoRow]:
    rng = np.random.default_rng(0)
    n = 24 if small else 4096
    score = bms.flat_cubic_basis(np.linspace(-2.5, 2.5, 7))
    link = bms.flat_cubic_basis(np.linspace(-3.0, 3.0, 6))
    p_h, p_w = score.coeffs.shape[2], link.coeffs.shape[2]
    x = np.c_[np.ones(n), rng.normal(size=(n, 2))]
    g = np.c_[np.ones(n), rng.normal(size=n)]
    beta_m, beta_g = np.array([0.2, 0.5, -0.3]), np.array([0.8, 0.2])
    rows = bms.build_rows(x @ beta_m, g @ beta_g, rng.normal(size=p_h) * 0.2,
                          rng.normal(size=p_w) * 0.1, score, link, rng.normal(size=n),
                          rng.integers(0, 2, n), np.ones(n), 1.0, backend="reference")
    out: list[DemoRow] = []

    moments, seconds = timed(lambda: bms.cell_moments(rows.cell_lo, rows.cell_hi, rows.cell_c,
                                                      backend=backend)[0])
    out.append(DemoRow(CAPABILITY, f"cell moments ({rows.n_cells} cells)", backend,
                       max_rel_error(moments, rows.cell_moments), seconds))

    derivs, seconds = timed(lambda: bms.row_derivatives(rows, backend=backend))
    want = bms.row_derivatives(rows, backend="reference")
    out.append(DemoRow(CAPABILITY, f"row derivatives (n={n}, r={rows.r})", backend,
                       max_rel_error(derivs[:3], want[:3]), seconds,
                       note=f"{int(np.sum(np.asarray(derivs.status) != 0))} rows not ok"))

    op = bms.JointOperator.from_rows(derivs, x, g, backend=backend)
    dense = bms.joint_dense(want, x, g, backend="reference")
    v = rng.normal(size=(8, op.p_total))
    hv, seconds = timed(op.hvp, v)
    out.append(DemoRow(CAPABILITY, f"joint HVP, 8 directions (p_total={op.p_total})", backend,
                       max_rel_error(hv, v @ np.asarray(dense)), seconds))
    # one damped Newton direction of the data part: (H + I) d = score (= -∇ neglog)
    score_vec = bms.joint_gradient(derivs, x, g)[1:]
    dense_op, seconds = timed(op.dense)
    direction = np.linalg.solve(np.asarray(dense_op) + np.eye(op.p_total), np.asarray(score_vec))
    out.append(DemoRow(CAPABILITY, "dense joint block + Newton direction", backend,
                       max_rel_error(dense_op, dense), seconds,
                       note=f"|d| = {np.linalg.norm(direction):.3g}"))
    return out
