"""Pallas kernels (lowered through Triton on NVIDIA GPUs), one module per capability.

Each module is the kernel twin of :mod:`gpustat.reference` of the same name; the capability
packages choose between them through :mod:`gpustat._backend`.
"""
