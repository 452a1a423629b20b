"""Compile a chain of jitted programs concurrently before running it.

A fit that runs several programs one after another (an initialisation, then a loop)
pays their compilations one after another on its first call. Code written against a
*runner* (``run(program, *args, **static)``) can be walked twice: once with
:class:`CompileAhead`, which starts each program's compilation on a worker thread and
hands back the program's abstract output (so the next program's arguments are known
without running anything), then with :func:`run_program`, which runs the programs; by
then every compilation is in JAX's cache. :func:`compile_ahead_once` skips the first
walk when a walk of the same key has run before in the process (its programs are in the
cache: walking again would only trace and look them up).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import jax

__all__ = ["CompileAhead", "compile_ahead_once", "compiling_ahead", "run_program"]


def run_program(program, *args, **kwargs):
    """Run ``program`` (the runner that runs)."""
    return program(*args, **kwargs)


class CompileAhead:
    """A runner that compiles instead of running: each ``runner(program, *args, **static)``
    of a jitted program lowers it, starts XLA's compilation of it on a worker thread and
    returns ``program.eval_shape(...)`` (arguments may be arrays or
    ``jax.ShapeDtypeStruct``); a plain function only gives its ``jax.eval_shape``.
    Leaving the ``with`` block waits for every compilation and raises the first error.

    The compiled executables land in the cache that a later call of the same program with
    arguments of the same shapes, dtypes and placement finds, so that call compiles
    nothing.
    """

    def __init__(self, workers: int = 4):
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="gpustat-compile")
        self._pending = []

    def __call__(self, program, *args, **kwargs):
        if not hasattr(program, "lower"):  # a plain function, not a jitted one
            return jax.eval_shape(functools.partial(program, **kwargs), *args)
        out = program.eval_shape(*args, **kwargs)
        # traced and lowered in the calling thread, under its configuration (jax's
        # thread-local settings, such as jax.enable_x64 blocks, key the compile cache);
        # the worker runs XLA's compilation
        lowered = program.lower(*args, **kwargs)
        self._pending.append(self._pool.submit(lowered.compile))
        return out

    def __enter__(self) -> CompileAhead:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:  # else the block's own error is the one to see
                for future in self._pending:
                    future.result()
        finally:
            self._pool.shutdown(cancel_futures=True)


_walked: set = set()


@contextlib.contextmanager
def compiling_ahead(key) -> Iterator[CompileAhead | None]:
    """A :class:`CompileAhead` runner for the block, or None when a walk of ``key`` has
    already run in this process; leaving the block waits for the compilations it
    started, so work done inside the block (transfers, host preparation) overlaps them.
    ``key`` as in :func:`compile_ahead_once`."""
    if key in _walked:
        yield None
        return
    with CompileAhead() as ahead:
        yield ahead
    _walked.add(key)


def compile_ahead_once(key, walk) -> None:
    """``walk(runner)`` under a :class:`CompileAhead` unless a walk of ``key`` has already
    run in this process. ``key`` (hashable) must name everything that decides the walk's
    programs and their argument shapes, dtypes and placement. Clearing JAX's caches
    (``jax.clear_caches``) after a walk costs only speed: the later calls then compile in
    turn."""
    with compiling_ahead(key) as ahead:
        if ahead is not None:
            walk(ahead)
