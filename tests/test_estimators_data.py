"""make_ctr: the documented layout, Zipf popularity against its closed form, bad input."""

import numpy as np
import pytest

from gpustat.estimators._data import make_ctr


def test_layout_popularity_and_seed():
    X, y, field_ids = make_ctr(4000, n_features=40, n_fields=2, zipf=1.1, seed=5)
    assert X.shape == (4000, 40) and X.dtype == np.float64 and X.format == "csr"
    assert np.all(X.data == 1.0) and np.all(np.diff(X.indptr) == 2)
    assert np.array_equal(field_ids, np.repeat([0, 1], 20))
    assert np.all(field_ids[X.indices].reshape(4000, 2) == [0, 1])  # one category per field
    assert y.shape == (4000,) and set(np.unique(y)) <= {0, 1}
    # the most popular category of a field: probability 1 / sum_r r^-zipf
    top = np.bincount(X.indices[field_ids[X.indices] == 0], minlength=40).max() / 4000
    expected = 1.0 / np.sum(np.arange(1, 21) ** -1.1)
    assert abs(top - expected) < 5 * np.sqrt(expected * (1 - expected) / 4000)
    X2, y2, _ = make_ctr(4000, n_features=40, n_fields=2, zipf=1.1, seed=5)
    assert (X != X2).nnz == 0 and np.array_equal(y, y2)


@pytest.mark.parametrize("n_features, n_fields", [(30, 4), (0, 4), (8, 16), (16, 0)])
def test_bad_field_layout(n_features, n_fields):
    with pytest.raises(ValueError, match=r"n_features must be a .*multiple of n_fields"):
        make_ctr(10, n_features=n_features, n_fields=n_fields)
