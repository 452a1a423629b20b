"""The FM estimators' epoch orders: drawn side by side, equal to numpy's permutations in turn."""

from __future__ import annotations

import numpy as np
import pytest

from gpustat.estimators._orders import _skip_draws, epoch_orders


def _stream(seed):
    """A generator that has drawn a mix of values (one 32-bit half left in its buffer)."""
    rng = np.random.default_rng(seed)
    rng.random(3)
    rng.integers(0, 7, size=5, dtype=np.int32)
    return rng


@pytest.mark.parametrize("n", [0, 1, 2, 3, 1000, 2**17 + 5])
def test_skipping_a_permutation_leaves_numpy_state_after_it(n):
    drawn, skipped = _stream(n), _stream(n)
    drawn.permutation(n)
    _skip_draws(skipped, n)
    assert skipped.bit_generator.state == drawn.bit_generator.state
    assert skipped.random() == drawn.random()


@pytest.mark.parametrize(("n", "epochs", "ahead"),
                         [(0, 2, 2), (1, 3, 1), (97, 0, 3), (97, 5, 1), (5000, 6, 4),
                          (2**17 + 5, 3, 2)])
def test_orders_are_numpy_permutations_in_turn(n, epochs, ahead):
    want_rng, rng = _stream(7), _stream(7)
    want = [want_rng.permutation(n) for _ in range(epochs)]
    got = list(epoch_orders(rng, n, epochs, ahead))
    assert len(got) == epochs
    for order, expected in zip(got, want):
        np.testing.assert_array_equal(order, expected)
    assert rng.bit_generator.state == want_rng.bit_generator.state


def test_closing_before_the_first_order_stops_the_walk():
    rng = np.random.default_rng(0)
    orders = epoch_orders(rng, 1000, 50, ahead=2)
    orders.close()
    with pytest.raises(StopIteration):
        next(orders)
    advanced = np.random.default_rng(0)
    for _ in range(3):  # at most `ahead` epochs were started
        if advanced.bit_generator.state == rng.bit_generator.state:
            break
        advanced.permutation(1000)
    assert advanced.bit_generator.state == rng.bit_generator.state


class _FailingStream:
    """A stream whose epoch 1 permutation fails (its copies remember their epoch)."""

    def __init__(self):
        self.epoch = 0

    def __deepcopy__(self, memo):
        copy = _FailingStream()
        copy.epoch = self.epoch
        return copy

    def permutation(self, n):
        if self.epoch == 1:
            raise RuntimeError("draw 1 failed")
        return np.arange(n)

    def shuffle(self, x):
        self.epoch += 1


def test_a_failing_draw_raises_at_its_order():
    orders = epoch_orders(_FailingStream(), 4, 3, ahead=3)
    np.testing.assert_array_equal(next(orders), np.arange(4))
    with pytest.raises(RuntimeError, match="draw 1 failed"):
        next(orders)
    with pytest.raises(StopIteration):
        next(orders)
