"""jax-triton backend: Triton-language kernels called through ``jax_triton.triton_call``.

``backend="triton"`` runs kernels written directly in the Triton language, a GPU path
that does not depend on the Pallas Triton lowering:

* :mod:`gpustat.triton.piecewise`: ``ppoly_eval`` (all dtypes, uniform and searched
  breakpoints, every extrapolate mode, trailing axes);
* :mod:`gpustat.triton.factorization`: ``ffm_predict`` and ``fwfm_predict`` scores;
* :mod:`gpustat.triton.border`: ``solve_batched_border``, one fused program per atom;
* :mod:`gpustat.triton.mixture`: the mixture E-step at ``precision="f16x3"``
  (``suff_stats``, ``fit_em``), float16-split tensor-core GEMMs over quadratic features.

Nothing here imports ``triton`` or ``jax_triton`` until a Triton kernel is called:
gpustat imports and works without them (``pip install 'gpustat[triton]'`` adds
jax-triton 0.3.1, the line that matches triton 3.6). Where ``backend="auto"`` takes these
kernels is decided in :data:`gpustat._backend.AUTO_RULES`.
"""
