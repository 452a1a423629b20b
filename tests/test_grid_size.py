"""The padded sizes that let nearby shapes share compiled programs."""

import pytest

from gpustat._arrays import grid_size, row_bucket


def _grid(per_octave: int, top: int) -> list[int]:
    """Every size of the grid up to ``top``, listed octave by octave."""
    sizes, low = {1}, 1
    while low < top:
        step = max(low // per_octave, 1)
        sizes.update(range(low, 2 * low + 1, step))
        low *= 2
    return sorted(sizes)


@pytest.mark.parametrize("per_octave", [1, 4, 8, 32])
def test_grid_size_is_the_smallest_grid_size_at_least_n(per_octave):
    sizes = _grid(per_octave, 1 << 14)
    for n in range(1, 1 << 13):
        expected = next(s for s in sizes if s >= n)
        assert grid_size(n, per_octave) == expected, n
        assert expected < n * (1 + 1 / per_octave) or expected == n


def test_row_bucket_is_four_sizes_an_octave():
    assert [row_bucket(n) for n in (5, 8, 9, 333, 500, 4097)] == [5, 8, 10, 384, 512, 5120]
