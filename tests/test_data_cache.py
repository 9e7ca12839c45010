"""cache_key: one key for every cache entry, from the input's content and the options that change it."""

import os
import shutil
import tarfile

import numpy as np
import pytest
from PIL import Image

from hasten.data.cache import cache_key, entry_dir
from hasten.data.dataset import Source
from hasten.data.sources import load_dataset

OPTIONS = {"version": 1, "image_size": None}


@pytest.fixture
def folder(tmp_path):
    """pets/{train,test}/{cat,dog}/0.png, 6x6."""
    root = tmp_path / "pets"
    for split in ("train", "test"):
        for k, c in enumerate(("cat", "dog")):
            (root / split / c).mkdir(parents=True)
            Image.fromarray(np.full((6, 6, 3), 40 * k, np.uint8)).save(root / split / c / "0.png")
    return root


def test_a_directory_key_follows_its_files(folder):
    source = Source("image-folder", folder, "dir")
    key = cache_key(source, OPTIONS)
    assert cache_key(source, dict(OPTIONS)) == key
    os.utime(folder / "train" / "cat" / "0.png", ns=(1, 1))
    touched = cache_key(source, OPTIONS)
    assert touched != key
    (folder / "test" / "dog" / "1.png").write_bytes((folder / "test" / "dog" / "0.png").read_bytes())
    assert cache_key(source, OPTIONS) not in (key, touched)


def test_an_archive_key_follows_its_bytes_not_its_place(folder, tmp_path):
    archive = tmp_path / "pets.tar"
    with tarfile.open(archive, "w") as tf:
        tf.add(folder, arcname="pets")
    copy = tmp_path / "elsewhere" / "pets.tar"
    copy.parent.mkdir()
    shutil.copy(archive, copy)
    os.utime(copy, ns=(1, 1))
    assert cache_key(Source("image-folder", archive, "tar"), OPTIONS) == cache_key(Source("image-folder", copy, "tar"),
                                                                                   OPTIONS)
    assert entry_dir("x", Source("image-folder", copy, "tar"), OPTIONS).name.startswith("pets-")


def test_an_option_that_changes_pixels_changes_the_key_and_others_do_not(folder, tmp_path):
    source = Source("image-folder", folder, "dir")
    assert cache_key(source, OPTIONS) != cache_key(source, {**OPTIONS, "image_size": 4})
    first = load_dataset(folder, workers=1)
    assert not first.cached
    # workers, max_bad_fraction: how to read, not what is read.
    assert load_dataset(folder, workers=2, max_bad_fraction=0.5).cached
    resized = load_dataset(folder, workers=1, image_size=4)
    assert not resized.cached and resized.image_size == (4, 4)
    assert len(list((tmp_path / "cache" / "image_folder").iterdir())) == 2
