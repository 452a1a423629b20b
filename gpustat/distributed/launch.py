"""``python -m gpustat.distributed.launch --num-processes N [--devices-per-process K] -- command``.

Starts N processes of one multi-process JAX job on this host (see
:func:`gpustat.distributed._launch.launch`); the command calls
:func:`gpustat.distributed.initialize`.
"""

import sys

from gpustat.distributed._launch import main

if __name__ == "__main__":
    sys.exit(main())
