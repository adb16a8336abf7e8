"""Input checks of the importers that test_importers.py leaves out (found by mutation testing):
the bounds on sparse id spaces, CSV column counts, and the importers' split and label rules,
each against a value worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from gnnio.errors import DatasetError
from gnnio.importers._common import (
    DENSE_FLOOR,
    check_dense_ids,
    labels_to_int64,
    parse_csv_block,
)


def test_labels_just_past_the_dense_floor_are_bounded():
    # largest label 1024 means 1025 classes > DENSE_FLOOR, with only 2 in use: refused
    assert DENSE_FLOOR == 1024
    with pytest.raises(DatasetError, match="label 1,024 implies 1,025 classes"):
        labels_to_int64(np.array([0, 1024]), "lab.npy")
    assert labels_to_int64(np.array([0, 1023]), "lab.npy").tolist() == [0, 1023]  # 1024 classes


def test_dense_ids_accept_up_to_twice_the_distinct_count():
    check_dense_ids(1199, 600, "f", "label", "classes")  # 1200 ids for 600 in use: accepted
    with pytest.raises(DatasetError, match="1,201 classes, but only 600 distinct labels"):
        check_dense_ids(1200, 600, "f", "label", "classes")


def test_csv_block_with_the_wrong_column_count_is_refused():
    block = b"0,1,7\n2,3,7\n"  # three consistent columns where two are expected
    with pytest.raises(DatasetError, match="expected 2 comma-separated columns, found 3"):
        parse_csv_block(block, np.int64, 2, "edge.csv", first_line=4)
    assert parse_csv_block(block, np.int64, 3, "edge.csv").tolist() == [[0, 1, 7], [2, 3, 7]]
