"""Epoch row orders: ``rng.permutation(n)`` for each epoch in turn, the permutations drawn
side by side.

A permutation is one Fisher-Yates shuffle of ``arange(n)``. Its random draws are cheap;
its swaps of ``n`` int64 positions are random memory accesses (0.5 s for 10M rows on the
H200 machine's host), and one stream drawn by one thread would do the epochs' swaps one
epoch after another. Here a walker thread follows the stream: at the start of each epoch
it copies the generator and then advances the generator past that epoch's draws by
shuffling a zero-stride array (numpy's shuffle takes the same draws for any array of
``n`` items, and swapping one memory slot with itself costs no memory traffic). Worker
threads run the permutations from the copies concurrently. The orders, and the
generator's state afterwards, are exactly those of calling ``rng.permutation(n)`` once per
epoch.
"""

from __future__ import annotations

import copy
import queue
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
from numpy.lib.stride_tricks import as_strided

__all__ = ["epoch_orders"]


def epoch_orders(rng: np.random.Generator, n: int, epochs: int,
                 ahead: int) -> Iterator[np.ndarray]:
    """``epochs`` permutations of ``range(n)``, equal to ``rng.permutation(n)`` called once
    per epoch, with up to ``ahead`` (>= 1) of them drawn concurrently ahead of the caller.

    Drawing starts at once. ``rng`` is advanced by a walker thread, epoch by epoch, as the
    draws are started; do not use it elsewhere until the iterator is exhausted or closed.
    ``close()`` stops the walk (also before the first order) and waits for the
    permutations in progress.
    """
    return _Orders(rng, int(n), int(epochs), max(1, int(ahead)))


def _skip_draws(rng: np.random.Generator, n: int) -> None:
    """Advance ``rng`` past the draws of ``rng.permutation(n)``, without permuting."""
    rng.shuffle(as_strided(np.zeros(1, np.int64), (n,), (0,)))


class _Orders:
    """Iterator of :func:`epoch_orders`: a walker thread submits each epoch's permutation
    to a pool of ``ahead`` workers, at most ``ahead`` of them not yet taken."""

    def __init__(self, rng: np.random.Generator, n: int, epochs: int, ahead: int):
        self._pool = ThreadPoolExecutor(ahead, thread_name_prefix="gpustat-orders")
        self._started: queue.SimpleQueue[Future | None] = queue.SimpleQueue()
        self._slots = threading.Semaphore(ahead)
        self._closed = threading.Event()
        self._walker = threading.Thread(target=self._walk, args=(rng, n, epochs),
                                        name="gpustat-orders-walk", daemon=True)
        self._walker.start()

    def _walk(self, rng: np.random.Generator, n: int, epochs: int) -> None:
        try:
            for _ in range(epochs):
                self._slots.acquire()
                if self._closed.is_set():
                    return
                self._started.put(self._pool.submit(copy.deepcopy(rng).permutation, n))
                _skip_draws(rng, n)
        except BaseException as err:  # raised to the caller at the order that failed
            failed = Future()
            failed.set_exception(err)
            self._started.put(failed)
        finally:
            self._started.put(None)

    def __iter__(self) -> Iterator[np.ndarray]:
        return self

    def __next__(self) -> np.ndarray:
        if self._closed.is_set():
            raise StopIteration
        started = self._started.get()
        if started is None:
            self.close()
            raise StopIteration
        try:
            order = started.result()
        except BaseException:
            self.close()
            raise
        self._slots.release()
        return order

    def close(self) -> None:
        self._closed.set()
        self._slots.release()  # a walker waiting for a slot wakes and stops
        self._walker.join()
        self._pool.shutdown(wait=True, cancel_futures=True)
