"""parse_layout: train/<class>/ and test/<class>/ from names, one parser for every reader."""

import pytest

from hasten.data.layout import parse_layout
from hasten.errors import DataError

NAMES = ["train/zebra/1.png", "train/ant/2.png", "train/ant/1.png", "test/ant/9.png", "test/zebra/3.png",
         "README.txt"]


def test_classes_sorted_labels_follow_them_samples_in_class_then_name_order():
    layout = parse_layout(NAMES)
    assert layout.root == "" and layout.classes == ["ant", "zebra"] and layout.stray == []
    train = layout.splits["train"]
    assert [NAMES[i] for i in train.indices] == ["train/ant/1.png", "train/ant/2.png", "train/zebra/1.png"]
    assert train.labels == [0, 0, 1]
    assert [NAMES[i] for i in layout.splits["test"].indices] == ["test/ant/9.png", "test/zebra/3.png"]
    assert layout.splits["test"].labels == [0, 1]


def test_a_wrapping_folder_deeper_files_dot_files_and_strays():
    names = ["data/train/b/x/deep.png", "data/train/a/1.png", "data/train/a/.DS_Store", "data/test/a/1.png",
             "data/test/b/1.png", "data/train/loose.png", "elsewhere/train/c/1.png"]
    layout = parse_layout(names)
    assert layout.root == "data/" and layout.classes == ["a", "b"]
    assert [names[i] for i in layout.splits["train"].indices] == ["data/train/a/1.png", "data/train/b/x/deep.png"]
    assert layout.stray == [("data/train/loose.png", "not inside a train/<class>/ folder")]


def test_a_split_missing_a_class_is_refused():
    with pytest.raises(DataError, match=r"pets: train/ and test/ have different classes: only in train: "
                                        r"\['zebra'\]; only in test: none"):
        parse_layout([n for n in NAMES if n != "test/zebra/3.png"], source="pets")


def test_an_empty_class_folder_is_refused_only_when_listed():
    with pytest.raises(DataError, match="empty class folder.*train/moth"):
        parse_layout(NAMES, dirs=["train/moth", "test/moth"])
    parse_layout(NAMES, dirs=["train/ant", "test/ant"])  # a listed folder with files is fine


def test_a_missing_split_names_what_was_found_and_spots_pickled_cifar10():
    with pytest.raises(DataError, match="expected folders train/<class>/ and test/<class>/, found README.txt, train"):
        parse_layout([n for n in NAMES if not n.startswith("test/")])
    with pytest.raises(DataError, match="python version"):
        parse_layout(["cifar-10-batches-py/data_batch_1", "cifar-10-batches-py/test_batch"])
