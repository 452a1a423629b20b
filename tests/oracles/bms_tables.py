"""Independent values for the BMS FLEX tests: the spec's mpmath tables and hand-built fixtures.

* ``MOMENT_CELLS``: spec A.9.1, moments m_0..m_9 computed with mpmath.
* ``RIGID_ROWS``: spec A.9.2, closed-form rigid-model derivatives (mpmath-checked).
* :func:`rigid_stage2_inputs`: the rigid model's Stage-2 inputs written out from the
  spec's closed forms (whole-line cell, a = q √(1+S_f² b²)/S_f), not from Stage 0.
* :func:`random_row_hessians`, :func:`dense_joint_loops`: joint-operator fixtures
  and a plain numpy loop over rows of J_iᵀ H_i J_i.
"""

from __future__ import annotations

import math

import numpy as np

INF = math.inf
SQRT_2PI = math.sqrt(2 * math.pi)

# (lo, hi, C0..C3, m_0..m_9)
MOMENT_CELLS = [
    (-1.0, 1.0, (0.0, 0.0, 0.0, 0.0),
     (1.7112487837842976, 0, 0.49818746435903077, 0, 0.28150107365182542, 0,
      0.19444404883386029, 0, 0.14804702241175527, 0)),
    (-1.0, 1.0, (0.2, 0.7, 0.0, 0.0),
     (1.5697393260687120, -5.9761048478958557e-2, 0.42839097935151493, -3.2736436678629369e-2,
      0.23486760105204280, -2.2219911037471150e-2, 0.15949361019023550, -1.6730891433213716e-2,
      0.12013039094650295, -1.3386471665938716e-2)),
    (-1.25, -0.2, (-0.35, 0.85, 0.4, 0.0),
     (0.61562587153756898, -0.39647382991457791, 0.30845432445685500, -0.27211885321964463,
      0.26011054029499697, -0.26204458385061102, 0.27371455531464012, -0.29347414835519403,
      0.32091119820764386, -0.35632428771472996)),
    (-0.5, 1.7, (0.2, -0.6, 0.25, 0.18),
     (1.5713666332717153, 0.63326439480258989, 0.73980458236834579, 0.77889624861616236,
      0.98320241978666012, 1.2828930446618272, 1.7629813680537234, 2.4929949462368235,
      3.6137051074525868, 5.3358822972227182)),
    (0.1, 0.9, (0.05, 0.0, -0.3, 0.12),
     (0.69136778443009517, 0.32754845025741064, 0.19096321070825031, 0.12547734274305675,
      8.8529156611210635e-2, 6.5383394480346663e-2, 4.9837242560167999e-2,
      3.8871822128817138e-2, 3.0854183406724984e-2, 2.4828952903368538e-2)),
    (-2.0, 2.0, (0.0, 0.0, 0.5, 0.0),
     (2.0967159967902758, 0, 1.1936609356517704, 0, 1.6595850111671371, 0, 3.2566951471368548,
      0, 7.7380580396396867, 0)),
    (-0.8, 0.4, (0.1, -0.25, 0.05, -0.07),
     (1.0931541614221087, -0.18754721421809911, 0.15594470176448391, -7.3202409652550982e-2,
      5.1721248391013504e-2, -3.2082689421411209e-2, 2.2414510407530463e-2,
      -1.5323014075474506e-2, 1.0899568809123373e-2, -7.7713274681324562e-3)),
    (-INF, -0.7, (0.1, 0.5, 0.0, 0.0),
     (0.51424126967209927, -0.62746825177846743, 0.86132076650292644, -1.3357823479915407,
      2.3287673536667981, -4.5133705618176814, 9.5976056850085563, -22.119483937633273,
      54.681351903008881, -143.78693777359223)),
    (1.2, INF, (-0.05, 0.3, 0.0, 0.0),
     (0.25845247031273605, 0.42916845112403540, 0.75375246484789504, 1.4107187309599265,
      2.8294187601272669, 6.0984349842920915, 14.121966824371407, 35.034575801756937,
      92.698701162002322, 260.24022418553494)),
    (-INF, INF, (0.0, 0.0, 0.0, 0.0),
     tuple(SQRT_2PI * v for v in (1, 0, 1, 0, 3, 0, 15, 0, 105, 0))),
]

# affine cells narrower than their Gaussian, where the upward recurrence of the closed form
# loses the high moments: (lo, hi, C0..C3, m_0..m_15), mpmath quadrature at 40 digits
NARROW_AFFINE_CELLS = [
    (-0.05, 0.05, (0.2, 0.7, 0.0, 0.0),
     (0.097959846920390643, -1.1422936305112298e-5, 8.159320161358038e-5,
      -1.7130772970244646e-8, 1.2236409146586464e-7, -3.0587063892053812e-11,
      2.1848180307782187e-10, -5.947038974277327e-14, 4.2479417457150286e-13,
      -1.2163766841845117e-16, 8.688524960335249e-16, -2.573006634713577e-19,
      1.83788789706241e-18, -5.5746855264921111e-22, 3.98197561819159e-21,
      -1.2296817998799876e-24)),
    (0.3, 0.5, (0.2, 0.7, 0.0, 0.0),
     (0.16427426377454872, 0.065307630723549662, 0.026509110897525944, 0.010974412568265995,
      0.0046269255118307523, 0.0019833964055723906, 0.0008629365132541562,
      0.00038041543895606473, 0.00016964783620241882, 7.6421032149933423e-5,
      3.4728539118726186e-5, 1.5902886642367776e-5, 7.3308825105170461e-6,
      3.3991012801809936e-6, 1.5841281498169059e-6, 7.4160419970803606e-7)),
    (-2.5, -0.5, (-0.4, 1.3, 0.0, 0.0),
     (0.1895083767141661, -0.15238654181347437, 0.13545985613609012, -0.13424263227841461,
      0.14842379898070682, -0.18192439016972821, 0.24457970453927552, -0.35635133990816941,
      0.55628791732845727, -0.92109424829307769, 1.6037753700991051, -2.9149913121117466,
      5.496508822562275, -10.695502756666653, 21.381294833993118, -43.745526296718045)),
]


def cells_array(cells):
    """(lo (c,), hi (c,), C (c, 4), moments (c, K+1)) numpy arrays of a cell table."""
    return tuple(np.array([cell[i] for cell in cells], dtype=np.float64) for i in range(4))


# (q, b, z_obs, y, s_f) -> (a, neglog, (g_q, g_b), (H_qq, H_qb, H_bb))
RIGID_ROWS = [
    ((0.3, 0.8, 0.5, 1, 1.0), (0.38418745424597095, 0.24393962694287277,
                               (-0.47944515678372507, -0.2573545902562562),
                               (0.7113504278146966, 0.14796005720329147, 0.15148254051240442))),
    ((-1.1, 1.5, -0.7, 0, 1.0), (-1.9830532015051943, 0.0012111977811480397,
                                 (0.0072402054288742065, -0.006487096962826764),
                                 (0.039641244240194405, -0.03217622566428733,
                                  0.031069368535784857))),
    ((0.3, 0.8, 0.5, 1, 0.8), (0.44522466238967484, 0.2869666887382288,
                               (-0.5021138611655144, -0.22388034076914592),
                               (0.6552178706027463, 0.10976608039208322, 0.08174166774381132))),
    ((-2.5, 2.0, -1.5, 1, 1.0), (-5.5901699437494745, 39.978187584834124,
                                 (-19.46188965463189, 32.51732212613891),
                                 (4.937203531097978, -16.033936207236795, 15.729087714127362))),
]


def rigid_stage2_inputs(rows):
    """Stage-2 inputs (dict of numpy arrays) of rigid rows (p_h = p_w = 0, r = 2), one cell each.

    ``rows``: list of (q, b, z_obs, y, s_f). Each row's single cell is the whole line with
    C = S_f (a, b, 0, 0); its moments are the affine closed form written here with math.erf.
    """
    n = len(rows)
    out = {k: [] for k in ("lo", "hi", "c", "jet", "jet_a", "jet_b", "moments", "mu_1", "mu_2",
                           "e_obs", "chi", "xi", "rho", "tau", "y", "w")}
    for q, b, z_obs, y, s_f in rows:
        a = q * math.sqrt(1 + s_f**2 * b**2) / s_f
        alpha, beta = s_f * a, s_f * b
        out["lo"].append(-INF)
        out["hi"].append(INF)
        out["c"].append([alpha, beta, 0, 0])
        out["jet"].append([[s_f, 0, 0, 0], [0, s_f, 0, 0]])     # ∂η/∂a, ∂η/∂b
        out["jet_a"].append([[0, 0, 0, 0], [0, 0, 0, 0]])       # ∂²η/∂a², ∂²η/∂a∂b
        out["jet_b"].append([[0, 0, 0, 0]])                     # ∂²η/∂b²
        # whole-line moments of exp(-(z² + (α+βz)²)/2): a Gaussian in z, mean μ, variance 1/d1
        d1 = 1 + beta**2
        mu = -alpha * beta / d1
        var = 1 / d1
        scale = SQRT_2PI * math.sqrt(var) * math.exp(-alpha**2 / (2 * d1))
        raw = [1.0, mu]
        for k in range(2, 10):  # raw moments of N(μ, var): m_k = μ m_{k-1} + (k-1) var m_{k-2}
            raw.append(mu * raw[k - 1] + (k - 1) * var * raw[k - 2])
        out["moments"].append([scale * v for v in raw])
        phi_q = math.exp(-q * q / 2) / SQRT_2PI
        out["mu_1"].append(phi_q)
        out["mu_2"].append(-q * phi_q)
        out["e_obs"].append(s_f * (a + b * z_obs))
        out["chi"].append(s_f)
        out["xi"].append(0.0)
        out["rho"].append([0, s_f * z_obs])
        out["tau"].append([0, 0])
        out["y"].append(float(y))
        out["w"].append(1.0)
    arrays = {k: np.asarray(v, dtype=np.float64) for k, v in out.items()}
    arrays["offsets"] = np.arange(n + 1, dtype=np.int32)
    arrays["status"] = np.zeros(n, dtype=np.int32)
    arrays["r_uv"] = np.zeros((n, 2, 2))
    return arrays


def random_row_hessians(rng, n, r, p_m, p_g):
    """Symmetric row Hessians (n, r, r) with +r on the diagonal, designs X (n, p_m), G (n, p_g)."""
    h = rng.standard_normal((n, r, r))
    h = 0.5 * (h + np.swapaxes(h, 1, 2)) + r * np.eye(r)
    return h, rng.standard_normal((n, p_m)), rng.standard_normal((n, p_g))


def dense_joint_loops(hess, x, g):
    """Σ_i J_iᵀ H_i J_i by explicit loops over rows and the four blocks of J_i."""
    n, r, _ = hess.shape
    p_m, p_g = x.shape[1], g.shape[1]
    p_total = p_m + p_g + r - 2
    out = np.zeros((p_total, p_total))
    for i in range(n):
        jac = np.zeros((r, p_total))
        jac[0, :p_m] = x[i]
        jac[1, p_m:p_m + p_g] = g[i]
        for k in range(r - 2):
            jac[2 + k, p_m + p_g + k] = 1.0
        out += jac.T @ hess[i] @ jac
    return out


STAGE2_KEYS = ("offsets", "c", "moments", "status", "jet", "jet_a", "jet_b", "mu_1", "mu_2", "e_obs",
               "chi", "xi", "rho", "tau", "r_uv", "y", "w")
