"""libffm text I/O: a handwritten file against the matrix written out by hand, round trips
of random data, and errors that name the line."""

import numpy as np
import pytest
import scipy.sparse as sp

import gpustat
from gpustat.factorization import dump_libffm, iter_libffm, load_libffm

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
    # the header keeps the width and the field of feature 1, which no row uses
    assert path.read_text() == ("# gpustat-libffm n_features=3 fields=1:1\n"
                                "1 0:0:1.0 2:2:2.0\n0 0:0:4.0 2:2:8.0\n")


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"dtype": np.int64}, TypeError, "dtype must be a floating dtype"),  # was 0.5 -> 0
    ({"n_features": 2.5}, TypeError, "n_features must be an integer"),
    ({"n_features": -1}, ValueError, "n_features must be >= 0"),
])
def test_bad_load_arguments_raise(kwargs, error, match):
    with pytest.raises(error, match=match):
        load_libffm(["1 0:1:0.5"], **kwargs)


def _random_text(rng, n_rows, n_features, n_fields):
    """libffm lines in varied number spellings, and the matrix Python's float() reads."""
    field_of = rng.integers(0, n_fields, n_features)
    spellings = [lambda v: repr(v), lambda v: f"{v:.3e}", lambda v: f"{v:+.5f}",
                 lambda v: str(int(abs(v) * 1000)), lambda v: f"{v:.20g}", lambda v: "1"]
    lines, dense, labels = [], np.zeros((n_rows, n_features)), []
    for r in range(n_rows):
        label = rng.choice(["0", "1", "-1", "0.25", "3e-2"])
        labels.append(float(label))
        words = [label]
        for j in rng.choice(n_features, rng.integers(0, 6), replace=True):
            value = float(rng.normal() * 10.0 ** rng.integers(-5, 5))
            text = spellings[rng.integers(len(spellings))](value)
            dense[r, j] += float(text)
            words.append(f"{field_of[j]}:{j}:{text}")
        lines.append(("\t" if r % 3 else " ").join(words) + (" \r" if r % 4 == 1 else ""))
        if r % 5 == 2:
            lines.append("")  # blank lines count in line numbers and are skipped
    return lines, dense, np.asarray(labels), field_of


def test_varied_number_spellings_match_python_floats(tmp_path, monkeypatch):
    rng = np.random.default_rng(3)
    lines, dense, labels, field_of = _random_text(rng, 60, 25, 4)
    path = tmp_path / "mixed.ffm"
    path.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr("gpustat.factorization._libffm._BLOCK_BYTES", 97)  # many blocks, lines cut across reads
    for source in (path, lines, [line.encode() for line in lines], open(path, "rb")):
        X, y, fields = load_libffm(source, n_features=25)
        np.testing.assert_array_equal(X.toarray(), dense)  # summed the way scipy sums
        np.testing.assert_array_equal(y, labels)
        used = np.flatnonzero(np.abs(dense).sum(0) > 0)
        np.testing.assert_array_equal(fields[used], field_of[used])


def test_chunks_concatenate_to_the_whole_file(tmp_path, monkeypatch):
    rng = np.random.default_rng(4)
    lines, dense, labels, field_of = _random_text(rng, 47, 30, 5)
    path = tmp_path / "chunks.ffm"
    path.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr("gpustat.factorization._libffm._BLOCK_BYTES", 64)
    chunks = list(iter_libffm(path, chunk_rows=10, n_features=30))
    assert [x.shape for x, _, _ in chunks] == [(10, 30)] * 4 + [(7, 30)]
    np.testing.assert_array_equal(sp.vstack([x for x, _, _ in chunks]).toarray(), dense)
    np.testing.assert_array_equal(np.concatenate([y for _, y, _ in chunks]), labels)
    # the field table grows as features appear: -1 for the ones not seen yet
    seen = np.abs(dense[:10]).sum(0) > 0
    np.testing.assert_array_equal(chunks[0][2], np.where(seen, field_of, -1))
    # known field ids are checked and passed through
    given = np.where(np.abs(dense).sum(0) > 0, field_of, 0)
    for _, _, fields in iter_libffm(lines, chunk_rows=100, n_features=30, field_ids=given):
        np.testing.assert_array_equal(fields, given)
    given[np.flatnonzero(np.abs(dense).sum(0))[0]] += 1
    with pytest.raises(ValueError, match=r"line \d+: feature \d+ is in field \d+ but field_ids"):
        list(iter_libffm(lines, n_features=30, field_ids=given))
    with pytest.raises(ValueError, match="n_features is required"):
        next(iter_libffm(lines))
    with pytest.raises(ValueError, match="chunk_rows must be >= 1"):
        next(iter_libffm(lines, chunk_rows=0, n_features=30))


def test_errors_in_later_blocks_name_the_files_line(monkeypatch):
    lines = [f"1 0:{j}:1 1:{j + 50}:2" for j in range(40)]
    monkeypatch.setattr("gpustat.factorization._libffm._BLOCK_BYTES", 50)
    bad = lines.copy()
    bad[33] = "0 0:7:1 0:3:1.5.5"
    with pytest.raises(ValueError, match=r"line 34: expected field:feature:value.*'0:3:1\.5\.5'"):
        load_libffm(bad)
    bad = lines.copy()
    bad[36] = "0 1:3:1"  # feature 3 was in field 0 on line 4, three blocks earlier
    with pytest.raises(ValueError, match=r"line 37: feature 3 is in field 1 but in field 0 on "
                                         r"line 4"):
        load_libffm(bad)


@pytest.mark.parametrize(("text", "match"), [
    ("1 0:1000000000000:1", r"line 1: feature index 1000000000000 is beyond the int32"),
    ("1 0:1:1\n0 0:2147483647:1", r"line 2: feature index 2147483647 is beyond"),
    ("1 0:12345678901234567890123:1", r"line 1: feature index 12345678901234567890123 is beyond"),
    ("1 9999999999:1:1", r"line 1: field index 9999999999 is beyond the int32 range"),
    ("1 0::1", "line 1: expected field:feature:value"),
    ("1 0:1:", "line 1: expected field:feature:value"),
    ("1 :1:1", "line 1: expected field:feature:value"),
    ("1 0:1.5:1", "line 1: expected field:feature:value"),
    ("1 0:1:1:1", "line 1: expected field:feature:value"),
    ("1 0:1:0x10", "line 1: expected field:feature:value"),
    ("1:0 0:1:1", "line 1: the label must be a number"),
    ("1\n\n0 0:-3:1", "line 3: field and feature must be >= 0"),
    ("# a comment\n1 0:1:1", "line 1: the label must be a number"),
])
def test_huge_indices_and_malformed_tokens_name_the_line(text, match):
    with pytest.raises(ValueError, match=match):
        load_libffm(text.splitlines())


def test_huge_index_against_n_features_names_line_and_index():
    with pytest.raises(ValueError, match=r"line 2: feature index 7 is beyond n_features=5"):
        load_libffm(["1 0:1:1", "1 0:7:1"], n_features=5)


def test_bytes_lines_read_like_text_and_other_items_raise():
    X, y, fields = load_libffm([b"1 0:3:1 1:0:0.5", b"-1 2:4:1.25e-3\n"])
    X2, y2, fields2 = load_libffm(["1 0:3:1 1:0:0.5", "-1 2:4:1.25e-3\n"])
    np.testing.assert_array_equal(X.toarray(), X2.toarray())
    np.testing.assert_array_equal(y, y2)
    np.testing.assert_array_equal(fields, fields2)
    with pytest.raises(TypeError, match="line 2: source must yield str or bytes lines, got int"):
        load_libffm(["1 0:3:1", 5])
    with pytest.raises(TypeError, match="split the text into lines"):
        load_libffm(b"1 0:3:1\n")
    with pytest.raises(ValueError, match="line 2: an item of source holds a line break"):
        load_libffm(["1 0:3:1", "0 0:1:1\n1 0:2:1"])


def test_float32_values_that_overflow_raise():
    with pytest.raises(ValueError, match=r"line 2: value 1e\+300 overflows dtype=float32"):
        load_libffm(["1 0:1:1", "0 0:1:1e300"], dtype=np.float32)


def test_header_keeps_width_and_fields_of_unused_features(tmp_path):
    X = sp.csr_matrix(np.array([[0.0, 2.0, 0.0, 0.0, 0.0], [1.5, 0.0, 0.0, 0.0, 0.0]]))
    field_ids = np.array([0, 3, 2, 0, 4])  # features 2, 3 and 4 unused, two in nonzero fields
    path = tmp_path / "wide.ffm"
    dump_libffm(path, X, np.array([1, 0]), field_ids)
    X2, _, fields2 = load_libffm(path)
    assert X2.shape == (2, 5)
    np.testing.assert_array_equal(X2.toarray(), X.toarray())
    np.testing.assert_array_equal(fields2, field_ids)
    (_, _, chunk_fields), = iter_libffm(path)  # the header gives the width to stream with
    np.testing.assert_array_equal(chunk_fields, [0, 3, 2, -1, 4])
    with pytest.raises(ValueError, match="n_features=6 but the file's header says n_features=5"):
        load_libffm(path, n_features=6)
    dump_libffm(path, X, np.array([1, 0]), field_ids, header=False)  # plain libffm
    assert path.read_text() == "1 3:1:2.0\n0 0:0:1.5\n"
    assert load_libffm(path)[0].shape == (2, 2)  # without the header the width is unknown


@pytest.mark.parametrize(("X", "error", "match"), [
    (np.ones((2, 3)) * (1 + 1j), TypeError, "X must be real"),
    (sp.csr_matrix(np.ones((2, 3)) * 1j), TypeError, "X must be real"),
    (np.ones(3), ValueError, r"X must be 2-D \(n, p\), got X.shape=\(3,\)"),
    (np.ones((2, 3, 1)), ValueError, "X must be 2-D"),
    (np.array([["a", "b", "c"]] * 2), TypeError, "X must be numeric"),
])
def test_dump_rejects_complex_and_non_matrix_X(tmp_path, X, error, match):
    with pytest.raises(error, match=match):
        dump_libffm(tmp_path / "x.ffm", X, np.zeros(2), np.zeros(3, int))
    assert not (tmp_path / "x.ffm").exists()


def test_dump_rejects_complex_y(tmp_path):
    with pytest.raises(TypeError, match="y must be real"):
        dump_libffm(tmp_path / "x.ffm", np.eye(2), np.array([1j, 0]), np.zeros(2, int))


def test_blank_and_label_only_input():
    X, y, fields = load_libffm(["", "  ", "1", "\t0"])
    assert X.shape == (2, 0) and fields.shape == (0,)
    np.testing.assert_array_equal(y, [1.0, 0.0])
    assert load_libffm([])[0].shape == (0, 0)
    assert list(iter_libffm([""], n_features=3)) == []


def test_svmlight_reads_like_scikit_learn(tmp_path, monkeypatch):
    from sklearn.datasets import dump_svmlight_file, load_svmlight_file

    rng = np.random.default_rng(5)
    X = sp.random(30, 12, density=0.3, random_state=2, format="csr",
                  data_rvs=lambda k: rng.normal(size=k) * 10.0 ** rng.integers(-6, 6, k))
    y = rng.integers(-1, 3, 30).astype(float)
    path = tmp_path / "data.svm"
    dump_svmlight_file(X, y, str(path), zero_based=True)
    expected_X, expected_y = load_svmlight_file(str(path), zero_based=True, n_features=12)
    monkeypatch.setattr("gpustat.factorization._libffm._BLOCK_BYTES", 80)
    got_X, got_y = gpustat.load_svmlight(path, n_features=12)
    np.testing.assert_array_equal(got_X.toarray(), expected_X.toarray())
    np.testing.assert_array_equal(got_y, expected_y)
    chunks = list(gpustat.iter_svmlight(path, chunk_rows=7, n_features=12))
    assert [x.shape[0] for x, _ in chunks] == [7, 7, 7, 7, 2]
    np.testing.assert_array_equal(sp.vstack([x for x, _ in chunks]).toarray(),
                                  expected_X.toarray())
    with pytest.raises(ValueError, match=r"load_svmlight: line 2: expected feature:value"):
        gpustat.load_svmlight(["1 3:1", "0 1:2:1"])
    with pytest.raises(ValueError, match=r"load_svmlight: line 1: feature index 12 is beyond "
                                         r"n_features=12"):
        gpustat.load_svmlight(["1 12:1"], n_features=12)
    with pytest.raises(ValueError, match=r"iter_svmlight: line 1: feature must be >= 0"):
        list(gpustat.iter_svmlight(["1 -1:1"], n_features=3))
