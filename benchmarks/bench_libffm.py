"""Benchmark: libffm text ingest on one CPU core (``load_libffm`` and ``iter_libffm``).

Data: a generated CTR-like libffm file of about ``--megabytes`` MB: rows of 24
one-hot fields over 1,000,000 features (Zipf-like, rank^-1.1), value ``1`` for
three quarters of the triples and a 6-significant-digit float for the rest,
labels 0/1. Correctness first: the loaded matrix equals the one the file was
written from. Then the median of ``--repeats`` full reads, as MB/s of file
text, for ``load_libffm`` (one matrix) and ``iter_libffm`` (chunks of 65,536
rows), by wall clock and by the process's CPU time (target: >= 20 MB/s), recorded as
``libffm.jsonl`` in ``--out`` (default ``benchmarks/results/<device>/``). Run it pinned
to one core: ``taskset -c 0 python -m benchmarks.bench_libffm``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np

from benchmarks.harness import Recorder, Timing
from gpustat.factorization import load_libffm
from gpustat.factorization._libffm import iter_libffm

N_FEATURES = 1_000_000
N_FIELDS = 24
TARGET_MB_S = 20.0


def write_ctr_file(path: str, megabytes: float, seed: int = 0):
    """Write the benchmark file; returns the dense-free truth ``(indptr, indices, data, y)``."""
    rng = np.random.default_rng(seed)
    vocab = N_FEATURES // N_FIELDS
    probs = 1.0 / np.arange(1, vocab + 1) ** 1.1
    cdf = np.cumsum(probs / probs.sum())
    n = int(megabytes * 1e6 / (N_FIELDS * 12.5 + 2))
    ranks = np.searchsorted(cdf, rng.random((n, N_FIELDS)), side="right").clip(max=vocab - 1)
    fields = np.broadcast_to(np.arange(N_FIELDS), (n, N_FIELDS))
    features = fields * vocab + ranks
    text_values = np.where(rng.random((n, N_FIELDS)) < 0.75, "1",
                           np.char.mod("%.6g", rng.lognormal(size=(n, N_FIELDS))))
    y = rng.integers(0, 2, n)
    triples = np.char.add(np.char.add(np.char.add(fields.astype(str), ":"),
                                      np.char.add(features.astype(str), ":")), text_values)
    with open(path, "w") as handle:
        for r in range(n):
            handle.write(f"{y[r]} {' '.join(triples[r])}\n")
    return features, text_values.astype(np.float64), y


def _seconds(fn, repeats: int) -> tuple[list[float], float]:
    """Wall seconds of each of ``repeats`` runs of ``fn()``, and the median CPU seconds: on
    a shared machine the process's CPU time is what one free core would take."""
    wall, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return wall, statistics.median(cpu)


def run(megabytes: float, repeats: int, out: str | None = None) -> None:
    rec = Recorder("libffm", out)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ctr.ffm")
        features, values, y = write_ctr_file(path, megabytes)
        size = os.path.getsize(path) / 1e6
        X, labels, field_ids = load_libffm(path, n_features=N_FEATURES)
        order = np.argsort(features, axis=1, kind="stable")
        assert np.array_equal(X.indices.reshape(features.shape), np.take_along_axis(
            features, order, 1)), "feature ids differ"
        assert np.array_equal(X.data.reshape(values.shape), np.take_along_axis(values, order, 1))
        assert np.array_equal(labels, y)
        used = np.unique(features)
        assert np.array_equal(field_ids[used], used // (N_FEATURES // N_FIELDS))
        load = _seconds(lambda: load_libffm(path, n_features=N_FEATURES), repeats)
        stream = _seconds(
            lambda: sum(x.nnz for x, _, _ in iter_libffm(path, n_features=N_FEATURES)), repeats)
        print(f"file {size:.1f} MB, {X.shape[0]} rows, {X.nnz} nonzeros")
        for case, (wall, cpu) in [("load_libffm", load), ("iter_libffm", stream)]:
            timing = Timing.of([1e3 * w for w in wall])
            mb_s = size / (timing.median_ms * 1e-3)
            rec.record(case, shape=(X.shape[0], N_FEATURES, N_FIELDS), dtype="float64",
                       backend="cpu", timing=timing, bytes_moved=size * 1e6, items=X.shape[0],
                       item_name="rows",
                       extra={"file_mb": size, "mb_per_s": mb_s, "cpu_s": cpu,
                              "mb_per_cpu_s": size / cpu, "cpus_allowed":
                              len(os.sched_getaffinity(0)), "chunk_rows":
                              65536 if case == "iter_libffm" else None,
                              "target_mb_per_s": TARGET_MB_S,
                              "meets_target": mb_s >= TARGET_MB_S})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=float, default=50.0)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=None, help="results folder")
    args = parser.parse_args()
    run(args.megabytes, args.repeats, args.out)


if __name__ == "__main__":
    main()
