"""Sharded-vs-unsharded checks, run in a subprocess that sees 4 CPU devices.

``python -m tests.oracles.distributed_checks [names...]`` sets
``XLA_FLAGS=--xla_force_host_platform_device_count=4`` before JAX starts (the
main pytest process has already initialised JAX with one device), runs each
``check_*`` function and prints one JSON line per check: name, ok, the measured
errors, or the traceback. ``tests/test_distributed.py`` asserts on those lines.

Every check compares the sharded entry point of :mod:`gpustat.distributed`
(4 devices, ragged row counts so padding is exercised) with the single-device
op on the same data, and where cheap with an independent numpy computation.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
import traceback

N_DEVICES = 4
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + f" --xla_force_host_platform_device_count={N_DEVICES}")
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import scipy.sparse as sp  # noqa: E402

jax.config.update("jax_enable_x64", True)

#: backends of the per-capability checks; ``GPUSTAT_DISTRIBUTED_INTERPRET=1`` adds the
#: Pallas kernels in interpret mode (slow on CPU: the slow-marked test runs them)
BACKENDS = ("reference", "interpret") if os.environ.get("GPUSTAT_DISTRIBUTED_INTERPRET") == "1" \
    else ("reference",)

from jax.sharding import PartitionSpec  # noqa: E402

from gpustat import bms, border, distributed, factorization, mixture  # noqa: E402
from gpustat.distributed._mesh import psum_packed  # noqa: E402
from gpustat.estimators import _train as fm_train  # noqa: E402
from gpustat.piecewise import PiecewisePolynomial, ppoly_eval  # noqa: E402


def _err(a, b) -> float:
    return max(float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64)),
                            initial=0.0))
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


def _spec(x):
    return x.sharding.spec if hasattr(x.sharding, "spec") else None


def _raises(fn, exc, text) -> bool:
    try:
        fn()
    except exc as e:
        assert text in str(e), f"message {e!r} lacks {text!r}"
        return True
    raise AssertionError(f"{fn} did not raise {exc.__name__}")


def check_mesh():
    mesh = distributed.make_mesh()
    assert distributed.mesh_size(mesh) == N_DEVICES
    x = distributed.shard_rows(jnp.arange(10.0), mesh)
    assert x.shape == (12,) and _spec(x) == PartitionSpec("rows"), (x.shape, _spec(x))
    assert float(x[10]) == 0.0 and len(x.addressable_shards) == N_DEVICES
    r = distributed.replicate(jnp.ones(3), mesh)
    assert _spec(r) == PartitionSpec()
    _raises(lambda: distributed.make_mesh(0), ValueError, "n_devices")
    _raises(lambda: distributed.make_mesh(1.5), ValueError, "n_devices")  # was truncated
    _raises(lambda: distributed.make_mesh(N_DEVICES + 1), ValueError, "n_devices")
    _raises(lambda: distributed.make_mesh(axis_name=1), TypeError, "axis_name")
    _raises(lambda: distributed.shard_rows((jnp.ones(3), jnp.ones(4)), mesh), ValueError,
            "leading")
    _raises(lambda: distributed.ppoly_eval(None, jnp.ones(3), "mesh"), TypeError, "mesh")
    # psum_packed: one collective for a mixed-dtype pytree equals a psum per leaf
    tree = {"f": jnp.arange(2.0 * N_DEVICES * 3).reshape(N_DEVICES, 2, 3),
            "i": jnp.arange(N_DEVICES * 4, dtype=jnp.int32).reshape(N_DEVICES, 4),
            "b": (jnp.arange(N_DEVICES * 5) % 3 == 0).reshape(N_DEVICES, 5)}

    def both(block):
        block = jax.tree.map(lambda a: a[0], block)
        ref = jax.lax.psum(jax.tree.map(lambda a: a.astype(jnp.int32) if a.dtype == bool else a,
                                        block), "rows")
        return jax.tree.map(lambda a: a[None], (psum_packed(block, "rows"), ref))

    packed, ref = jax.shard_map(both, mesh=mesh, in_specs=PartitionSpec("rows"),
                                out_specs=PartitionSpec("rows"), check_vma=False)(tree)
    assert packed["f"].dtype == tree["f"].dtype and packed["i"].dtype == jnp.int32
    assert np.array_equal(packed["f"], ref["f"]) and np.array_equal(packed["i"], ref["i"])
    assert np.array_equal(packed["b"], ref["b"] > 0)
    return {"padded_rows": int(x.shape[0])}


def _poly():
    rng = np.random.default_rng(0)
    return PiecewisePolynomial(np.linspace(-2, 2, 9), rng.normal(size=(4, 8)))


def check_ppoly_eval():
    mesh = distributed.make_mesh()
    pp = _poly()
    errs = {}
    for n in (1, 37, 40):
        x = jnp.linspace(-3, 3, n)
        expected = ppoly_eval(pp, x, backend="reference")
        # the kernel inside shard_map, always (one ragged size)
        for backend in ("reference", "interpret") if n == 37 else BACKENDS:
            got = jax.jit(lambda p, x, b=backend: distributed.ppoly_eval(p, x, mesh, backend=b))(
                pp, x)
            errs[f"n{n}_{backend}"] = _err(got, expected)
        if n == 40:
            assert _spec(got) == PartitionSpec("rows"), _spec(got)
    # vmap over a batch of polynomials' evaluation points (2, n): vmapped shard_map
    xs = jnp.stack([jnp.linspace(-1, 1, 8), jnp.linspace(0, 2, 8)])
    got = jax.vmap(lambda x: distributed.ppoly_eval(pp, x, mesh, backend="reference"))(xs)
    errs["vmap"] = _err(got, ppoly_eval(pp, xs, backend="reference"))
    _raises(lambda: distributed.ppoly_eval(pp, jnp.float64(1.0), mesh), ValueError, "x.shape")
    assert max(errs.values()) < 1e-13, errs
    return errs


def _fm_case():
    rng = np.random.default_rng(1)
    X = sp.random(23, 10, density=0.3, random_state=2, format="csr")
    X.data[X.indptr[3]:X.indptr[4]] = 0  # an empty row
    X.eliminate_zeros()
    fields = np.arange(10) % 3
    return X, fields, 0.3, rng.normal(size=10), rng.normal(size=(10, 4)), \
        rng.normal(size=(10, 3, 4)), rng.normal(size=(3, 3))


def check_factorization():
    mesh = distributed.make_mesh()
    X, fields, w0, w, V, Vf, R = _fm_case()
    Xs = distributed.shard_csr(X, mesh)
    errs = {}
    dense = X.toarray()
    for backend in BACKENDS:
        got = distributed.fm_predict(Xs, w0, w, V, mesh, backend=backend)
        errs[f"fm_{backend}"] = _err(got, factorization.fm_predict(X, w0, w, V,
                                                                  backend="reference"))
    # numpy oracle: the FM formula summed pair by pair
    pair = np.einsum("ni,nj,ik,jk->n", dense, dense, V, V) - np.einsum("ni,ik->n", dense**2,
                                                                      V**2)
    errs["fm_numpy"] = _err(got, w0 + dense @ w + 0.5 * pair)
    got = jax.jit(lambda Xs: distributed.ffm_predict(Xs, fields, w0, w, Vf, mesh,
                                                     backend="reference"))(Xs)
    errs["ffm"] = _err(got, factorization.ffm_predict(X, fields, w0, w, Vf, backend="reference"))
    got = distributed.fwfm_predict(X, fields, w0, w, V, R, mesh, backend="reference")
    errs["fwfm_scipy_input"] = _err(got, factorization.fwfm_predict(X, fields, w0, w, V, R,
                                                                    backend="reference"))
    got = distributed.fm_predict(jnp.asarray(dense), w0, w, V, mesh, backend="reference")
    errs["fm_dense"] = _err(got, factorization.fm_predict(dense, w0, w, V, backend="reference"))
    _raises(lambda: distributed.shard_csr(dense.tolist(), mesh), TypeError, "X must be")
    _raises(lambda: distributed.fm_predict(Xs, w0, w, V, distributed.make_mesh(2)), ValueError,
            "X was sharded for 4 devices, the mesh has 2")
    assert max(errs.values()) < 1e-12, errs
    return errs


def _mixture_case(n=37, p=3):
    rng = np.random.default_rng(3)
    X = np.concatenate([rng.normal(size=(n // 2, p)), rng.normal(size=(n - n // 2, p)) + 2.5])
    params = mixture.MixtureParams.from_covariances(
        jnp.array([0.4, 0.6]), jnp.array([[0.5] * p, [1.5] * p]), jnp.stack([jnp.eye(p)] * 2))
    return jnp.asarray(X), params, rng.uniform(0.5, 2.0, n)


def check_suff_stats():
    mesh = distributed.make_mesh()
    X, params, w = _mixture_case()
    errs = {}
    for backend in BACKENDS:
        got = distributed.suff_stats(X, params, mesh, w, backend=backend)
        errs[backend] = _err(got, mixture.suff_stats(X, params, w, backend="reference"))
    # numpy oracle of the counts: sum_i w_i r_ij
    r = np.asarray(mixture.responsibilities(X, params, backend="reference"))
    errs["counts_numpy"] = _err(got.counts, (w[:, None] * r).sum(0))
    # vmap over two parameter sets (e.g. restarts): a batched shard_map
    shifted = dataclasses.replace(params, means=params.means + 0.3)
    both = jax.tree.map(lambda a, b: jnp.stack([a, b]), params, shifted)
    got = jax.vmap(lambda prm: distributed.suff_stats(X, prm, mesh, w, backend="reference"))(both)
    expected = [mixture.suff_stats(X, prm, w, backend="reference") for prm in (params, shifted)]
    errs["vmap"] = _err(got, jax.tree.map(lambda a, b: jnp.stack([a, b]), *expected))
    assert max(errs.values()) < 1e-11, errs
    return errs


def check_fit_em():
    mesh = distributed.make_mesh()
    X, params, w = _mixture_case(n=61)
    got = jax.jit(lambda X: distributed.fit_em(X, params, mesh, sample_weight=w, max_iter=8,
                                               tol=1e-10, backend="reference"))(X)
    ref = mixture.fit_em(X, params, sample_weight=w, max_iter=8, tol=1e-10, backend="reference")
    assert int(got.n_iter) == int(ref.n_iter) and int(got.status) == int(ref.status)
    errs = {"params": _err(got.params, ref.params),
            "lower_bounds": _err(jnp.nan_to_num(got.lower_bounds), jnp.nan_to_num(ref.lower_bounds))}
    # two restarts batched by vmap inside shard_map, vs the single-device restarts
    shifted = dataclasses.replace(params, means=params.means[::-1])
    starts = jax.tree.map(lambda a, b: jnp.stack([a, b]), params, shifted)
    best = distributed.fit_em(X, starts, mesh, max_iter=5, backend="reference")
    best_ref = mixture.fit_em(X, starts, max_iter=5, backend="reference")
    errs["restarts"] = _err((best.params, best.restart_lower_bounds),
                            (best_ref.params, best_ref.restart_lower_bounds))
    _raises(lambda: distributed.fit_em(X, jax.tree.map(lambda a: a[None, None], params), mesh),
            ValueError, "init.weights")
    assert max(errs.values()) < 1e-10, errs
    return {**errs, "n_iter": int(got.n_iter)}


def check_fit_gibbs():
    """A sweep sharded vs the same draws composed from the single-device public ops."""
    mesh = distributed.make_mesh()
    X, params, _ = _mixture_case(n=40)
    key = jax.random.key(7)
    got = distributed.fit_gibbs(key, X, params, mesh, n_sweeps=1, sample_alpha=False,
                                backend="reference")
    shift = X.mean(0)
    Xc = X - shift
    weak = mixture.NIWPrior.weak(X)
    prior = dataclasses.replace(weak, mean=weak.mean - shift)
    sticks = mixture.StickBreakingPrior(jnp.asarray(1.0))
    state = mixture.GibbsState(dataclasses.replace(params, means=params.means - shift),
                               jnp.zeros(2), jnp.asarray(1.0))
    blocks = np.split(np.asarray(Xc), N_DEVICES)
    logliks = []
    for sweep_key in jax.random.split(key, 1):
        k_z, k_niw, k_v = jax.random.split(sweep_key, 3)
        stats, loglik = None, 0.0
        for g, xb in enumerate(blocks):
            labels, lp = mixture.sample_labels(jax.random.fold_in(k_z, g), xb, state.params,
                                               backend="reference", return_log_prob=True)
            s = mixture.suff_stats_from_labels(xb, labels, 2, backend="reference")
            stats = s if stats is None else stats + s
            loglik += float(jnp.sum(lp))
        drawn = mixture.sample_niw_posterior(k_niw, prior, stats)
        v, weights, alpha = mixture.sample_sticks(k_v, stats.counts, sticks, state.alpha,
                                                   sample_alpha=False)
        state = mixture.GibbsState(dataclasses.replace(drawn, weights=weights), v, alpha)
        logliks.append(loglik)
    errs = {"loglik": _err(got.loglik[0], np.array(logliks)),
            "means": _err(got.state.params.means[0], state.params.means + shift),
            "weights": _err(got.state.params.weights[0], state.params.weights)}
    assert max(errs.values()) < 1e-9, errs
    return errs


def check_bms_joint():
    mesh = distributed.make_mesh()
    rng = np.random.default_rng(4)
    n, r, pm, pg = 27, 4, 3, 2
    A = rng.normal(size=(n, r, r))
    hess = A @ A.transpose(0, 2, 1)
    x, g = rng.normal(size=(n, pm)), rng.normal(size=(n, pg))
    p_total = pm + pg + r - 2
    v = rng.normal(size=(2, p_total))
    errs = {}
    for backend in BACKENDS:
        errs[f"hvp_{backend}"] = _err(distributed.joint_hvp(hess, x, g, v, mesh, backend=backend),
                                      bms.joint_hvp(hess, x, g, v, backend="reference"))
    errs["diagonal"] = _err(distributed.joint_diagonal(hess, x, g, mesh, backend="reference"),
                            bms.joint_diagonal(hess, x, g, backend="reference"))
    dense = distributed.joint_dense(hess, x, g, mesh, backend="reference")
    errs["dense"] = _err(dense, bms.joint_dense(hess, x, g, backend="reference"))
    # numpy oracle: assemble J_i^T H_i J_i row by row
    J = np.zeros((n, r, p_total))
    J[:, 0, :pm] = x
    J[:, 1, pm:pm + pg] = g
    J[:, 2:, pm + pg:] = np.eye(r - 2)
    errs["dense_numpy"] = _err(dense, np.einsum("nap,nab,nbq->pq", J, hess, J))
    derivs = bms.RowDerivatives(rng.normal(size=n), rng.normal(size=(n, r)), hess,
                                np.zeros(n, np.int32))
    errs["gradient"] = _err(distributed.joint_gradient(derivs, x, g, mesh, backend="reference"),
                            bms.joint_gradient(derivs, x, g, backend="reference"))
    assert max(errs.values()) < 1e-11, errs
    return errs


def check_bms_rows():
    mesh = distributed.make_mesh()
    rng = np.random.default_rng(5)
    n = 9
    rows = bms.build_rows(rng.normal(0, 0.5, n), rng.uniform(0.3, 1.0, n), None, None, None,
                          None, rng.normal(size=n), rng.integers(0, 2, n).astype(float),
                          np.ones(n), backend="reference")
    sharded = distributed.shard_bms_rows(rows, mesh)
    got = distributed.row_derivatives(sharded, mesh, backend="reference")
    ref = bms.row_derivatives(rows, backend="reference")
    assert np.array_equal(np.asarray(got.status), np.asarray(ref.status))
    errs = {"derivs": _err(got[:3], ref[:3])}
    _raises(lambda: distributed.row_derivatives(sharded, distributed.make_mesh(2)), ValueError,
            "rows was sharded for 4 devices, the mesh has 2")
    assert errs["derivs"] < 1e-12, errs
    return {**errs, "n_cells": rows.n_cells}


def check_border():
    from tests.oracles.border_fixtures import random_batch

    mesh = distributed.make_mesh()
    sizes = [(3, 2), (1, 1), (3, 2), (5, 0), (2, 3), (3, 2), (1, 1), (4, 2), (3, 2)]
    atoms = random_batch(6, sizes, d=2)
    atoms[4] = (-np.abs(atoms[4][0]), *atoms[4][1:])  # a failing atom: status per atom
    batch = border.BorderBatch.from_atoms(*(list(a) for a in zip(*atoms, strict=True)))
    sharded = distributed.shard_border_batch(batch, mesh)
    ridge_t = np.linspace(0.0, 0.4, len(sizes))
    errs = {}
    for backend in BACKENDS:
        solve = jax.jit(lambda b, be=backend: distributed.solve_batched_border(
            b, ridge_t, 0.1, mesh, backend=be))
        got = solve(sharded).gather()
        ref = border.solve_batched_border(batch, ridge_t, 0.1, backend="reference")
        assert np.array_equal(np.asarray(got.status), np.asarray(ref.status)), backend
        errs[backend] = _err(jax.tree.map(jnp.nan_to_num, got), jax.tree.map(jnp.nan_to_num, ref))
    assert int(np.asarray(got.status)[4]) != 0
    _raises(lambda: distributed.solve_batched_border(sharded, -1.0, 0.1, mesh), ValueError,
            "ridge_t")
    _raises(lambda: distributed.solve_batched_border(sharded, np.ones(3), 0.1, mesh), ValueError,
            "ridge_t")
    assert max(errs.values()) < 1e-12, errs
    return {**errs, "slots_per_device": sharded.plan.local.num_atoms}


def _training_problem(model="fm", optimizer="adagrad", p=12, density=0.3):
    """61 training rows over 4 devices (blocks of 16 and 15; ceil(n / D) blocks
    (16, 16, 16, 13) would leave a global batch before the last short, unlike the
    single-device epoch), the settings and the single-device epoch over global_order.

    A batch of 8 rows has more slots than a small table has rows: the row exchanges
    then list every row; ``p = 400, density = 0.03`` makes them sort the touched ids."""
    mesh = distributed.make_mesh()
    rng = np.random.default_rng(8)
    n, k, batch, n_fields = 61, 3, 8, (1 if model == "fm" else 3)
    X = sp.random(n, p, density=density, random_state=9, format="csr")
    X.sort_indices()
    y = rng.integers(0, 2, n).astype(float)[:, None]
    weight = rng.uniform(0.5, 1.5, n)
    fields = (np.arange(p) % n_fields).astype(np.int32)
    tx, lazy, (l2w, l2v) = fm_train.make_optimizer(
        optimizer, model=model, learning_rate=0.1, beta_1=0.9, beta_2=0.999, epsilon=1e-8,
        ftrl_beta=1.0, l1_linear=1e-3, l1_factors=1e-3, l2_linear=1e-3, l2_factors=1e-3)
    cfg = fm_train.TrainConfig(model, "logistic", p, n_fields, batch, tx, lazy, l2w, l2v,
                               "reference")
    lead = (p, 1, n_fields) if model == "ffm" else (p, 1)
    params = {"w0": jnp.zeros(1), "w": jnp.asarray(rng.normal(0, 0.1, (p, 1))),
              "V": jnp.asarray(rng.normal(0, 0.1, (*lead, k)))}
    if model == "fwfm":
        params["r"] = jnp.asarray(rng.uniform(0.5, 1.5, (1, n_fields, n_fields)))
    opt_state = tx.init(params)
    data = distributed.shard_training_rows(X, fields, y, weight, np.float64, mesh)
    orders = [rng.permutation(data.block_rows(g).size) for g in range(N_DEVICES)]
    assert [len(o) for o in orders] == [16, 15, 15, 15]
    order = distributed.global_order(data, orders, batch)
    assert sorted(order.tolist()) == list(range(n))
    single = fm_train.to_device_rows(X, fields, y, weight, np.float64)
    ref = fm_train.train_epoch(cfg, params, opt_state, single, order)
    assert _err(ref[0], params) > 1e-3  # the epoch moves the parameters
    return dataclasses.make_dataclass("Problem", [
        "mesh", "X", "cfg", "params", "opt_state", "data", "orders", "order", "single",
        "ref"])(mesh, X, cfg, params, opt_state, data, orders, order, single, ref)


def check_fm_training():
    pb = _training_problem()
    cfg, params, opt_state, data, orders = pb.cfg, pb.params, pb.opt_state, pb.data, pb.orders
    errs = {}
    for exchange in ("dense", "rows"):
        got = distributed.train_epoch(cfg, params, opt_state, data, orders, pb.mesh,
                                      exchange=exchange)
        errs[exchange] = {"params": _err(got[0], pb.ref[0]), "state": _err(got[1], pb.ref[1]),
                          "loss": _err(got[2], pb.ref[2])}
    # FFM with Adam through the touched-row exchange, sorting the touched ids
    ffm = _training_problem("ffm", "adam", p=400, density=0.03)
    got = distributed.train_epoch(ffm.cfg, ffm.params, ffm.opt_state, ffm.data, ffm.orders,
                                  ffm.mesh, exchange="rows")
    errs["rows_ffm_adam"] = {"params": _err(got[0], ffm.ref[0]),
                             "state": _err(got[1], ffm.ref[1]), "loss": _err(got[2], ffm.ref[2])}
    bad = dataclasses.replace(cfg, batch_size=6)
    _raises(lambda: distributed.train_epoch(bad, params, opt_state, data, orders, pb.mesh),
            ValueError, "batch_size")
    _raises(lambda: distributed.global_order(data, orders, 6), ValueError, "batch_size")
    _raises(lambda: distributed.train_epoch(cfg, params, opt_state, data, orders[:2],
                                            distributed.make_mesh(2)),
            ValueError, "data was sharded for 4 devices, the mesh has 2")
    _raises(lambda: distributed.train_epoch(cfg, params, opt_state, data, orders, pb.mesh,
                                            exchange="sparse"), ValueError, "exchange")
    dense_tx = dataclasses.replace(cfg, tx=optax.sgd(0.1), lazy=False)
    _raises(lambda: distributed.train_epoch(dense_tx, params, opt_state, data, orders, pb.mesh,
                                            exchange="rows"), TypeError, "row-wise")
    assert max(max(e.values()) for e in errs.values()) < 1e-12, errs
    return errs


def _owner_counts(pb, n_rows: int) -> np.ndarray:
    """(batches,) the most unique feature ids one device's share of a batch asks of one
    owner (contiguous blocks of n_rows / D rows), counted in numpy."""
    local_batch = pb.cfg.batch_size // N_DEVICES
    X = pb.X.tocsr()
    most = []
    for start in range(0, max(len(o) for o in pb.orders), local_batch):
        worst = 0
        for g, order in enumerate(pb.orders):
            rows = pb.data.block_rows(g)[order[start:start + local_batch]]
            ids = np.unique(X[rows].indices)
            # a row's padding slots read feature 0 (value 0): it is requested too
            if len(rows) and (np.diff(X.indptr)[rows] < pb.data.rows.idx.shape[2]).any():
                ids = np.union1d(ids, [0])
            owners = np.bincount(ids // (n_rows // N_DEVICES), minlength=N_DEVICES)
            worst = max(worst, int(owners.max(initial=0)))
        most.append(worst)
    return np.array(most)


def check_fm_table():
    errs = {}
    # 13 rows: padded to 4 x 4; 398 rows: padded to 4 x 100, the touched ids sorted
    for model, optimizer, p, density in (("fm", "adagrad", 13, 0.3), ("fwfm", "ftrl", 13, 0.3),
                                         ("ffm", "adam", 398, 0.03)):
        pb = _training_problem(model, optimizer, p, density)
        n_rows = -(-p // N_DEVICES) * N_DEVICES
        params, opt_state = distributed.shard_fm_table(pb.params, pb.opt_state, pb.mesh)
        assert params["V"].shape[0] == n_rows and _spec(params["V"]) == PartitionSpec("rows")
        assert _spec(params["w0"]) == PartitionSpec()
        got = distributed.train_epoch_model_parallel(pb.cfg, params, opt_state, pb.data,
                                                     pb.orders, pb.mesh)
        assert not np.any(np.asarray(got[0]["V"][p:])), "padding rows moved"

        def head(tree, p=p):
            return {name: leaf[:p] if name in ("w", "V") else leaf for name, leaf in tree.items()}

        errs[model] = {"params": _err(head(got[0]), pb.ref[0]),
                       "state": _err(fm_train._state_map(head, got[1]), pb.ref[1]),
                       "loss": _err(got[2], pb.ref[2])}
    # the same epoch with large exchanges as one collective per array
    from gpustat.distributed import _fm_rows

    saved, _fm_rows._PACK_BYTES = _fm_rows._PACK_BYTES, 0
    try:
        params, opt_state = distributed.shard_fm_table(pb.params, pb.opt_state, pb.mesh)
        got = distributed.train_epoch_model_parallel(pb.cfg, params, opt_state, pb.data,
                                                     pb.orders, pb.mesh)
    finally:
        _fm_rows._PACK_BYTES = saved
    errs["ffm_unpacked"] = {"params": _err(head(got[0]), pb.ref[0]),
                            "state": _err(fm_train._state_map(head, got[1]), pb.ref[1]),
                            "loss": _err(got[2], pb.ref[2])}
    # capacity: the plan covers the numpy count; a smaller one stops at the first batch
    # that exceeds it, with the state of the single-device epoch over the batches before
    rng = np.random.default_rng(3)
    while True:  # orders whose first batch asks less of one owner than a later one
        pb.orders = [rng.permutation(len(o)) for o in pb.orders]
        most = _owner_counts(pb, n_rows)
        if most[0] < most.max():
            break
    planned = distributed.plan_capacity(pb.data, pb.orders, pb.cfg.batch_size, n_rows,
                                        pb.mesh)
    slots = pb.cfg.batch_size // N_DEVICES * pb.data.rows.idx.shape[2]
    assert most.max() <= planned <= min(slots, n_rows // N_DEVICES), (most, planned)
    # the owners sort what they were asked (fewer ids than rows), the requesters too
    assert N_DEVICES * planned < n_rows // N_DEVICES + 1 and slots < n_rows + 1, (planned, slots)
    capacity = int(most.max()) - 1
    first = int(np.argmax(most > capacity))
    params, opt_state = distributed.shard_fm_table(pb.params, pb.opt_state, pb.mesh)
    try:
        distributed.train_epoch_model_parallel(pb.cfg, params, opt_state, pb.data, pb.orders,
                                               pb.mesh, capacity=capacity)
        raise AssertionError("capacity overflow not reported")
    except distributed.CapacityError as e:
        assert e.batch == first and f"batch {first}" in str(e), (e.batch, first, str(e))
        order = distributed.global_order(pb.data, pb.orders, pb.cfg.batch_size)
        part = fm_train.train_epoch(pb.cfg, pb.params, pb.opt_state, pb.single,
                                    order[:pb.cfg.batch_size * first])
        errs[f"stopped_at_batch_{first}"] = {"params": _err(head(e.params), part[0]),
                                             "loss": _err(e.loss, part[2])}
    # a fresh table drawn on the devices, 3 rows at a time (4 rows a device: the second
    # chunk overlaps the first)
    from gpustat.distributed import _fm_table

    saved, _fm_table._INIT_CHUNK_VALUES = _fm_table._INIT_CHUNK_VALUES, 3 * 9
    try:
        fresh, state = distributed.init_fm_table("ffm", 13, 3, pb.cfg.tx, pb.mesh,
                                                 key=jax.random.key(0), n_fields=3,
                                                 init_scale=0.3, dtype=jnp.float64)
    finally:
        _fm_table._INIT_CHUNK_VALUES = saved
    V = np.asarray(fresh["V"])
    assert V.shape == (16, 1, 3, 3) and _spec(fresh["V"]) == PartitionSpec("rows")
    assert np.all(V[13:] == 0) and np.all((V[:13] >= 0) & (V[:13] <= 0.3 / np.sqrt(3)))
    assert np.unique(V[:13]).size == V[:13].size and not np.any(np.asarray(fresh["w"]))
    assert _spec(state[0]["V"]) == PartitionSpec("rows")
    _raises(lambda: distributed.train_epoch_model_parallel(pb.cfg, pb.params, pb.opt_state,
                                                           pb.data, pb.orders, pb.mesh),
            ValueError, "row-sharded")
    _raises(lambda: distributed.train_epoch_model_parallel(
        dataclasses.replace(pb.cfg, tx=optax.sgd(0.1), lazy=False), params, opt_state,
        pb.data, pb.orders, pb.mesh), TypeError, "row-wise")
    _raises(lambda: distributed.train_epoch_model_parallel(pb.cfg, params, opt_state, pb.data,
                                                           pb.orders, pb.mesh, capacity=0),
            ValueError, "capacity")
    _raises(lambda: distributed.plan_capacity(pb.data, pb.orders, 8, 13, pb.mesh), ValueError,
            "n_rows=13")
    _raises(lambda: distributed.init_fm_table("gm", 13, 3, pb.cfg.tx, pb.mesh,
                                              key=jax.random.key(0)), ValueError, "model")
    assert max(max(e.values()) for e in errs.values()) < 1e-10, errs
    return errs


def main(names) -> int:
    checks = {k[len("check_"):]: v for k, v in globals().items() if k.startswith("check_")}
    failed = 0
    for name in names or sorted(checks):
        start = time.process_time()
        try:
            detail = checks[name]()
            print(json.dumps({"name": name, "ok": True, "detail": detail,
                              "cpu_s": round(time.process_time() - start, 2)}), flush=True)
        except Exception:  # report every failure, keep going
            failed += 1
            print(json.dumps({"name": name, "ok": False, "detail": traceback.format_exc()}),
                  flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
