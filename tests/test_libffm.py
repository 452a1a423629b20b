"""libffm text I/O: a handwritten file against the matrix written out by hand, round trips
of random data, and errors that name the line."""

import numpy as np
import pytest
import scipy.sparse as sp

import gpustat
from gpustat.factorization import dump_libffm, load_libffm

TEXT = """1 0:3:1 1:0:0.5 0:3:2

-1 2:4:1.25e-3
0
"""


def test_handwritten_file_reads_as_written():
    X, y, field_ids = load_libffm(TEXT.splitlines())
    dense = np.zeros((3, 5))
    dense[0, 3] = 3.0  # feature 3 twice on line 1: summed
    dense[0, 0] = 0.5
    dense[1, 4] = 1.25e-3
    np.testing.assert_array_equal(X.toarray(), dense)
    np.testing.assert_array_equal(y, [1.0, -1.0, 0.0])
    np.testing.assert_array_equal(field_ids, [1, 0, 0, 0, 2])  # feature 1, 2 unseen: field 0
    X, _, field_ids = load_libffm(TEXT.splitlines(), n_features=7)
    assert X.shape == (3, 7) and field_ids.shape == (7,)


def test_round_trip_of_random_data_is_exact(tmp_path):
    rng = np.random.default_rng(0)
    X = sp.random(40, 30, density=0.2, random_state=1, format="csr",
                  data_rvs=lambda k: rng.normal(size=k) * 10.0 ** rng.integers(-8, 8, k))
    y = rng.integers(0, 2, 40)
    field_ids = rng.integers(0, 5, 30)
    path = tmp_path / "data.ffm"
    dump_libffm(path, X, y, field_ids)
    X2, y2, fields2 = load_libffm(path, n_features=30)
    np.testing.assert_array_equal(X2.toarray(), X.toarray())  # bit for bit
    np.testing.assert_array_equal(y2, y)
    used = np.unique(X.indices)
    np.testing.assert_array_equal(fields2[used], field_ids[used])
    assert gpustat.load_libffm is load_libffm and gpustat.dump_libffm is dump_libffm


@pytest.mark.parametrize(("text", "match"), [
    ("1 0:3", "line 1: expected field:feature:value"),
    ("1 0:3:1\n0 a:1:1", "line 2: expected field:feature:value"),
    ("yes 0:1:1", "line 1: the label must be a number"),
    ("nan 0:1:1", "the label must be finite"),
    ("1 0:-1:1", "must be >= 0"),
    ("1 0:1:inf", "value must be finite"),
    ("1 0:1:1\n\n0 2:1:1", r"line 3: feature 1 is in field 2 but in field 0 on line 1"),
])
def test_bad_text_raises_naming_the_line(text, match):
    with pytest.raises(ValueError, match=match):
        load_libffm(text.splitlines())


def test_bad_dump_arguments_raise(tmp_path):
    X = sp.csr_matrix(np.eye(3))
    path = tmp_path / "x.ffm"
    with pytest.raises(ValueError, match="y must have shape"):
        dump_libffm(path, X, np.zeros(2), np.zeros(3, int))
    with pytest.raises(ValueError, match="field_ids must have shape"):
        dump_libffm(path, X, np.zeros(3), np.zeros(2, int))
    with pytest.raises(ValueError, match="non-negative integers"):
        dump_libffm(path, X, np.zeros(3), -np.ones(3, int))
    with pytest.raises(ValueError, match="n_features=2"):
        load_libffm(["1 0:2:1"], n_features=2)


def test_dump_leaves_the_callers_matrix_unchanged(tmp_path):
    # an explicit zero and an unsorted repeated column: dump sums and drops them on a copy
    X = sp.csr_matrix((np.array([1.0, 0.0, 2.0, 3.0, 4.0, 5.0]), np.array([0, 1, 2, 2, 0, 2]),
                       np.array([0, 3, 6])), shape=(2, 3))
    arrays = [a.copy() for a in (X.data, X.indices, X.indptr)]
    path = tmp_path / "x.ffm"
    dump_libffm(path, X, np.array([1, 0]), np.array([0, 1, 2]))
    for before, after in zip(arrays, (X.data, X.indices, X.indptr), strict=True):
        np.testing.assert_array_equal(after, before)
    assert path.read_text() == "1 0:0:1.0 2:2:2.0\n0 0:0:4.0 2:2:8.0\n"


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"dtype": np.int64}, TypeError, "dtype must be a floating dtype"),  # was 0.5 -> 0
    ({"n_features": 2.5}, TypeError, "n_features must be an integer"),
    ({"n_features": -1}, ValueError, "n_features must be >= 0"),
])
def test_bad_load_arguments_raise(kwargs, error, match):
    with pytest.raises(error, match=match):
        load_libffm(["1 0:1:0.5"], **kwargs)
