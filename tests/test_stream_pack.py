import json
import tarfile

import numpy as np
import pytest

from hasten.data.layout import parse_layout
from hasten.errors import DataError
from hasten.stream.pack import pack
from hasten.stream.shard_store import open_shards
from hasten.stream.tar_members import read_shard


def _source_examples(root, split):
    """(file bytes, label) of a split in the layout's order, read independently of pack."""
    names = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    layout = parse_layout(names)
    files = layout.splits[split]
    return [((root / names[i]).read_bytes(), label) for i, label in zip(files.indices, files.labels)], layout.classes


def _packed_examples(out, split):
    shards = open_shards(out, split)
    got = []
    for i in range(len(shards)):
        records = read_shard(shards[i], shards.names[i])
        assert len(records) == shards.examples[i]
        got += [(r.data, r.label) for r in records]
    return got, shards


@pytest.mark.parametrize("shuffle", [True, False])
def test_round_trip_gives_every_image_and_label_back_in_the_seeded_order(photo_folder, tmp_path, shuffle):
    index = pack(photo_folder, tmp_path / "out", shard_bytes=60_000, seed=5, shuffle=shuffle)
    for split in ("train", "test"):
        want, classes = _source_examples(photo_folder, split)
        got, shards = _packed_examples(tmp_path / "out", split)
        order = np.random.default_rng(5).permutation(len(want)) if shuffle else np.arange(len(want))
        assert got == [want[k] for k in order]  # bytes unchanged, labels right, order as documented
        assert shards.classes == classes == ["ant", "bee", "cat"]
        assert index["splits"][split]["examples"] == len(want) == sum(shards.examples)
        assert [s["bytes"] for s in index["splits"][split]["shards"]] == [p.stat().st_size for p in shards.paths]
    assert len(index["splits"]["train"]["shards"]) > 3  # the size bound did split the set


def test_shards_respect_the_size_bound_and_packing_is_deterministic(photo_folder, tmp_path):
    bound = 50_000
    a = pack(photo_folder, tmp_path / "a", shard_bytes=bound)
    b = pack(photo_folder, tmp_path / "b", shard_bytes=bound)
    assert a == b
    for split in ("train", "test"):
        for shard in a["splits"][split]["shards"]:
            path = tmp_path / "a" / shard["name"]
            # tarfile pads the file to 10 KiB records; the members themselves stay within the bound.
            with tarfile.open(path) as tf:
                members = tf.getmembers()
                used = sum(512 + -(-m.size // 512) * 512 for m in members) + 1024
            assert used <= bound or shard["examples"] == 1
            assert path.read_bytes() == (tmp_path / "b" / shard["name"]).read_bytes()
    assert json.loads((tmp_path / "a" / "index.json").read_text())["classes"] == ["ant", "bee", "cat"]


def test_an_archive_packs_to_the_same_shards_as_its_folder(photo_folder, tmp_path):
    archive = tmp_path / "photos.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:
        tf.add(photo_folder, arcname="photos")
    from_dir = pack(photo_folder, tmp_path / "d", shard_bytes=80_000)
    from_tar = pack(archive, tmp_path / "t", shard_bytes=80_000)
    assert from_dir["splits"] == from_tar["splits"]
    for s in from_dir["splits"]["train"]["shards"]:
        assert (tmp_path / "d" / s["name"]).read_bytes() == (tmp_path / "t" / s["name"]).read_bytes()
    assert not (tmp_path / "t" / ".unpacking").exists()


def test_refuses_a_non_empty_output_and_bad_sizes(photo_folder, tmp_path):
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("x")
    with pytest.raises(DataError, match="not an empty directory"):
        pack(photo_folder, tmp_path / "busy")
    with pytest.raises(ValueError, match="shard_bytes"):
        pack(photo_folder, tmp_path / "new", shard_bytes=10)
