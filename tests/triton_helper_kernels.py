"""Triton kernels that expose the library's ``@triton.jit`` helpers to the tests.

Imported only by GPU tests: Triton's interpreter would run these kernels' module alone,
with the library's helpers left compiled.
"""

import triton
import triton.language as tl

from gpustat.triton.border import _binary_parts


@triton.jit
def binary_parts_kernel(x_ptr, m_ptr, e_ptr, N: tl.constexpr):
    """``(m, e)`` of :func:`gpustat.triton.border._binary_parts` for ``N`` numbers."""
    i = tl.arange(0, N)
    m, e = _binary_parts(tl.load(x_ptr + i))
    tl.store(m_ptr + i, m)
    tl.store(e_ptr + i, e)
