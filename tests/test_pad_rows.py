"""gpustat._arrays.pad_rows: host rows padded with zero rows, large ones on the device."""

import numpy as np

from gpustat._arrays import pad_rows, row_bucket
from tests.helpers import compiled_programs


def test_small_rows_are_padded_on_the_host():
    X = np.arange(30.0).reshape(10, 3)
    out = pad_rows(X, 16)
    assert isinstance(out, np.ndarray)
    np.testing.assert_array_equal(out, np.concatenate([X, np.zeros((6, 3))]))
    assert pad_rows(X, 10) is X


def test_large_rows_are_joined_on_the_device_by_one_program_per_bucket():
    rng = np.random.default_rng(0)
    for n in (70_000, 75_003, 65_537):  # one row bucket (81,920 rows of 16 float32)
        X = rng.normal(size=(n, 16)).astype(np.float32)
        rows = row_bucket(n)
        assert rows == 81_920
        names = compiled_programs(lambda X=X, rows=rows: pad_rows(X, rows).block_until_ready())
        if n != 70_000:
            assert [name for name in names if "_joined" in name] == []
        out = np.asarray(pad_rows(X, rows))
        np.testing.assert_array_equal(out[:n], X)
        assert out.shape == (rows, 16) and not out[n:].any()
