"""`hasten data pack` on the command line."""

import json

import pytest

from cli_helpers import exit_status
from hasten.cli import main
from hasten.stream.shard_store import open_shards


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


def test_pack_max_side_prints_what_it_resized(photo_folder, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["data", "pack", str(photo_folder), str(out), "--max-side", "128", "--quality", "80"]) == 0
    index = json.loads((out / "index.json").read_text())
    assert index["max_side"] == 128 and index["presize"]["quality"] == 80
    line, = [x for x in capsys.readouterr().out.splitlines() if x.startswith("max side 128:")]
    assert f"{index['presize']['resized']} of 72 images resized (JPEG quality 80" in line and "MB ->" in line


@pytest.mark.parametrize("flags, says", [
    (["--max-side", "0"], "argument --max-side: must be an integer >= 32, got '0'"),
    (["--max-side", "-256"], "argument --max-side: must be an integer >= 32"),
    (["--max-side", "12.5"], "argument --max-side: must be an integer >= 32, got '12.5'"),
    (["--max-side", "big"], "argument --max-side: must be an integer >= 32, got 'big'"),
    (["--max-side", "16"], "argument --max-side: must be an integer >= 32, got '16'"),
    (["--max-side", "256", "--quality", "0"], "argument --quality: must be an integer in 1..100"),
    (["--max-side", "256", "--quality", "101"], "argument --quality: must be an integer in 1..100"),
    (["--quality", "90"], "--quality sets the quality of images re-encoded by --max-side; give --max-side N too"),
])
def test_bad_max_side_and_quality_are_one_line_errors(photo_folder, tmp_path, capsys, flags, says):
    out = tmp_path / "o"
    code = exit_status(["data", "pack", str(photo_folder), str(out), *flags])  # argparse checks as it reads
    assert code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hasten data") and says in lines[0]
    assert not out.exists() or not any(out.iterdir())
