"""`hasten data pack` on the command line."""

import json

import pytest

from hasten.cli import main
from hasten.stream.shards import open_shards


def test_pack_writes_shards_and_index_and_prints_counts(photo_folder, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["data", "pack", str(photo_folder), str(out), "--shard-size-mb", "0.05"]) == 0
    printed = capsys.readouterr().out
    assert "train: 54 images in" in printed and "test: 18 images in" in printed and "3 classes" in printed
    index = json.loads((out / "index.json").read_text())
    assert index["splits"]["train"]["examples"] == 54 and len(index["splits"]["train"]["shards"]) > 1
    assert sum(open_shards(out, "test").examples) == 18


def test_errors_are_one_line(photo_folder, tmp_path, capsys):
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "file").write_text("x")
    for argv in (["data", "pack", str(photo_folder), str(tmp_path / "busy")],
                 ["data", "pack", str(tmp_path / "missing"), str(tmp_path / "o")],
                 ["data", "pack", str(photo_folder), str(tmp_path / "o2"), "--shard-size-mb", "0"]):
        with pytest.raises(SystemExit) as exc:  # argparse: the values are checked where they are read
            main(argv)
        assert exc.value.code == 2
    assert main(["data"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 4 and all(line.startswith("hasten data") and ": error: " in line for line in lines)
    assert "argument outdir:" in lines[0] and "is not empty" in lines[0]
    assert "argument src:" in lines[1] and "does not exist" in lines[1]
    assert "argument --shard-size-mb:" in lines[2]
