"""Timing harness shared by every ``bench_<module>.py`` (the benchmarks contract).

* correctness first: :func:`check_close` at the benchmark size before timing;
* timing: warm-up excluded, median of >= 20 repetitions, each repetition ends in
  ``block_until_ready``; inputs rotated over several buffers when one would sit in L2;
* a device-to-device copy measured in the same process is the bandwidth ceiling;
* every case prints one line and appends one JSON line to
  ``<out>/<module>.jsonl`` with device, jax version and git commit;
* 64-bit types are on only where a case needs them (:func:`x64_for`): float32 and
  16-bit cases, baselines included, run as a float32 user runs JAX.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
import re
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
MIN_REPEATS = 20


def x64_for(dtype) -> contextlib.AbstractContextManager:
    """``jax_enable_x64`` as a case of ``dtype`` needs it: on for float64, off otherwise.

    The benchmark entry points turn 64-bit types on for the float64 cases, and
    with them on XLA's float32 programs change: index arithmetic becomes int64
    and other GEMM kernels are chosen. The plain-XLA EM iteration of
    ``bench_mixture`` took 10.85 ms with them and 6.85 ms without (H100, same
    process), so every float32 case and its baselines are timed inside
    ``x64_for(jnp.float32)``. Arrays built inside keep their dtypes; a float64
    array must not be used outside an ``x64_for(jnp.float64)`` block.
    """
    return jax.enable_x64(jnp.dtype(dtype) == jnp.float64)


def device_name() -> str:
    """Kind of JAX's first device, e.g. ``NVIDIA H100 80GB HBM3`` or ``cpu``."""
    return jax.devices()[0].device_kind


def device_slug(name: str | None = None) -> str:
    """Folder name for a device: lower case, runs of other characters as ``-``."""
    return re.sub(r"[^a-z0-9]+", "-", (name or device_name()).lower()).strip("-")


def git_commit() -> str:
    """Commit of the working tree (``+dirty`` when it has changes), or ``unknown``.

    ``GPUSTAT_COMMIT`` overrides it: the GPU machine gets a copy of the tree
    without ``.git``, so the command sent there passes the commit along.
    """
    if os.environ.get("GPUSTAT_COMMIT"):
        return os.environ["GPUSTAT_COMMIT"]
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO_ROOT,
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=REPO_ROOT, capture_output=True, text=True).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def default_out_dir() -> Path:
    return REPO_ROOT / "benchmarks" / "results" / device_slug()


@dataclasses.dataclass(frozen=True)
class Timing:
    """Per-call times in milliseconds over ``repeats`` repetitions of ``calls`` calls."""

    median_ms: float
    p10_ms: float
    p90_ms: float
    repeats: int
    calls: int = 1

    @classmethod
    def of(cls, times_ms: Sequence[float], calls: int = 1) -> Timing:
        """The median and 10th / 90th percentiles of per-call times ``times_ms``, one per
        repetition."""
        t = np.asarray(times_ms, dtype=np.float64)
        return cls(float(np.median(t)), float(np.percentile(t, 10)),
                   float(np.percentile(t, 90)), t.size, calls)


# Back-to-back calls per repetition are chosen so one repetition lasts at least this
# long: the host's dispatch and synchronisation latency (~10-50 us) then stays out
# of per-call times, for kernels and for the copy ceiling alike.
_MIN_REPEAT_MS = 2.0
_MAX_CALLS_PER_REPEAT = 50


def time_fn(fn: Callable, arg_sets: Sequence[tuple], *, repeats: int = MIN_REPEATS,
            warmup: int = 3, calls_per_repeat: int | None = None) -> Timing:
    """Median wall time of ``fn(*args)`` per call, rotating through ``arg_sets``.

    Each repetition issues ``calls_per_repeat`` calls back to back (rotating
    inputs) and blocks once; the recorded time is the repetition's time divided
    by its call count, as in a jitted pipeline. ``None`` picks the count from the
    fastest of three timed calls: enough calls for ``_MIN_REPEAT_MS``, at most
    ``_MAX_CALLS_PER_REPEAT``.
    """
    if repeats < MIN_REPEATS:
        raise ValueError(f"the benchmarks contract needs >= {MIN_REPEATS} repeats, got {repeats=}")
    arg_sets = list(arg_sets)
    for i in range(warmup):
        jax.block_until_ready(fn(*arg_sets[i % len(arg_sets)]))
    if calls_per_repeat is None:
        once_ms = np.inf
        for args in arg_sets[:3] * (3 // len(arg_sets[:3])):
            start = time.perf_counter()
            jax.block_until_ready(fn(*args))
            once_ms = min(once_ms, (time.perf_counter() - start) * 1e3)
        calls_per_repeat = int(min(max(np.ceil(_MIN_REPEAT_MS / max(once_ms, 1e-3)), 1),
                                   _MAX_CALLS_PER_REPEAT))
    times = []
    k = 0
    for _ in range(repeats):
        start = time.perf_counter()
        out = None
        for _ in range(calls_per_repeat):
            out = fn(*arg_sets[k % len(arg_sets)])
            k += 1
        jax.block_until_ready(out)
        times.append((time.perf_counter() - start) * 1e3 / calls_per_repeat)
    return Timing.of(times, calls_per_repeat)


def rotating_copies(make: Callable[[int], tuple], bytes_per_set: int,
                    l2_bytes: int = 64 << 20) -> list[tuple]:
    """Enough independent input sets that cycling through them never hits L2.

    ``make(i)`` builds set ``i``; the count is 1 when a set is already over 4x L2.
    """
    count = 1 if bytes_per_set >= 4 * l2_bytes else int(np.ceil(4 * l2_bytes / bytes_per_set))
    return [make(i) for i in range(count)]


def copy_bandwidth_gbs(nbytes: int = 1 << 30, repeats: int = MIN_REPEATS) -> float:
    """Device-to-device bandwidth (bytes read + written per second, in GB/s).

    Times a jitted ``2 * x`` over a float32 array of ``nbytes``: one read and one
    write of every byte, the ceiling any streaming kernel is held to, timed by
    :func:`time_fn` like every kernel.
    """
    n = nbytes // 4
    x = jnp.arange(n, dtype=jnp.float32)
    scale = jax.jit(lambda v: v * 2.0)
    timing = time_fn(scale, [(x,)], repeats=repeats)
    return 2 * n * 4 / (timing.median_ms * 1e-3) / 1e9


def check_close(name: str, actual, expected, *, rtol: float, atol: float = 0.0) -> float:
    """Raise unless ``actual`` matches ``expected``; return the max relative error."""
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    if a.shape != e.shape:
        raise AssertionError(f"{name}: shape {a.shape} != expected {e.shape}")
    err = np.abs(a - e)
    bad = ~(err <= atol + rtol * np.abs(e)) & ~(np.isnan(a) & np.isnan(e))
    if np.any(bad):
        i = int(np.argmax(np.where(bad, err, -1)))
        raise AssertionError(
            f"{name}: {int(bad.sum())} of {a.size} entries differ; worst at flat index {i}: "
            f"{a.flat[i]!r} vs {e.flat[i]!r} (rtol={rtol}, atol={atol})")
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(np.isnan(e), 0.0, err / np.maximum(np.abs(e), np.finfo(np.float64).tiny))
    return float(np.nanmax(rel)) if rel.size else 0.0


class Recorder:
    """Prints each case and appends it as one JSON line to ``<out_dir>/<module>.jsonl``."""

    def __init__(self, module: str, out_dir: Path | str | None = None):
        self.module = module
        self.out_dir = Path(out_dir) if out_dir else default_out_dir()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.out_dir / f"{module}.jsonl"
        self.device = device_name()
        self.commit = git_commit()
        self.copy_gbs: float | None = None

    def measure_copy(self, nbytes: int = 1 << 30) -> float:
        """Measure (once) the in-run copy bandwidth used for roofline fractions."""
        if self.copy_gbs is None:
            self.copy_gbs = copy_bandwidth_gbs(nbytes)
            self.record("copy", shape=(nbytes // 4,), dtype="float32", backend="xla",
                        timing=None, bytes_moved=None, extra={"copy_gbs": self.copy_gbs})
        return self.copy_gbs

    def record(self, case: str, *, shape, dtype: str, backend: str, timing: Timing | None,
               bytes_moved: float | None = None, items: float | None = None,
               item_name: str = "items", baseline: str | None = None,
               extra: dict | None = None) -> dict:
        """Write one case. ``bytes_moved`` gives GB/s and the fraction of copy bandwidth;
        ``items`` gives a throughput in ``item_name``/s; ``baseline`` names the case
        this one is compared with (ratios are computed by ``report.py``)."""
        row = {
            "module": self.module, "case": case, "shape": list(shape), "dtype": dtype,
            "backend": backend, "device": self.device, "jax": jax.__version__,
            "commit": self.commit,
            "time": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        }
        if timing is not None:
            row.update(median_ms=timing.median_ms, p10_ms=timing.p10_ms, p90_ms=timing.p90_ms,
                       repeats=timing.repeats, calls_per_repeat=timing.calls)
            seconds = timing.median_ms * 1e-3
            if bytes_moved is not None:
                row["gbs"] = bytes_moved / seconds / 1e9
                if self.copy_gbs:
                    row["copy_gbs"] = self.copy_gbs
                    row["roofline_fraction"] = row["gbs"] / self.copy_gbs
            if items is not None:
                row["throughput"] = items / seconds
                row["throughput_unit"] = f"{item_name}/s"
        if baseline is not None:
            row["baseline"] = baseline
        row.update(extra or {})
        with self.path.open("a") as fh:
            fh.write(json.dumps(row) + "\n")
        shown = {k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in row.items()
                 if k not in ("module", "device", "jax", "commit", "time")}
        print(f"[{self.module}] " + " ".join(f"{k}={v}" for k, v in shown.items()), flush=True)
        return row


def main_from_args(run: Callable[..., None], module: str) -> None:
    """Command line of a ``bench_<module>.py`` script: ``[--quick] [--out DIR]``.

    Each bench module defines ``run(quick: bool, out: Path | None)``; this is also
    what ``python -m gpustat bench <module>`` calls.
    """
    import argparse

    parser = argparse.ArgumentParser(description=f"gpustat benchmarks: {module}")
    parser.add_argument("--quick", action="store_true", help="acceptance cases only")
    parser.add_argument("--out", type=Path, default=None, help="folder for <module>.jsonl")
    args = parser.parse_args()
    jax.config.update("jax_enable_x64", True)
    run(quick=args.quick, out=args.out)
