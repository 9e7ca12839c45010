"""Safe archive reading and extraction: crafted archives that try to escape are refused."""

import io
import os
import stat
import tarfile
import threading
import zipfile

import pytest

from hasten.data import load_dataset
from hasten.data.archive import archive_stem, iter_entries, iter_files, safe_extract
from hasten.errors import DataError

GOOD = {"a/one.txt": b"one", "a/b/two.txt": b"two" * 100, "three.bin": bytes(range(256))}


def _tar(path, members, mode="w:gz"):
    """members: name -> bytes (a regular file) or a TarInfo-tweaking dict."""
    with tarfile.open(path, mode) as tf:
        for name, spec in members.items():
            info = tarfile.TarInfo(name)
            if isinstance(spec, bytes):
                info.size = len(spec)
                tf.addfile(info, io.BytesIO(spec))
            else:
                for key, value in spec.items():
                    setattr(info, key, value)
                tf.addfile(info)
    return path


def _zip(path, members):
    with zipfile.ZipFile(path, "w") as zf:
        for name, spec in members.items():
            if isinstance(spec, bytes):
                zf.writestr(name, spec)
            else:
                info = zipfile.ZipInfo(name)
                info.external_attr = spec["mode"] << 16
                zf.writestr(info, spec.get("data", b""))
    return path


@pytest.mark.parametrize("suffix,mode", [(".tar", "w"), (".tar.gz", "w:gz"), (".tar.xz", "w:xz"), (".zip", None)])
def test_reads_and_extracts_every_format_alike(tmp_path, suffix, mode):
    archive = tmp_path / f"data{suffix}"
    _zip(archive, GOOD) if mode is None else _tar(archive, GOOD, mode)
    assert dict(iter_files(archive)) == GOOD
    out = safe_extract(archive, tmp_path / "out")
    extracted = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert extracted == GOOD
    tree = dict(iter_files(out))
    assert tree == GOOD


ESCAPES_TAR = {
    "dotdot": ("../evil.txt", b"pwned"),
    "nested dotdot": ("a/../../evil.txt", b"pwned"),
    "absolute": ("/tmp/hasten-evil.txt", b"pwned"),
    "symlink": ("a/link", {"type": tarfile.SYMTYPE, "linkname": "/etc/passwd"}),
    "hardlink": ("a/hard", {"type": tarfile.LNKTYPE, "linkname": "../../etc/passwd"}),
    "char device": ("a/dev", {"type": tarfile.CHRTYPE, "devmajor": 1, "devminor": 3}),
    "fifo": ("a/fifo", {"type": tarfile.FIFOTYPE}),
}


@pytest.mark.parametrize("case", sorted(ESCAPES_TAR))
def test_tar_escapes_are_refused_before_anything_is_written(tmp_path, case):
    name, spec = ESCAPES_TAR[case]
    # The good members come first, so a reader that writes as it goes would already have written them.
    archive = _tar(tmp_path / "evil.tar.gz", {**GOOD, name: spec})
    dest = tmp_path / "x" / "out"
    with pytest.raises(DataError, match=name.lstrip("/").split("/")[-1]):
        safe_extract(archive, dest)
    assert not dest.exists() or not any(dest.rglob("*"))
    assert not (tmp_path / "x" / "evil.txt").exists() and not (tmp_path / "evil.txt").exists()
    with pytest.raises(DataError, match="refus|only regular"):
        list(iter_entries(archive))


ESCAPES_ZIP = {
    "dotdot": ("../evil.txt", b"pwned"),
    "absolute": ("/tmp/hasten-evil.txt", b"pwned"),
    "windows drive": ("C:/evil.txt", b"pwned"),
    "symlink": ("a/link", {"mode": stat.S_IFLNK | 0o777, "data": b"/etc/passwd"}),
    "device": ("a/dev", {"mode": stat.S_IFCHR | 0o600}),
}


@pytest.mark.parametrize("case", sorted(ESCAPES_ZIP))
def test_zip_escapes_are_refused_before_anything_is_written(tmp_path, case):
    name, spec = ESCAPES_ZIP[case]
    archive = _zip(tmp_path / "evil.zip", {**GOOD, name: spec})
    dest = tmp_path / "x" / "out"
    with pytest.raises(DataError, match=name.split("/")[-1]):
        safe_extract(archive, dest)
    assert not dest.exists() or not any(dest.rglob("*"))
    assert not (tmp_path / "x" / "evil.txt").exists()


def test_malicious_archive_stops_load_dataset_with_one_data_error(tmp_path):
    archive = _tar(tmp_path / "evil.tar.gz", {"train/cat/0.png": b"x", "../../evil.png": b"x"})
    with pytest.raises(DataError, match=r"\.\./\.\./evil\.png"):
        load_dataset(archive)


@pytest.mark.parametrize("suffix", [".tar.gz", ".tar.xz", ".zip", ".tar"])
def test_garbage_and_truncated_archives_are_data_errors(tmp_path, suffix):
    garbage = tmp_path / f"garbage{suffix}"
    garbage.write_bytes(b"this is not an archive at all" * 50)
    with pytest.raises(DataError, match="cannot read archive"):
        list(iter_files(garbage))

    whole = tmp_path / f"whole{suffix}"
    big = {f"f{i}.bin": bytes(range(256)) * 40 for i in range(20)}
    _zip(whole, big) if suffix == ".zip" else _tar(whole, big, {".tar.gz": "w:gz", ".tar.xz": "w:xz", ".tar": "w"}[suffix])
    truncated = tmp_path / f"truncated{suffix}"
    truncated.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    with pytest.raises(DataError, match="cannot read archive"):
        list(iter_files(truncated))


@pytest.mark.parametrize("mode,suffix", [("w:xz", ".tar.xz"), ("w:gz", ".tar.gz"), ("w:bz2", ".tar.bz2")])
def test_read_ahead_matches_tarfile_and_stops_when_abandoned(tmp_path, mode, suffix):
    members = {f"d/f{i:03d}.bin": bytes([i % 256]) * (1000 + 37 * i) for i in range(200)}
    archive = _tar(tmp_path / f"many{suffix}", members, mode)
    assert dict(iter_files(archive)) == members
    threads = threading.active_count()
    for i, _ in enumerate(iter_files(archive)):
        if i == 3:
            break  # the generator is closed here; its read-ahead thread must end
    assert threading.active_count() == threads


def test_fifo_in_a_directory_is_an_error_not_a_hang(tmp_path):
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "a.txt").write_bytes(b"a")
    os.mkfifo(tmp_path / "train" / "pipe")
    with pytest.raises(DataError, match="pipe.*not a regular file"):
        list(iter_files(tmp_path))


def test_archive_stem():
    assert archive_stem("/x/cifar10-jpeg.tar.xz") == "cifar10-jpeg"
    assert archive_stem("flowers.ZIP") == "flowers"
    assert archive_stem("plain") == "plain"
