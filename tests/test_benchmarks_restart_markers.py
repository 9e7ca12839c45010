"""benchmarks/_restart_markers.py (lossless restart markers and the region decode through them;
tried in hasten data pack and not shipped): the pixels stay the same and a crop equals a full
decode's, which docs/results/imagenet-pipeline.md claims; benchmarks/restart_markers.py
--smoke: it runs, checks that the crops of the marked files are the plain files' (it asserts
so itself), and writes its rows, bytes and conditions."""

import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import hasten.decode.image
from hasten.decode import turbojpeg as tj
from hasten.decode.image import Region, decode
from hasten.errors import BadImageError

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCH))
import _restart_markers as restart  # noqa: E402
import restart_markers  # noqa: E402

needs_both = pytest.mark.skipif(not (tj.available() and restart.available()),
                                reason="no libturbojpeg 3 or no libjpeg of ABI 62 (Pillow's)")


@needs_both
def test_smoke_run_writes_every_configuration_with_its_conditions(tmp_path, photo_folder):
    out = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, str(BENCH / "restart_markers.py"), "--smoke", "--folder", str(photo_folder),
                           "--sizes", "64", "--out", str(out)], capture_output=True, text=True, cwd=BENCH, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["images"] == 24 and data["refused"] == 0
    got = {(r["size"], r["stage"], r["files"]) for r in data["rows"]}
    assert got == {(64, stage, files) for stage, files in [
        ("region decode", "as given"), ("region decode", "restart markers"), ("region decode", "intervals prebuilt"),
        ("fused crop", "as given"), ("fused crop", "restart markers")]}
    assert all(r["mean"] > 0 for r in data["rows"])
    assert data["bytes"]["restart_markers"] > data["bytes"]["optimised_no_markers"]  # the markers cost bytes
    assert "load_average_before" in data["conditions"]


@needs_both
def test_the_default_set_is_imagenet_pipelines_texture_and_takes_markers():
    name, datas = restart_markers.load_set(None, 2, seed=0)
    assert "synthetic texture" in name and len(datas) == 2
    for data in datas:
        assert restart.layout(data).interval == 0 and restart.add_restart_markers(data) is not None


def _jpeg(h=375, w=500, subsampling="4:2:0", seed=0, mode="RGB", **save):
    """A smooth picture with texture (a photograph's mix of low and high frequencies)."""
    rng = np.random.default_rng(seed)
    coarse = rng.normal(128, 60, (h // 16 + 2, w // 16 + 2, 3)).clip(0, 255).astype(np.uint8)
    img = np.asarray(Image.fromarray(coarse).resize((w, h), Image.BICUBIC), np.float64)
    img = np.clip(img + rng.normal(0, 10, img.shape), 0, 255).astype(np.uint8)
    picture = Image.fromarray(img).convert(mode) if mode != "RGB" else Image.fromarray(img)
    buf = io.BytesIO()
    if mode == "RGB":
        save.setdefault("subsampling", subsampling)
    picture.save(buf, "JPEG", quality=90, **save)
    return buf.getvalue()


def _intervals(data):
    lay = restart.layout(data)
    return lay.interval, len(restart._search_starts(data, lay.scan)), lay.mcu_rows * lay.mcu_cols


@needs_both
@pytest.mark.parametrize("size, subsampling, mode", [
    ((375, 500), "4:2:0", "RGB"), ((301, 403), "4:4:4", "RGB"), ((257, 511), "4:2:2", "RGB"),
    ((123, 77), "4:2:0", "RGB"), ((200, 330), None, "L")])
def test_markers_are_added_without_changing_a_pixel(size, subsampling, mode):
    data = _jpeg(*size, subsampling=subsampling, mode=mode)
    assert restart.layout(data).interval == 0
    out = restart.add_restart_markers(data)
    assert out is not None and out != data
    interval, n, mcus = _intervals(out)
    assert interval >= 1 and n * interval == mcus  # whole intervals, every MCU row starts one
    same = [np.asarray(Image.open(io.BytesIO(d)).convert("RGB")) for d in (data, out)]
    assert np.array_equal(*same)  # Pillow (its own libjpeg) decodes the same pixels
    assert np.array_equal(tj.decode_region(data)[0], tj.decode_region(out)[0])


# 3 subsamplings x 2 interval sizes (one MCU per interval: the narrowest pieces, and the
# default), each at 4 DCT scales (an MCU of 1 to 16 scaled pixels), over 4 edge boxes
# (whole image, bottom-right corner, a pixel, the last column) and 12 random ones.
@needs_both
@pytest.mark.parametrize("subsampling", ["4:2:0", "4:4:4", "4:2:2"])
@pytest.mark.parametrize("interval_px", [8, 32])
def test_region_through_the_intervals_is_the_full_decode_cut_to_the_box(subsampling, interval_px):
    data = restart.add_restart_markers(_jpeg(subsampling=subsampling), interval_px=interval_px)
    for scale in [(1, 1), (1, 2), (1, 8), (3, 8)]:
        full, _ = tj.decode_region(data, None, scale)
        h, w = full.shape[:2]
        rng = np.random.default_rng(scale[0] * 10 + scale[1] + interval_px)
        boxes = [(0, 0, h, w), (h - 7, w - 9, 7, 9), (5, 17, 1, 1), (0, w - 1, h, 1)]
        for _ in range(12):
            bh, bw = int(rng.integers(1, h + 1)), int(rng.integers(1, w + 1))
            boxes.append((int(rng.integers(0, h - bh + 1)), int(rng.integers(0, w - bw + 1)), bh, bw))
        for top, left, bh, bw in boxes:
            got = restart.decode_region(data, (top, left, bh, bw), scale)
            assert got is not None
            region, (r_top, r_left) = got
            assert r_top == top and r_left <= left and region.shape[0] == bh
            assert np.array_equal(region[:, left - r_left:left - r_left + bw],
                                  full[top:top + bh, left:left + bw]), (scale, top, left, bh, bw)


@needs_both
def test_the_region_decode_reads_only_the_intervals_under_the_box(monkeypatch):
    data = restart.add_restart_markers(_jpeg(480, 640), interval_px=32)
    seen = []
    real = tj.decode_region
    monkeypatch.setattr(tj, "decode_region", lambda d, *a, **k: (seen.append(d), real(d, *a, **k))[1])
    restart.decode_region(data, (200, 300, 40, 60))
    (small,) = seen
    # Rows 198-241 and columns 298-361 (the box and tj.EDGE around it): MCU rows 12-15 of 30,
    # intervals 9-11 of 20 (32 px each).
    assert len(small) < len(data) / 10
    assert restart.layout(small).height == 4 * 16 and restart.layout(small).width == 3 * 32


@needs_both
def test_the_benchmarks_fused_crop_route_uses_the_markers_and_gives_the_same_crop(monkeypatch):
    plain = _jpeg(300, 420)
    marked = restart.add_restart_markers(plain)
    calls = []
    real = restart.decode_region
    monkeypatch.setattr(restart, "decode_region", lambda *a, **k: calls.append(real(*a, **k)) or calls[-1])
    region = Region(17, 51, 100, 111)
    for scale in [(1, 1), (1, 2)]:
        want = decode(plain, region=region, scale=scale)
        with restart_markers.image_decode_with_markers():
            got = decode(marked, region=region, scale=scale)
            assert np.array_equal(decode(plain, region=region, scale=scale), want)  # no markers: the usual decode
        assert np.array_equal(got, want)
    assert len(calls) == 4 and [c is None for c in calls] == [False, True, False, True]
    assert hasten.decode.image.turbojpeg is tj  # put back


@needs_both
def test_files_without_a_usable_layout_are_left_to_the_usual_decode():
    plain = _jpeg()
    progressive = _jpeg(progressive=True)
    assert restart.decode_region(plain, (0, 0, 10, 10)) is None
    assert restart.layout(progressive) is None
    assert restart.add_restart_markers(progressive) is None  # not carried over exactly: kept as it is
    cmyk = _jpeg(mode="CMYK")
    assert restart.add_restart_markers(cmyk) is None
    # Intervals that do not divide the MCU row (another tool's restart markers): the usual decode.
    buf = io.BytesIO()
    Image.open(io.BytesIO(plain)).save(buf, "JPEG", quality=90, restart_marker_blocks=3)  # 32 MCUs per row
    assert restart.layout(buf.getvalue()).interval == 3
    assert restart.decode_region(buf.getvalue(), (0, 0, 10, 10)) is None


@needs_both
def test_application_segments_are_kept():
    exif = Image.Exif()
    exif[0x010E] = "a description"  # ImageDescription
    data = _jpeg(exif=exif.tobytes(), comment=b"a comment")
    out = restart.add_restart_markers(data)
    with Image.open(io.BytesIO(out)) as img:
        assert img.getexif()[0x010E] == "a description"
        assert img.info.get("comment") == b"a comment"


@needs_both
def test_damaged_input_is_refused_and_damaged_output_named():
    data = _jpeg()
    assert restart.add_restart_markers(data[: len(data) // 2]) is None
    assert restart.add_restart_markers(b"not a jpeg") is None
    with pytest.raises(ValueError, match="interval_px"):
        restart.add_restart_markers(data, interval_px=0)
    marked = restart.add_restart_markers(data)
    lay = restart.layout(marked)
    starts = restart._search_starts(marked, lay.scan)
    cut = marked[:starts[40] + 3] + b"\xff\xd9"  # cut inside an interval under the box
    assert restart.decode_region(cut, (0, 0, 200, 300)) is None  # fewer intervals than the header says
    broken = marked[:starts[40] + 3] + b"\xff\xd9" + marked[starts[40] + 5:]  # an EOI inside an interval
    with pytest.raises(BadImageError, match="x.jpg"):
        restart.decode_region(broken, (0, 0, 200, 300), name="x.jpg")


@needs_both
def test_stored_interval_lengths_are_used_only_when_they_match_the_scan():
    data = restart.add_restart_markers(_jpeg(320, 480))
    lay = restart.layout(data)
    assert lay.index > 0
    assert np.array_equal(restart._interval_starts(data, lay), restart._search_starts(data, lay.scan))
    full, _ = tj.decode_region(data)
    box = (100, 150, 60, 90)
    # Lengths that disagree with the scan (one interval 1 byte longer, the next 1 shorter:
    # the same total): the markers are not where they say, so the scan is searched instead.
    wrong = bytearray(data)
    lengths = np.frombuffer(wrong, "<u2", 2, lay.index).copy()
    wrong[lay.index:lay.index + 4] = (lengths + np.array([1, -1])).astype("<u2").tobytes()
    wrong = bytes(wrong)
    found = restart._interval_starts(wrong, restart.layout(wrong))
    assert np.array_equal(found, restart._search_starts(wrong, lay.scan))
    for d in (data, wrong):
        region, (_, left) = restart.decode_region(d, box)
        assert np.array_equal(region[:, box[1] - left:box[1] - left + box[3]], full[100:160, 150:240])
    # Marked again, a marked file gets one index, its own.
    again = restart.add_restart_markers(data)
    assert again.count(restart._INDEX_ID) == 1
