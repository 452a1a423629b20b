"""The meaning of every op: pure ``jax.numpy`` references and the data model.

One module per capability, vmapped over rows or atoms, differentiable, float32 and float64.
The kernels in :mod:`gpustat.pallas` and :mod:`gpustat.triton` are tested against them.
"""
