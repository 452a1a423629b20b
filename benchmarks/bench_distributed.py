"""Scaling of the sharded drivers: one GPU vs 2, 4, ... and all GPUs of the host, in the same run.

Cases (the acceptance shapes of the multi-GPU issue):

* ``fit_em``: n = 4e6 rows, p = 16, k = 256 components, full covariance, float32,
  3 EM iterations (tol = 0, so every variant runs the same iterations), strong
  scaling; ``fit_em_weak``: 1e6 rows a device. Prediction: the per-device E-step
  shrinks with 1/D, the psum is 157 KB and the replicated M-step (k Choleskys of
  16 x 16) is a fixed ~0.1-0.3 ms per iteration.
* ``ppoly_eval``: 2^28 float32 points, a 64-piece cubic (map rows, no communication).
* ``ffm_predict``: FFM scores of 8M one-hot CTR rows (bench_factorization's data:
  24 fields, 1M features, k = 8), CSR row blocks from ``shard_csr``.
* ``border``: B = 400,000 atoms with the single-GPU acceptance distribution
  (n_a uniform in 8..128, d = 2, k_a in 4..12; about 27M rows, 4.8 GB of
  float64 input), float64 and float32. Independent atoms and no communication:
  two GPUs should give close to 2x minus the fixed launch cost of each bucket's
  kernel and the dummy atoms (at most one per (n_a, k_a) type per device). Timed
  with 10 solves issued back to back per repetition (``border``), as in a Newton
  loop that keeps its state on the device, and one solve per repetition
  (``border_single_call``), which adds the launch and synchronisation latency of
  a call (~0.7-1 ms on a 2x H200 host) to every solve.
* ``fm_train``: one FM epoch, logistic loss, AdaGrad, n = 2^19 rows with 32
  nonzeros, p = 2^15 features, k = 32, float32; global batch 8192 (strong scaling:
  the same trajectory), ``fm_train_weak``: 8192 rows per device, and
  ``fm_train_weak_b65536``: 65536 rows per device. Timed through the public
  ``train_epoch`` (host batch tables included) and as the compiled epoch alone
  (``*_compiled``). Measured on 2 H200s: a single-GPU step is ~52 us whether it
  holds 4096 or 8192 rows (launch-bound), and one all-reduce of the 4.3 MB dense
  gradient costs ~45-50 us, so at batch 8192 the 2-GPU step cannot beat one GPU
  (see docs/distributed.md).

"1 GPU" is the single-device public op (``gpustat.mixture.fit_em``,
``gpustat.piecewise.ppoly_eval``, ``gpustat.factorization.ffm_predict``,
``gpustat.border.solve_batched_border``, ``gpustat.estimators._train.train_epoch``);
"D GPUs" is the :mod:`gpustat.distributed` entry point on a mesh of the first D
devices (D = 1, 2, 4, ... and all of the host); the
sharded entry point on a 1-device mesh is timed too (its overhead).
``GPUSTAT_BENCH_SMALL=1`` shrinks every case for a CPU smoke test.
"""

from __future__ import annotations

import dataclasses
import os
import traceback

import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse as sp

from benchmarks.harness import Recorder, check_close, main_from_args, time_fn, x64_for
from gpustat import border, distributed, factorization, mixture, piecewise
from gpustat.csr import CSR
from gpustat.distributed import _fm as distributed_fm
from gpustat.distributed import _fm_table as distributed_fm_table
from gpustat.estimators import _train as fm_train

SMALL = os.environ.get("GPUSTAT_BENCH_SMALL") == "1"
REPEATS = 20
# border solves issued per timed repetition (see the module docstring)
BACK_TO_BACK = 10


def _meshes():
    """{devices: mesh} for 1, 2, 4, ... and all devices of the host."""
    n = len(jax.devices())
    counts = sorted({1 << i for i in range(n.bit_length()) if 1 << i <= n} | {n})
    return {d: distributed.make_mesh(d) for d in counts}


def _record_scaling(rec, case, shape, dtype, timings, items, item_name, extra=None):
    """One JSON line per variant; the D-GPU lines carry speedup_vs_1gpu.

    ``items`` is one count for every variant (strong scaling: speedup = time ratio) or a
    {variant: count} dict (weak scaling: speedup = throughput ratio, items per second);
    ``shape`` likewise one shape or a {variant: shape} dict.
    """
    counts = items if isinstance(items, dict) else dict.fromkeys(timings, items)
    shapes = shape if isinstance(shape, dict) else dict.fromkeys(timings, shape)
    rate1 = counts["1gpu"] / timings["1gpu"].median_ms
    for name, timing in timings.items():
        more = dict(extra or {})
        if name != "1gpu":
            more["speedup_vs_1gpu"] = counts[name] / timing.median_ms / rate1
        rec.record(case, shape=shapes[name], dtype=dtype, backend=name, timing=timing,
                   items=counts[name],
                   item_name=item_name, baseline=None if name == "1gpu" else "1gpu", extra=more)


def _em_data(n: int, p: int, k: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 3, (k, p))
    X = (centres[rng.integers(0, k, n)] + rng.normal(size=(n, p))).astype(np.float32)
    init = mixture.MixtureParams.from_covariances(
        jnp.full((k,), 1.0 / k, jnp.float32), jnp.asarray(centres + rng.normal(0, 0.5, (k, p)),
                                                          jnp.float32),
        jnp.broadcast_to(jnp.eye(p, dtype=jnp.float32), (k, p, p)))
    return X, init


def _em_case(rec, meshes):
    """Strong scaling (the same n on every mesh) and weak scaling (n / D fixed)."""
    n, p, k, iters = (4096, 4, 8, 3) if SMALL else (4_000_000, 16, 256, 3)
    per_device = n // 4
    kw = dict(max_iter=iters, tol=0.0)
    X, init = _em_data(n, p, k)
    single = jax.jit(lambda X: mixture.fit_em(X, init, **kw))
    sharded = jax.jit(lambda X, m: distributed.fit_em(X, init, m, **kw), static_argnums=1)
    strong = {"1gpu": time_fn(single, [(jnp.asarray(X),)], repeats=REPEATS, warmup=1)}
    weak = {"1gpu": time_fn(single, [(jnp.asarray(X[:per_device]),)], repeats=REPEATS,
                            warmup=1)}
    weak_rows = {"1gpu": per_device * iters}
    weak_shapes = {"1gpu": (per_device, p, k)}
    ref = single(jnp.asarray(X))
    for d, m in meshes.items():
        Xs = distributed.shard_rows(jnp.asarray(X), m)
        got = sharded(Xs, m)
        check_close(f"fit_em means {d} devices", got.params.means, ref.params.means, rtol=2e-3,
                    atol=2e-3)
        assert int(got.n_iter) == int(ref.n_iter) == iters
        strong[f"sharded_{d}gpu"] = time_fn(sharded, [(Xs, m)], repeats=REPEATS, warmup=1)
        del Xs
        Xw = distributed.shard_rows(jnp.asarray(np.resize(X, (per_device * d, p))), m)
        weak[f"sharded_{d}gpu"] = time_fn(sharded, [(Xw, m)], repeats=REPEATS, warmup=1)
        weak_rows[f"sharded_{d}gpu"] = per_device * d * iters
        weak_shapes[f"sharded_{d}gpu"] = (per_device * d, p, k)
    _record_scaling(rec, "fit_em", (n, p, k), "float32", strong, n * iters, "row-iterations",
                    {"iterations": iters})
    _record_scaling(rec, "fit_em_weak", weak_shapes, "float32", weak, weak_rows,
                    "row-iterations", {"iterations": iters, "rows_per_device": per_device})


def _border_batch(n_atoms: int, dtype, seed: int = 1) -> border.BorderBatch:
    """Random positive definite atoms, packed directly (vectorised, no per-atom lists)."""
    rng = np.random.default_rng(seed)
    d = 2
    n_rows = rng.integers(1, 9, n_atoms) if SMALL else rng.integers(8, 129, n_atoms)
    k_dims = rng.integers(2, 9, n_atoms) if SMALL else rng.integers(4, 13, n_atoms)
    layout = border.BorderLayout(d, n_rows, k_dims)
    sizes = layout.packed_sizes()
    A = rng.normal(size=(layout.num_rows, d, d))
    H_tt = A @ A.transpose(0, 2, 1) + np.eye(d)
    H_tb = rng.normal(size=sizes["H_tb"]) * 0.05
    g_t = rng.normal(size=sizes["g_t"])
    H_bb = np.concatenate([4.0 * np.eye(k).reshape(-1) for k in k_dims])
    g_b = rng.normal(size=sizes["g_b"])
    return border.BorderBatch.from_packed(layout, *(jnp.asarray(a, dtype) for a in
                                                     (H_tt, H_tb, g_t, H_bb, g_b)))


def _border_case(rec, meshes, dtype):
    n_atoms = 2000 if SMALL else 400_000
    batch = _border_batch(n_atoms, dtype)
    single = jax.jit(lambda b: border.solve_batched_border(b, 1e-3, 1e-3))
    ref = single(batch)
    timings = {"1gpu": time_fn(single, [(batch,)], repeats=REPEATS,
                               calls_per_repeat=BACK_TO_BACK)}
    single_call = {"1gpu": time_fn(single, [(batch,)], repeats=REPEATS, calls_per_repeat=1)}
    rtol = 1e-4 if dtype == jnp.float32 else 1e-10
    for d, mesh in meshes.items():
        sharded = distributed.shard_border_batch(batch, mesh)
        fn = jax.jit(lambda b, m=mesh: distributed.solve_batched_border(b, 1e-3, 1e-3, m))
        got = fn(sharded).gather()
        assert np.array_equal(np.asarray(got.status), np.asarray(ref.status))
        check_close(f"border delta_t {d} devices", got.delta_t, ref.delta_t, rtol=rtol,
                    atol=rtol)
        check_close(f"border log_det {d} devices", got.log_det, ref.log_det, rtol=rtol)
        timings[f"sharded_{d}gpu"] = time_fn(fn, [(sharded,)], repeats=REPEATS,
                                             calls_per_repeat=BACK_TO_BACK)
        single_call[f"sharded_{d}gpu"] = time_fn(fn, [(sharded,)], repeats=REPEATS,
                                                 calls_per_repeat=1)
        slots = sharded.plan.local.num_atoms
    for case, timed in (("border", timings), ("border_single_call", single_call)):
        _record_scaling(rec, case, (n_atoms, 2), jnp.dtype(dtype).name, timed, n_atoms,
                        "atoms", {"slots_per_device": slots})


def _adagrad(model):
    return fm_train.make_optimizer(
        "adagrad", model=model, learning_rate=0.05, beta_1=0.9, beta_2=0.999, epsilon=1e-8,
        ftrl_beta=1.0, l1_linear=0.0, l1_factors=0.0, l2_linear=1e-5, l2_factors=1e-5)


def _fm_rows(n: int, p: int, z: int, rng):
    """n one-field FM rows of up to z distinct ones among p features, random labels:
    (CSR X, (n, 1) y, unit weights, (p,) zero field ids)."""
    cols = np.sort(rng.choice(p, size=(n, z)), axis=1)
    X = sp.csr_matrix((np.ones(n * z, np.float32), cols.reshape(-1), np.arange(n + 1) * z),
                      shape=(n, p))
    X.sum_duplicates()
    X.data[:] = 1.0
    y = rng.integers(0, 2, n).astype(np.float32)[:, None]
    return X, y, np.ones(n, np.float32), np.zeros(p, np.int32)


def _fm_case(rec, meshes):
    n, p, z, k, bsz = (4096, 512, 8, 8, 256) if SMALL else (1 << 19, 1 << 15, 32, 32, 8192)
    rng = np.random.default_rng(2)
    X, y, weight, fields = _fm_rows(n, p, z, rng)
    tx, lazy, (l2w, l2v) = _adagrad("fm")
    backend = fm_train.scatter_backend("auto")

    def config(batch):
        return fm_train.TrainConfig("fm", "logistic", p, 1, batch, tx, lazy, l2w, l2v, backend)

    params = {"w0": jnp.zeros(1, jnp.float32), "w": jnp.zeros((p, 1), jnp.float32),
              "V": jnp.asarray(rng.normal(0, 0.01, (p, 1, k)), jnp.float32)}
    opt_state = tx.init(params)
    rows = fm_train.to_device_rows(X, fields, y, weight, np.float32)
    # strong scaling: global batch bsz on every mesh (the same optimisation trajectory);
    # weak scaling: bsz rows per device (global batch D * bsz, fewer steps per epoch),
    # and 8 bsz rows per device, where the step's row work outweighs its fixed costs
    for case, batch, per_device in (("fm_train", bsz, False), ("fm_train_weak", bsz, True),
                                    (f"fm_train_weak_b{8 * bsz}", 8 * bsz, True)):
        public, compiled = {}, {}
        for d, mesh in sorted(meshes.items()):
            cfg = config(batch * d if per_device else batch)
            data = distributed.shard_training_rows(X, fields, y, weight, np.float32, mesh)
            orders = [rng.permutation(data.block_rows(g).size) for g in range(d)]
            # the single-device epoch over the same global batches
            order = distributed.global_order(data, orders, cfg.batch_size)
            ref = fm_train.train_epoch(cfg, params, opt_state, rows, order)
            got = distributed.train_epoch(cfg, params, opt_state, data, orders, mesh)
            check_close(f"{case} V {d} devices", got[0]["V"], ref[0]["V"], rtol=1e-3, atol=1e-5)
            check_close(f"{case} loss {d} devices", got[2], ref[2], rtol=1e-4)
            if d == 1:
                public["1gpu"] = time_fn(
                    lambda cfg=cfg, order=order: fm_train.train_epoch(cfg, params, opt_state,
                                                                      rows, order),
                    [()], repeats=REPEATS)
            public[f"sharded_{d}gpu"] = time_fn(
                lambda cfg=cfg, data=data, orders=orders, mesh=mesh: distributed.train_epoch(
                    cfg, params, opt_state, data, orders, mesh), [()], repeats=REPEATS)
            table, counts = distributed_fm._epoch_tables(data, orders, cfg.batch_size, mesh)
            compiled["1gpu" if d == 1 else f"sharded_{d}gpu"] = time_fn(
                lambda cfg=cfg, mesh=mesh, data=data, table=table, counts=counts:
                distributed_fm._epoch(cfg, mesh, params, opt_state, data.rows, table, counts),
                [()], repeats=REPEATS)
        shape = (n, p, z, k, batch)
        extra = {"batch_per_device" if per_device else "global_batch": batch,
                 "scatter_backend": backend}
        _record_scaling(rec, case, shape, "float32", public, n, "rows",
                        {**extra, "timing": "public train_epoch, host batch tables included"})
        _record_scaling(rec, f"{case}_compiled", shape, "float32", compiled, n, "rows",
                        {**extra, "timing": "compiled epoch, batch tables prebuilt"})


def _ppoly_case(rec, meshes):
    """Piecewise evaluation, float32, strong scaling (map rows, no communication)."""
    n = (1 << 14) if SMALL else (1 << 28)
    pp = piecewise.activation("tanh", num_pieces=64, dtype=jnp.float32)
    x = jax.random.uniform(jax.random.key(3), (n,), jnp.float32, -4.0, 4.0)
    single = jax.jit(lambda x: piecewise.ppoly_eval(pp, x))
    ref = single(x)
    timings = {"1gpu": time_fn(single, [(x,)], repeats=REPEATS)}
    sharded = jax.jit(lambda x, m: distributed.ppoly_eval(pp, x, m), static_argnums=1)
    max_diff = {}
    for d, m in meshes.items():
        xs = distributed.shard_rows(x, m)
        got = sharded(xs, m)
        check_close(f"ppoly_eval {d} devices", got, ref, rtol=1e-6, atol=1e-6)
        max_diff[f"sharded_{d}gpu"] = float(jnp.max(jnp.abs(got - ref)))
        timings[f"sharded_{d}gpu"] = time_fn(sharded, [(xs, m)], repeats=REPEATS)
        del xs, got
    _record_scaling(rec, "ppoly_eval", (n,), "float32", timings, n, "points",
                    {"max_abs_diff_vs_1gpu": max_diff})


def _ffm_scoring_case(rec, meshes):
    """FFM scores of one-hot CTR rows (bench_factorization's data), strong scaling."""
    from benchmarks import bench_factorization as bf

    n = 4096 if SMALL else 8_000_000
    indptr, indices, field_ids = bf.ctr_rows(n)
    X = sp.csr_array((np.ones(indices.size, np.float32), indices, indptr),
                     shape=(n, bf.N_FEATURES))
    w0, w, V, _ = bf.parameters("ffm")
    fid, w, V = jnp.asarray(field_ids), jnp.asarray(w), jnp.asarray(V)
    Xd = CSR(X.data, X.indices, X.indptr, X.shape)
    single = jax.jit(lambda X: factorization.ffm_predict(X, fid, w0, w, V))
    ref = np.asarray(single(Xd))
    timings = {"1gpu": time_fn(single, [(Xd,)], repeats=REPEATS)}
    sharded = jax.jit(lambda X, m: distributed.ffm_predict(X, fid, w0, w, V, m),
                      static_argnums=1)
    for d, m in meshes.items():
        Xs = distributed.shard_csr(X, m)
        check_close(f"ffm_predict {d} devices", sharded(Xs, m), ref, rtol=1e-5, atol=1e-5)
        timings[f"sharded_{d}gpu"] = time_fn(sharded, [(Xs, m)], repeats=REPEATS)
        del Xs
    _record_scaling(rec, "ffm_predict", (n, bf.N_FEATURES, bf.K["ffm"]), "float32", timings, n,
                    "rows", {"fields": bf.N_FIELDS})


def _timed_table_epoch(cfg, mesh, capacity, params, opt_state, data, orders):
    """A callable running one compiled model-parallel epoch on the table it last returned
    (the table is donated: each call continues training), the batch tables prebuilt."""
    table, counts = distributed_fm._epoch_tables(data, orders, cfg.batch_size, mesh)
    state = [params, opt_state]

    def run():
        state[0], state[1], loss, _ = distributed_fm_table._table_epoch(
            cfg, mesh, capacity, state[0], state[1], data.rows, table, counts)
        return loss

    return run


def _fm_sparse_case(rec):
    """FM training with touched-row updates at 65,536 rows a device (weak scaling).

    One FM epoch (logistic loss, AdaGrad, n = 2^20 rows of 32 nonzeros, p = 2^15, k = 32,
    float32) on one GPU (``gpustat.estimators._train.train_epoch``, batch 65,536) and on
    the first D devices (D = 2, all) at 65,536 rows a device (global batch D x 65,536):
    ``rows_*``: replicated table, touched rows all-gathered (``exchange="rows"``;
    ``fm_train_weak_b65536`` times the dense all-reduce at this shape); ``table_*``: the
    model-parallel table (``train_epoch_model_parallel``, compiled epoch with a planned
    capacity, table donated). Every variant is checked against the single-device epoch
    over ``global_order`` first.
    """
    per, z, k, p, n = (256, 8, 8, 1 << 12, 1 << 12) if SMALL else (65536, 32, 32, 1 << 15,
                                                                    1 << 20)
    rng = np.random.default_rng(4)
    X, y, weight, fields = _fm_rows(n, p, z, rng)
    tx, lazy, (l2w, l2v) = _adagrad("fm")
    backend = fm_train.scatter_backend("auto")
    with x64_for(jnp.float32):
        params = {"w0": jnp.zeros(1, jnp.float32), "w": jnp.zeros((p, 1), jnp.float32),
                  "V": jnp.asarray(rng.normal(0, 0.01, (p, 1, k)), jnp.float32)}
        opt_state = tx.init(params)
        rows = fm_train.to_device_rows(X, fields, y, weight, np.float32)
        timings, extra = {}, {"batch_per_device": per, "scatter_backend": backend}
        for d, mesh in _meshes().items():
            cfg = fm_train.TrainConfig("fm", "logistic", p, 1, per * d, tx, lazy, l2w, l2v,
                                       backend)
            if d == 1:
                order = rng.permutation(n)
                timings["1gpu"] = time_fn(lambda cfg=cfg, order=order: fm_train.train_epoch(
                    cfg, params, opt_state, rows, order), [()], repeats=REPEATS)
                continue
            data = distributed.shard_training_rows(X, fields, y, weight, np.float32, mesh)
            orders = [rng.permutation(data.block_rows(g).size) for g in range(d)]
            order = distributed.global_order(data, orders, cfg.batch_size)
            ref = fm_train.train_epoch(cfg, params, opt_state, rows, order)
            got = distributed.train_epoch(cfg, params, opt_state, data, orders, mesh,
                                          exchange="rows")
            check_close(f"fm sparse rows V {d} devices", got[0]["V"], ref[0]["V"], rtol=1e-3,
                        atol=1e-5)
            check_close(f"fm sparse rows loss {d} devices", got[2], ref[2], rtol=1e-4)
            timings[f"rows_{d}gpu"] = time_fn(
                lambda cfg=cfg, data=data, orders=orders, mesh=mesh: distributed.train_epoch(
                    cfg, params, opt_state, data, orders, mesh, exchange="rows"), [()],
                repeats=REPEATS)
            table, state = distributed.shard_fm_table(params, opt_state, mesh)
            capacity = distributed.plan_capacity(data, orders, cfg.batch_size,
                                                 table["w"].shape[0], mesh)
            extra[f"capacity_{d}gpu"] = capacity
            got = distributed.train_epoch_model_parallel(cfg, table, state, data, orders, mesh,
                                                         capacity=capacity)
            check_close(f"fm table V {d} devices", got[0]["V"][:p], ref[0]["V"], rtol=1e-3,
                        atol=1e-5)
            timings[f"table_{d}gpu"] = time_fn(
                _timed_table_epoch(cfg, mesh, capacity, got[0], got[1], data, orders), [()],
                repeats=REPEATS)
    _record_scaling(rec, f"fm_sparse_weak_b{per}", (n, p, z, k, per), "float32", timings, n,
                    "rows", {**extra, "timing": "public train_epoch (host batch tables "
                             "included); table_*: compiled epoch, planned capacity"})


def _memory_limit():
    """Bytes one device may allocate (``bytes_limit``), or None where JAX does not say."""
    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("bytes_limit")


def _hashed_ffm_rows(n, p, n_fields, rng):
    """n rows with one feature per field, hashed: field f holds the ids f + F j, j uniform."""
    j = rng.integers(0, p // n_fields, size=(n, n_fields))
    cols = np.sort((j * n_fields + np.arange(n_fields)).astype(np.int32), axis=1)
    X = sp.csr_matrix((np.ones(n * n_fields, np.float32), cols.reshape(-1),
                       np.arange(n + 1) * n_fields), shape=(n, p))
    return X, rng.integers(0, 2, n).astype(np.float32)[:, None]


def _table_rows(leaf, ids):
    """Rows ``ids`` (sorted) of a row-sharded table leaf, read shard by shard on the host."""
    out = np.zeros((len(ids), *leaf.shape[1:]), leaf.dtype)
    for shard in leaf.addressable_shards:
        lo, hi = shard.index[0].start or 0, shard.index[0].stop or leaf.shape[0]
        sel = (ids >= lo) & (ids < hi)
        out[sel] = np.asarray(shard.data[jnp.asarray(ids[sel] - lo)])
    return out


def _compact(tree, ids):
    """The rows ``ids`` of a sharded parameter-shaped dict, on the host (w0, r whole)."""
    return {name: _table_rows(leaf, ids) if name in ("w", "V") else np.asarray(leaf)
            for name, leaf in tree.items()}


def _fm_table_case(rec):
    """The model-parallel FFM table: larger than one GPU's memory, on 2 and all GPUs.

    FFM, F = 8 fields (one hashed feature each), AdaGrad, float32, 32,768 rows a
    device a step (2 steps an epoch). The big table has p = 2^27 rows and k chosen so
    that parameters + AdaGrad state are ~1.65x one device's ``bytes_limit`` (run with
    ``XLA_PYTHON_CLIENT_MEM_FRACTION=0.95``: then over 1.5x the device's whole memory;
    ``table_bytes`` in the JSON); it runs on D devices where its share leaves 15% of
    each device free, else it is recorded as skipped. The baseline is a table of
    p = 2^25 rows (same F, k) trained on one GPU by the single-device epoch (table
    donated). ``rows_per_s_per_gpu_ratio`` = big-table rows/s per GPU over the baseline's.
    Check: the big table's epoch equals the single-device epoch (on the host CPU) of the
    table compacted to the rows the epoch touches.
    """
    n_fields, steps = 8, 2
    if SMALL:
        limit, per, p_big, p_fit = 8 << 20, 256, 1 << 16, 1 << 13
    else:
        limit, per, p_big, p_fit = _memory_limit(), 32768, 1 << 27, 1 << 25
    meshes = _meshes()
    shape_note = {"fields": n_fields, "batch_per_device": per, "steps": steps}
    if limit is None:
        rec.record("fm_table", shape=(p_big,), dtype="float32", backend="skipped", timing=None,
                   extra={**shape_note, "skipped": "the device reports no bytes_limit"})
        return
    # parameters + AdaGrad state: 2 x 4 bytes x (w: 1 + V: F k) a row
    k = max(int((1.65 * limit / (8 * p_big) - 1) // n_fields), 1)
    row_bytes = 8 * (1 + n_fields * k)
    table_bytes = p_big * row_bytes
    tx, lazy, (l2w, l2v) = _adagrad("ffm")
    backend = fm_train.scatter_backend("auto")
    rng = np.random.default_rng(5)
    common = {**shape_note, "k": k, "table_bytes": table_bytes, "bytes_limit": limit,
              "table_over_limit": table_bytes / limit, "scatter_backend": backend}
    with x64_for(jnp.float32):
        # the baseline: a table that fits, one GPU, the single-device epoch
        n1 = per * steps
        X, y = _hashed_ffm_rows(n1, p_fit, n_fields, rng)
        fields = np.arange(p_fit, dtype=np.int32) % n_fields
        rows = fm_train.to_device_rows(X, fields, y, np.ones(n1, np.float32), np.float32)
        cfg = fm_train.TrainConfig("ffm", "logistic", p_fit, n_fields, per, tx, lazy, l2w, l2v,
                                   backend)
        fit = list(distributed.init_fm_table("ffm", p_fit, k, tx, meshes[1],
                                             key=jax.random.key(0), n_fields=n_fields))
        order = rng.permutation(n1)

        def single():
            fit[0], fit[1], loss = fm_train.train_epoch(cfg, fit[0], fit[1], rows, order,
                                                        donate=True)
            return loss

        base = time_fn(single, [()], repeats=REPEATS)
        base_rate = n1 / (base.median_ms * 1e-3)
        rec.record("fm_table", shape=(n1, p_fit, n_fields, k), dtype="float32",
                   backend="fit_1gpu", timing=base, items=n1, item_name="rows",
                   extra={**common, "table_bytes": p_fit * row_bytes,
                          "rows_per_s_per_gpu": base_rate})
        fit.clear()  # free the baseline table before the big ones
        for d, mesh in meshes.items():
            if table_bytes / d > 0.85 * limit:
                rec.record("fm_table", shape=(p_big,), dtype="float32", backend=f"big_{d}gpu",
                           timing=None, extra={**common, "skipped": (
                               f"{table_bytes / d / 2**20:.0f} MiB a device > 85% of "
                               f"bytes_limit {limit / 2**20:.0f} MiB")})
                continue
            n = per * d * steps
            X, y = _hashed_ffm_rows(n, p_big, n_fields, rng)
            weight = np.ones(n, np.float32)
            data = distributed.shard_training_rows(
                X, np.arange(p_big, dtype=np.int32) % n_fields, y, weight, np.float32, mesh)
            orders = [rng.permutation(data.block_rows(g).size) for g in range(d)]
            cfg = fm_train.TrainConfig("ffm", "logistic", p_big, n_fields, per * d, tx, lazy,
                                       l2w, l2v, backend)
            params, state = distributed.init_fm_table("ffm", p_big, k, tx, mesh,
                                                      key=jax.random.key(d),
                                                      n_fields=n_fields)
            ids = np.unique(X.indices)
            before = (_compact(params, ids), type(state)(*(_compact(f, ids) for f in state)))
            capacity = distributed.plan_capacity(data, orders, cfg.batch_size, p_big, mesh)
            params, state, loss = distributed.train_epoch_model_parallel(
                cfg, params, state, data, orders, mesh, capacity=capacity)
            _check_compact(cfg, X, y, weight, ids, before, (params, state, loss),
                           distributed.global_order(data, orders, cfg.batch_size), d)
            timing = time_fn(_timed_table_epoch(cfg, mesh, capacity, params, state, data,
                                                orders), [()], repeats=REPEATS)
            del params, state
            rate = n / (timing.median_ms * 1e-3) / d
            rec.record("fm_table", shape=(n, p_big, n_fields, k), dtype="float32",
                       backend=f"big_{d}gpu", timing=timing, items=n, item_name="rows",
                       baseline="fit_1gpu",
                       extra={**common, "capacity": capacity, "rows_per_s_per_gpu": rate,
                              "rows_per_s_per_gpu_ratio": rate / base_rate})


def _check_compact(cfg, X, y, weight, ids, before, after, order, d):
    """The sharded epoch's touched rows equal the single-device epoch, on the host CPU,
    of the table compacted to ``ids`` (every feature the epoch reads)."""
    cpu = jax.devices("cpu")[0]
    params, state, loss = after
    Xc = sp.csr_matrix((X.data, np.searchsorted(ids, X.indices), X.indptr),
                       shape=(X.shape[0], len(ids)))
    with jax.default_device(cpu):
        rows = fm_train.to_device_rows(Xc, (ids % cfg.n_fields).astype(np.int32), y, weight,
                                       np.float32)
        ccfg = dataclasses.replace(cfg, n_features=len(ids), backend="reference")
        ref = fm_train.train_epoch(ccfg, *jax.device_put(before, cpu), rows, order)
    got = _compact(params, ids)
    for name in ("w", "V"):
        check_close(f"fm_table {name} {d} devices", got[name], ref[0][name], rtol=1e-3,
                    atol=1e-5)
    check_close(f"fm_table AdaGrad state {d} devices", _compact(state.sum_sq, ids)["V"],
                ref[1].sum_sq["V"], rtol=1e-3, atol=1e-7)
    check_close(f"fm_table loss {d} devices", loss, ref[2], rtol=1e-4)


def run(quick: bool, out=None) -> None:
    rec = Recorder("distributed", out)
    meshes = _meshes()
    print(f"[distributed] devices: {jax.devices()}", flush=True)
    # cheapest first; fit_em last
    cases = [("ppoly_eval", lambda: _ppoly_case(rec, meshes)),
             ("border float64", lambda: _border_case(rec, meshes, jnp.float64)),
             ("ffm_predict", lambda: _ffm_scoring_case(rec, meshes)),
             ("fm_train", lambda: _fm_case(rec, meshes)),
             ("fit_em", lambda: _em_case(rec, meshes)),
             ("fm_sparse", lambda: _fm_sparse_case(rec)),
             ("fm_table", lambda: _fm_table_case(rec))]
    if not quick:
        cases.append(("border float32", lambda: _border_case(rec, meshes, jnp.float32)))
    only = os.environ.get("GPUSTAT_BENCH_CASES")  # e.g. "fit_em,fm_table": a subset
    if only:
        cases = [(name, case) for name, case in cases if name in only.split(",")]
    failed = []
    for name, case in cases:  # one failing case must not hide the others' numbers
        try:
            case()
        except Exception:
            traceback.print_exc()
            failed.append(name)
    if failed:
        raise SystemExit(f"[distributed] failed cases: {failed}")


if __name__ == "__main__":
    main_from_args(run, "distributed")
