"""Read ahead of an iterator in a background thread (host work overlapping device work).

One worker thread calls ``next`` on the source, so the source is advanced in
order, by one thread at a time: the items, and any random stream or file
position the source advances, are exactly those of iterating it directly.
Exceptions surface at the item where the source raised them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor

__all__ = ["prefetched"]

_DONE = object()


def prefetched[T](source: Iterable[T], depth: int) -> Iterator[T]:
    """The items of ``source``, with up to ``depth`` of them produced ahead by a worker thread.

    The worker starts at once (before the first item is asked for) and runs while
    the caller works on the current item (numpy's heavy loops and waits on the
    device release the GIL). ``depth = 0`` iterates ``source`` in the calling
    thread. Closing the iterator early cancels the reads not started; a read in
    progress finishes first.

    Args:
        source: any iterable; advanced only by the worker.
        depth: items read ahead (>= 0).
    """
    if depth == 0:
        return iter(source)
    it = iter(source)
    pool = ThreadPoolExecutor(1, thread_name_prefix="gpustat-prefetch")
    pending = deque(pool.submit(next, it, _DONE) for _ in range(depth))
    return _drain(pool, it, pending)


def _drain[T](pool: ThreadPoolExecutor, it: Iterator[T], pending: deque) -> Iterator[T]:
    try:
        while (item := pending.popleft().result()) is not _DONE:
            pending.append(pool.submit(next, it, _DONE))
            yield item
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
