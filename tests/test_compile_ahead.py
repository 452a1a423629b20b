"""Compiling a chain of programs ahead, side by side (gpustat._compile_ahead)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gpustat
from gpustat._compile_ahead import CompileAhead, compile_ahead_once, compiling_ahead, run_program
from tests.helpers import compiled_programs


@jax.jit
def _scaled(x, y):
    return x * 3.0 + y


@functools.partial(jax.jit, static_argnames="power")
def _powered_sum(z, *, power):
    return jnp.sum(z**power, axis=0)


def _chain(run, x, y):
    z = run(_scaled, x, y)
    z = run(lambda a: a[::-1], z)  # a plain function between the programs
    return run(_powered_sum, z, power=3)


def test_a_chain_compiled_ahead_runs_without_compiling():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(37, 5)), rng.normal(size=(5,))
    with CompileAhead() as ahead:
        shapes = _chain(ahead, jnp.asarray(x), jnp.asarray(y))
    assert shapes.shape == (5,)
    out = None

    def run():
        nonlocal out
        out = _chain(run_program, jnp.asarray(x), jnp.asarray(y))

    assert [name for name in compiled_programs(run) if "_powered_sum" in name or
            "_scaled" in name] == []
    np.testing.assert_allclose(np.asarray(out), np.sum((x * 3 + y)[::-1] ** 3, axis=0),
                               rtol=1e-5)


def test_the_callers_thread_local_settings_key_the_compilations():
    """Compiled under the caller's settings (here a jax.enable_x64 block against the
    global value), the chain runs in the same block without compiling."""
    x, y = jnp.ones((11, 3), jnp.float32), jnp.ones(3, jnp.float32)
    with jax.enable_x64(not jax.config.jax_enable_x64):
        with CompileAhead() as ahead:
            _chain(ahead, x, y)
        names = compiled_programs(lambda: _chain(run_program, x, y))
    assert [n for n in names if "_powered_sum" in n or "_scaled" in n] == []


def test_a_key_is_walked_once():
    """The second walk of a key is skipped (its programs are compiled); a new key walks,
    and its programs then run without compiling."""
    walks = []

    def walk(shape):
        def chain(run):
            walks.append(shape)
            return _chain(run, jnp.ones(shape), jnp.ones(shape[1:]))
        return chain

    key = ("test_a_key_is_walked_once", (13, 2))
    compile_ahead_once(key, walk((13, 2)))
    compile_ahead_once(key, walk((13, 2)))
    assert walks == [(13, 2)]
    compile_ahead_once(("test_a_key_is_walked_once", (17, 2)), walk((17, 2)))
    assert walks == [(13, 2), (17, 2)]
    names = compiled_programs(lambda: _chain(run_program, jnp.ones((17, 2)), jnp.ones(2)))
    assert [n for n in names if "_powered_sum" in n or "_scaled" in n] == []


def test_an_error_in_the_chain_surfaces():
    with pytest.raises(TypeError, match="power"), CompileAhead() as ahead:
        ahead(_powered_sum, jnp.ones(3))  # the static argument is missing


def test_a_large_fit_compiles_each_program_once():
    """A GaussianMixture fit beyond the small-data size compiles its initialisation and
    EM programs side by side before running them: each once, and a second fit none."""
    rng = np.random.default_rng(1)
    X = np.concatenate([rng.normal(size=(8000, 16)), rng.normal(size=(8000, 16)) + 5.0])

    def fit():
        return gpustat.GaussianMixture(2, random_state=0, reg_covar=3e-6).fit(X)

    names = [n for n in compiled_programs(fit) if "_kmeans" in n or "fit_em" in n]
    assert sorted(names) == ["jit(_kmeans_centres)", "jit(_kmeans_final)",
                             "jit(_kmeans_seeds)", "jit(fit_em_rows)"]
    assert compiled_programs(fit) == []
    sk = pytest.importorskip("sklearn.mixture").GaussianMixture(2, random_state=0).fit(X)
    np.testing.assert_allclose(np.sort(fit().means_[:, 0]), np.sort(sk.means_[:, 0]),
                               atol=1e-6)


def test_compiling_ahead_overlaps_the_block_and_runs_once_per_key():
    """The block's own work runs while the program compiles; the program then runs
    without compiling, and a second block of the same key compiles nothing ahead."""
    key = ("test_compiling_ahead", 11)
    x = jax.ShapeDtypeStruct((11, 3), jnp.float32)
    with compiling_ahead(key) as ahead:
        assert ahead is not None
        ahead(_scaled, x, jax.ShapeDtypeStruct((3,), jnp.float32))
        data = jnp.ones((11, 3), jnp.float32), jnp.arange(3, dtype=jnp.float32)
    assert compiled_programs(lambda: _scaled(*data).block_until_ready()) == []
    with compiling_ahead(key) as again:
        assert again is None
