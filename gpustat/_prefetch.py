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
    thread. ``close()`` (also before the first item) cancels the reads not started;
    a read in progress finishes first.

    Args:
        source: any iterable; advanced only by the worker.
        depth: items read ahead (>= 0).
    """
    if depth == 0:
        return iter(source)
    return _ReadAhead(iter(source), depth)


class _ReadAhead[T]:
    """Iterator over ``it`` with ``depth`` reads submitted ahead to one worker thread."""

    def __init__(self, it: Iterator[T], depth: int):
        self._it = it
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="gpustat-prefetch")
        self._pending = deque(self._pool.submit(next, it, _DONE) for _ in range(depth))

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        if not self._pending:
            raise StopIteration
        try:
            item = self._pending.popleft().result()
        except BaseException:
            self.close()
            raise
        if item is _DONE:
            self.close()
            raise StopIteration
        self._pending.append(self._pool.submit(next, self._it, _DONE))
        return item

    def close(self) -> None:
        self._pending.clear()
        self._pool.shutdown(wait=True, cancel_futures=True)
