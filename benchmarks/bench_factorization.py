"""Benchmark: FM / FFM / FwFM scoring of CTR-like CSR rows (Pallas vs XLA vs modern_fm).

Data (the issue's acceptance case): ``n`` rows, 1,000,000 features in 24
one-hot fields of equal vocabulary with Zipf-like (rank^-1.1) frequencies, one
nonzero per field (24 per row, value 1), float32; k = 16 (FM), 8 (FFM, FwFM).
Data and parameters are resident on the device. Per model, in one process:

1. correctness: the Pallas kernel vs the XLA reference on all rows;
2. a small sweep of kernel tiles (``block_rows``, ``num_warps``), then the best;
3. the XLA-compiled reference (``jax.jit``; FFM's per-row (w, w, k) gather is
   chunked with ``lax.map`` over 65,536 rows so it fits in memory);
   FwFM runs on the plain CSR ("rows" layout) and on the same CSR with its
   field-slot table (``X.with_field_slots``, "slots" layout, built once on the
   host; its build time is recorded);
4. modern_fm's predict on the host CPUs (Rust core, one thread; on
   ``--modern-fm-rows`` rows, timed as rows/s) and its CUDA backend if it loads.

Throughput is rows/s; ratios go in ``extra`` (``speedup_vs_xla``,
``speedup_vs_modern_fm_cpu``). ``bytes_moved`` is the no-reuse volume: the CSR
plus every gathered parameter once per use (L1/L2 reuse makes real traffic lower).
"""

from __future__ import annotations

import functools
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.harness import Recorder, check_close, main_from_args, time_fn, x64_for
from gpustat import factorization as fz
from gpustat.csr import CSR
from gpustat.pallas import factorization as kernels
from gpustat.reference import factorization as ref

N_FEATURES = 1_000_000
N_FIELDS = 24
ZIPF_EXPONENT = 1.1
K = {"fm": 16, "ffm": 8, "fwfm": 8}
TARGET_ROWS_PER_S = {"fm": 200e6, "ffm": 50e6, "fwfm": 100e6}
SWEEP = {  # (layout, block_rows, num_warps) tried per model, around the defaults
    "fm": [("rows", 4, 4), ("rows", 8, 4), ("rows", 16, 4), ("rows", 8, 8)],
    "ffm": [("rows", 2, 2), ("rows", 4, 4), ("rows", 8, 4), ("rows", 4, 8)],
    # FwFM: the row-bucket kernel at its H200 best, then the field-slot kernel
    # (block_rows * k is the dot's N; 16 rows = 128 columns by default)
    "fwfm": [("rows", 16, 4), ("slots", 8, 4), ("slots", 16, 4), ("slots", 32, 4),
             ("slots", 64, 4), ("slots", 16, 8), ("slots", 32, 8), ("slots", 64, 8)],
}


def ctr_rows(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(indptr, indices, field_ids) of ``n`` one-hot rows, one Zipf-drawn feature per field."""
    rng = np.random.default_rng(seed)
    vocab = N_FEATURES // N_FIELDS
    probs = 1.0 / np.arange(1, vocab + 1) ** ZIPF_EXPONENT
    cdf = np.cumsum(probs / probs.sum())
    ranks = np.searchsorted(cdf, rng.random((n, N_FIELDS)), side="right").clip(max=vocab - 1)
    # shuffle rank -> feature id within each field so hot features are scattered in memory
    perm = np.stack([rng.permutation(vocab) for _ in range(N_FIELDS)])
    features = perm[np.arange(N_FIELDS)[None, :], ranks] + vocab * np.arange(N_FIELDS)[None, :]
    indptr = np.arange(n + 1, dtype=np.int64) * N_FIELDS
    field_ids = np.minimum(np.arange(N_FEATURES) // vocab, N_FIELDS - 1)
    return indptr, features.reshape(-1).astype(np.int32), field_ids.astype(np.int32)


def parameters(model: str, seed: int = 1):
    rng = np.random.default_rng(seed)
    k = K[model]
    w0 = np.float32(0.1)
    w = (0.01 * rng.standard_normal(N_FEATURES)).astype(np.float32)
    shape = (N_FEATURES, N_FIELDS, k) if model == "ffm" else (N_FEATURES, k)
    V = (0.1 * rng.standard_normal(shape)).astype(np.float32)
    R = (1.0 + 0.1 * rng.standard_normal((N_FIELDS, N_FIELDS))).astype(np.float32)
    return w0, w, V, R


def _call(model, X, fid, w0, w, V, R, backend):
    if model == "fm":
        return fz.fm_predict(X, w0, w, V, backend=backend)
    if model == "ffm":
        return fz.ffm_predict(X, fid, w0, w, V, backend=backend)
    return fz.fwfm_predict(X, fid, w0, w, V, R, backend=backend)


INTERPRET = False  # True only for a CPU smoke run of this script


def _kernel_fn(model, block_rows=None, num_warps=None):
    settings = {"block_rows": block_rows, "num_warps": num_warps, "interpret": INTERPRET}

    def run(X, fid, w0, w, V, R):
        if model == "fm":
            return kernels.fm_scores(X, w0, w, V, **settings)
        if model == "ffm":
            return kernels.ffm_scores(X, fid, w0, w, V, **settings)
        return kernels.fwfm_scores(X, fid, w0, w, V, R, **settings)

    return jax.jit(run)


def _xla_reference(model):
    if model != "ffm":
        return jax.jit(functools.partial(_call, model, backend="reference"))

    def chunked(X, fid, w0, w, V, R):
        (rows,), (width,) = X.bucket_rows, X.buckets.widths
        cols, x, _ = ref.bucket_tiles(X, rows, width, jnp.float32)
        scores = jax.lax.map(lambda cx: ref.ffm_row(cx[0], cx[1], fid, w0, w, V), (cols, x),
                             batch_size=65536)
        return ref.assemble_scores(X, w0, [scores])

    return jax.jit(chunked)


def _no_reuse_bytes(model, nnz, n):
    csr = nnz * 8 + (n + 1) * 4
    k = K[model]
    if model == "ffm":  # each nonzero's whole (F, k) slab + its weight
        return csr + nnz * (N_FIELDS * k + 1) * 4
    return csr + nnz * (k + 1) * 4


def _modern_fm(model, X_scipy, fid, w0, w, V, R, backend):
    from modern_fm import _backend as mfm

    if model == "fm":
        return mfm.fm_predict_fast(X_scipy, float(w0), w, V, backend=backend)
    if model == "ffm":
        return mfm.ffm_predict(X_scipy, fid, float(w0), w, V, backend=backend)
    return mfm.fwfm_predict(X_scipy, fid, float(w0), w, V, R, backend=backend)


def _time_host(fn, repeats=20):
    """Median seconds of ``fn()`` over ``repeats`` runs after one warm-up."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def _bench_modern_fm(rec: Recorder, model: str, X: CSR, fid_np, w0, w, V, R, expected,
                     modern_rows: int):
    """modern_fm's predict on a row subset: (host rows/s, CUDA rows/s), None where unavailable.

    Its own float64 CSR path, one thread on the host; a missing package or a CUDA build
    that fails is recorded as unavailable, never skipped silently.
    """
    import scipy.sparse as sp

    try:
        from modern_fm import _backend as mfm
    except ImportError as exc:
        for case, backend in (("cpu", "rust_cpu-1thread"), ("cuda", "cuda")):
            rec.record(f"{model}_modern_fm_{case}", shape=(0,), dtype="float64",
                       backend=f"modern_fm-{backend}",
                       timing=None, extra={"unavailable": f"import modern_fm: {exc}"})
        return None, None
    sub = sp.csr_array((np.ones(modern_rows * N_FIELDS), np.asarray(X.indices[:modern_rows *
                        N_FIELDS]), np.arange(modern_rows + 1) * N_FIELDS),
                       shape=(modern_rows, N_FEATURES))
    V_np = np.asarray(V, np.float64)
    mfm_scores = _modern_fm(model, sub, fid_np, w0, w, V_np, R, "rust_cpu")
    check_close(f"{model} modern_fm vs xla", mfm_scores, np.asarray(expected[:modern_rows]),
                rtol=1e-4, atol=1e-4)
    cpu_s = _time_host(lambda: _modern_fm(model, sub, fid_np, w0, w, V_np, R, "rust_cpu"))
    cpu_rows_s = modern_rows / cpu_s
    rec.record(f"{model}_modern_fm_cpu", shape=(modern_rows, N_FEATURES, K[model]),
               dtype="float64", backend="modern_fm-rust_cpu-1thread", timing=None,
               extra={"median_ms": cpu_s * 1e3, "throughput": cpu_rows_s,
                      "throughput_unit": "rows/s", "repeats": 20})
    cuda_rows_s, why_not = None, "modern_fm._backend.has_cuda() is False"
    if mfm.has_cuda():
        try:
            cuda_s = _time_host(lambda: _modern_fm(model, sub, fid_np, w0, w, V_np, R, "cuda"))
            cuda_rows_s = modern_rows / cuda_s
        except RuntimeError as exc:  # e.g. its NVRTC build targets an arch CUDA 13 dropped
            why_not = f"has_cuda() is True but the call failed: {exc}"
    if cuda_rows_s is not None:
        rec.record(f"{model}_modern_fm_cuda", shape=(modern_rows, N_FEATURES, K[model]),
                   dtype="float64", backend="modern_fm-cuda", timing=None,
                   extra={"median_ms": cuda_s * 1e3, "throughput": cuda_rows_s,
                          "throughput_unit": "rows/s"})
    else:
        rec.record(f"{model}_modern_fm_cuda", shape=(0,), dtype="float64",
                   backend="modern_fm-cuda", timing=None, extra={"unavailable": why_not})
    return cpu_rows_s, cuda_rows_s


def bench_model(rec: Recorder, model: str, X: CSR, fid_np, modern_rows: int) -> None:
    """``X`` carries its field-slot table; the "rows" layout drops it."""
    layouts = {"slots": X, "rows": CSR.tree_unflatten(X.tree_flatten()[1],
                                                       (*X.tree_flatten()[0][:-1], None))}
    X = layouts["rows"]
    n = X.shape[0]
    w0, w, V, R = parameters(model)
    dev = [jnp.asarray(a) for a in (w0, w, V, R)]
    fid = jnp.asarray(fid_np)
    args = (X, fid, *dev)
    shape = (n, N_FEATURES, K[model])
    gbytes = _no_reuse_bytes(model, X.nnz, n)

    xla = _xla_reference(model)
    expected = jax.block_until_ready(xla(*args))
    err = check_close(f"{model} pallas vs xla", _kernel_fn(model)(*args), expected,
                      rtol=1e-4, atol=1e-4)

    best = None
    for layout, block_rows, num_warps in SWEEP[model]:
        layout_args = (layouts[layout], *args[1:])
        try:
            fn = _kernel_fn(model, block_rows, num_warps)
            if layout == "slots":
                err_layout = check_close(f"{model} {layout} {block_rows} vs xla",
                                         fn(*layout_args), expected, rtol=1e-4, atol=1e-4)
                err = max(err, err_layout)
            timing = time_fn(fn, [layout_args], repeats=20)
        except Exception:  # one configuration's failure must not lose the others
            traceback.print_exc()
            continue
        rec.record(f"{model}_sweep", shape=shape, dtype="float32", backend="pallas",
                   timing=timing, items=n, item_name="rows",
                   extra={"layout": layout, "block_rows": block_rows, "num_warps": num_warps})
        if best is None or timing.median_ms < best[0].median_ms:
            best = (timing, layout, block_rows, num_warps)
    xla_timing = time_fn(xla, [args], repeats=20)
    rec.record(f"{model}_xla_reference", shape=shape, dtype="float32", backend="xla",
               timing=xla_timing, items=n, item_name="rows", bytes_moved=gbytes)
    public_timing = time_fn(jax.jit(functools.partial(
        _call, model, backend="interpret" if INTERPRET else "pallas")),
        [(layouts[best[1]], *args[1:])], repeats=20)

    cpu_rows_s, cuda_rows_s = _bench_modern_fm(rec, model, X, fid_np, w0, w, V, R, expected,
                                               modern_rows)
    timing, layout, block_rows, num_warps = best
    rows_s = n / (timing.median_ms * 1e-3)
    rec.record(f"{model}_pallas", shape=shape, dtype="float32", backend="pallas", timing=timing,
               items=n, item_name="rows", bytes_moved=gbytes, baseline=f"{model}_xla_reference",
               extra={"layout": layout, "block_rows": block_rows, "num_warps": num_warps,
                      "max_rel_err_vs_xla": err,
                      "public_api_median_ms": public_timing.median_ms,
                      "speedup_vs_xla": xla_timing.median_ms / timing.median_ms,
                      "speedup_vs_modern_fm_cpu": None if cpu_rows_s is None
                      else rows_s / cpu_rows_s,
                      "speedup_vs_modern_fm_cuda": None if cuda_rows_s is None
                      else rows_s / cuda_rows_s,
                      "target_rows_per_s": TARGET_ROWS_PER_S[model],
                      "meets_target": rows_s >= TARGET_ROWS_PER_S[model]})


def run(quick: bool, out=None, n_rows: int = 1_000_000, modern_rows: int = 50_000) -> None:
    rec = Recorder("factorization", out)
    with x64_for(jnp.float32):  # every device case is float32 (see x64_for)
        rec.measure_copy()
        indptr, indices, field_ids = ctr_rows(n_rows)
        X = CSR(np.ones(indices.shape[0], np.float32), indices, indptr, (n_rows, N_FEATURES))
        start = time.perf_counter()
        X = jax.block_until_ready(X.with_field_slots(field_ids))
        rec.record("field_slot_layout_build", shape=(n_rows, N_FIELDS), dtype="int32",
                   backend="host-numpy", timing=None,
                   extra={"seconds": time.perf_counter() - start, "once_per_matrix": True})
        failures = []
        for model in ("fm", "fwfm", "ffm"):
            try:
                bench_model(rec, model, X, field_ids, modern_rows)
            except Exception as exc:  # one model's failure must not hide the others' numbers
                traceback.print_exc()
                failures.append(f"{model}: {type(exc).__name__}: {exc}")
    if failures:
        raise SystemExit("failed: " + "; ".join(failures))


if __name__ == "__main__":
    main_from_args(run, "factorization")
