"""CPU benchmark of what a new user meets first: import time, a first fit, a grid search.

Run on a CPU machine (the CI kind: 2 cores) from a source checkout::

    python -m benchmarks.cpu_user_paths [--out DIR]

Cases, each in fresh interpreters of this run (warm file-system caches: every command
runs once untimed first), beside the peer a user would otherwise call:

* ``import``: ``python -c "import gpustat"`` against ``python -c "import jax"``, median of 5;
* ``first_fit``: the first ``GaussianMixture(3).fit`` on 500 x 2 rows in a new process,
  with JAX's persistent compilation cache empty and then warm (a second process), against
  scikit-learn's in a new process;
* ``grid_search``: ``GridSearchCV`` over ``GaussianMixture`` (n_components 1-3 x
  "full"/"diag", 3 folds) on 500 x 2 rows in a new process, cache empty and warm, against
  scikit-learn's estimator under the same search.

Warm-cache and scikit-learn times are medians of three processes; scikit-learn is also
timed with ``OMP_NUM_THREADS=1`` (on a loaded machine its OpenMP threads spin: the grid
search took 2.4-3.3 s on two threads against 0.1 s on one); every record carries the
1-minute load average.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.harness import Recorder

ROOT = Path(__file__).resolve().parents[1]
DATA = ("import numpy as np; rng = np.random.default_rng(0); "
        "X = np.concatenate([rng.normal(size=(250, 2)), rng.normal(size=(250, 2)) + 4.0])")
FIT = DATA + "; import time; t = time.perf_counter(); {est}(3, random_state=0).fit(X); " \
             "print(time.perf_counter() - t)"
GRID = (DATA + "; import time; from sklearn.model_selection import GridSearchCV; "
        "t = time.perf_counter(); GridSearchCV({est}(random_state=0), "
        "{{'n_components': [1, 2, 3], 'covariance_type': ['full', 'diag']}}, cv=3).fit(X); "
        "print(time.perf_counter() - t)")
OURS = "from gpustat import GaussianMixture as Est; "
PEER = "from sklearn.mixture import GaussianMixture as Est; "


def _python(code: str, env: dict | None = None) -> tuple[float, str]:
    """(wall seconds of the whole process, its last printed line)."""
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT, env={**os.environ, **(env or {})})
    return time.perf_counter() - start, out.stdout.strip().splitlines()[-1:]


def _median_process(code: str, repeats: int = 5) -> float:
    _python(code)
    return float(np.median([_python(code)[0] for _ in range(repeats)]))


def _in_process_seconds(code: str, env: dict | None = None) -> float:
    return float(_python(code, env)[1][0])


def run(out: Path | None) -> None:
    rec = Recorder("cpu_user_paths", out or ROOT / "benchmarks" / "results" / "cpu-2core")
    jax_s = _median_process("import jax")
    ours_s = _median_process("import gpustat")
    rec.record("import", shape=(), dtype="-", backend="cpu", timing=None,
               extra={"import_gpustat_s": ours_s, "import_jax_s": jax_s,
                      "ratio": ours_s / jax_s, "target_ratio": 1.5, "cpus": os.cpu_count(),
                      "load_average_1min": os.getloadavg()[0]})
    for case, template in (("first_fit", FIT), ("grid_search", GRID)):
        with tempfile.TemporaryDirectory() as cache:
            env = {"JAX_COMPILATION_CACHE_DIR": cache,
                   "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
            code = OURS + template.format(est="Est")
            cold = _in_process_seconds(code, env)
            warm = float(np.median([_in_process_seconds(code, env) for _ in range(3)]))
        no_cache = _in_process_seconds(code)
        peer_code = PEER + template.format(est="Est")
        peer = float(np.median([_in_process_seconds(peer_code) for _ in range(3)]))
        # its k-means and BLAS threads spin on a loaded machine: also on one thread
        peer_one = float(np.median([_in_process_seconds(peer_code, {"OMP_NUM_THREADS": "1"})
                                    for _ in range(3)]))
        rec.record(case, shape=(500, 2), dtype="float64", backend="cpu", timing=None,
                   extra={"gpustat_no_cache_s": no_cache, "gpustat_cache_empty_s": cold,
                          "gpustat_cache_warm_s": warm, "sklearn_s": peer,
                          "ratio_warm_cache_vs_sklearn": warm / peer,
                          "ratio_no_cache_vs_sklearn": no_cache / peer,
                          "sklearn_one_thread_s": peer_one,
                          "ratio_warm_cache_vs_sklearn_one_thread": warm / peer_one,
                          "ratio_no_cache_vs_sklearn_one_thread": no_cache / peer_one,
                          "cpus": os.cpu_count(), "load_average_1min": os.getloadavg()[0]})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=None)
    run(parser.parse_args().out)


if __name__ == "__main__":
    main()
