"""mpmath oracles of the numerics module's derivatives."""

import mpmath as mp


def curvature_derivative(x) -> float:
    """C'(x) = λ(1 - C) - C(x + λ) at 80 digits, enough for its 1e16-fold cancellation
    at x = -1e4 (λ = φ/Φ, C = λ(x + λ))."""
    with mp.workdps(80):
        x = mp.mpf(x)
        lam = mp.npdf(x) / mp.ncdf(x)
        curvature = lam * (x + lam)
        return float(lam * (1 - curvature) - curvature * (x + lam))
