import io
import math

import numpy as np
import pytest
import torch
from PIL import Image

from hasten.decode import backends, turbojpeg
from hasten.errors import BadImageError
from hasten.stream import fused_crop as fc


def test_boxes_follow_the_random_resized_crop_distribution():
    rng = np.random.default_rng(0)
    h = w = 1000
    boxes = [fc.random_resized_box(h, w, rng) for _ in range(4000)]
    for b in boxes:
        assert 0 <= b.top and b.top + b.height <= h and 0 <= b.left and b.left + b.width <= w
    area = np.array([b.height * b.width / (h * w) for b in boxes])
    ratio = np.array([b.width / b.height for b in boxes])
    assert area.min() >= 0.08 - 0.003 and ratio.min() >= 3 / 4 - 0.01 and ratio.max() <= 4 / 3 + 0.01
    # Below half the area every draw fits in a square image on the first try, so there the
    # area is uniform (scale ~ U(0.08, 1)) and the log aspect ratio uniform on [log 3/4, log 4/3].
    small = area[area < 0.5]
    counts, _ = np.histogram(small, bins=6, range=(0.08, 0.5))
    assert counts.min() > 0.75 * counts.mean()
    counts, _ = np.histogram(np.log(ratio[area < 0.5]), bins=6, range=(math.log(3 / 4), math.log(4 / 3)))
    assert counts.min() > 0.75 * counts.mean()
    # Top and left edges are uniform over the free room.
    for room, at in (([w - b.width for b in boxes], [b.left for b in boxes]),
                     ([h - b.height for b in boxes], [b.top for b in boxes])):
        u = np.array([a / r for a, r in zip(at, room) if r > 50])
        counts, _ = np.histogram(u, bins=5, range=(0, 1))
        assert counts.min() > 0.75 * counts.mean()


def test_fallback_is_the_centre_cut_to_the_ratio_range():
    # A 10 x 1000 strip: no 8%..100% box with ratio <= 4/3 fits, so all ten tries fail.
    b = fc.random_resized_box(10, 1000, np.random.default_rng(0))
    assert (b.height, b.width) == (10, round(10 * 4 / 3)) and b.left == (1000 - b.width) // 2
    b = fc.random_resized_box(1000, 10, np.random.default_rng(0))
    assert (b.height, b.width) == (round(10 / (3 / 4)), 10) and b.top == (1000 - b.height) // 2


@pytest.mark.parametrize("side", [100, 223, 224, 447, 448, 895, 896, 1791, 1792, 5000])
def test_dct_scale_is_the_largest_factor_that_still_covers_the_output(side):
    for box in (fc.Box(0, 0, side, side), fc.Box(0, 0, side, 2 * side)):
        f = fc.dct_scale(box, 224)
        covering = [g for g in (1, 2, 4, 8) if box.height // g >= 224 and box.width // g >= 224]
        assert f == (max(covering) if covering else 1)


def _jpeg(photo_jpeg, h, w, seed=0):
    return photo_jpeg(np.random.default_rng(seed), h, w)


def test_fused_crop_equals_decode_then_crop_within_resampling_rounding(photo_jpeg, decoder, resizer):
    """Tolerance: the fused path downsamples in the DCT domain (block averages) where
    the reference downsamples with Pillow's antialiased bilinear filter; measured on
    these photo-like images (with sigma-6 pixel noise, the hardest part to agree on):
    mean |diff| 1.2 levels of 255, worst image 5.1. A box placed even a few pixels
    wrong, or the wrong scale, gives tens of levels."""
    rng = np.random.default_rng(3)
    per_image, factors = [], []
    for i in range(24):
        h, w = (int(v) for v in rng.integers(300, 700, 2))
        data = _jpeg(photo_jpeg, h, w, seed=i)
        fused = fc.fused_crop(data, "x.jpg", 64, rng=fc.example_rng(0, 0, i), flip=False, antialias=True)
        ref = fc.fused_crop(data, "x.jpg", 64, rng=fc.example_rng(0, 0, i), flip=False, fused=False, antialias=True)
        assert fused.shape == ref.shape == (64, 64, 3) and fused.dtype == np.uint8
        per_image.append(np.abs(fused.astype(int) - ref.astype(int)).mean())
        factors.append(fc.dct_scale(fc.random_resized_box(h, w, fc.example_rng(0, 0, i)), 64))
        if factors[-1] == 1:  # no DCT scaling: the very same pixels, except that Pillow's box resize
            # (the reference's when torch runs several threads) takes its edge filter taps from
            # beyond the box, where the fused path resizes the crop alone (as torchvision does)
            e = 1 if resizer == "pillow-resize" else 0
            assert np.array_equal(fused[e:64 - e, e:64 - e], ref[e:64 - e, e:64 - e])
    assert {2, 4} <= set(factors)  # the comparison did exercise scaled decodes
    assert np.mean(per_image) < 2.0 and max(per_image) < 6.0


@pytest.fixture(params=["pillow-resize", "torch-resize"])
def resizer(request, one_thread, monkeypatch):
    """The antialiased resize uses torch's kernel when torch runs one thread (decode workers), else Pillow."""
    if request.param == "pillow-resize":
        monkeypatch.setattr(fc.torch, "get_num_threads", lambda: 2)
    return request.param


def test_reference_path_is_a_plain_pillow_crop_and_resize(photo_jpeg, resizer):
    data = _jpeg(photo_jpeg, 375, 500, seed=7)
    rng_a, rng_b = fc.example_rng(1, 2, 3), fc.example_rng(1, 2, 3)
    ours = fc.fused_crop(data, "x.jpg", 96, rng=rng_a, flip=False, fused=False, antialias=True)
    box = fc.random_resized_box(375, 500, rng_b)
    img = Image.open(io.BytesIO(data)).convert("RGB")
    theirs = np.asarray(img.crop((box.left, box.top, box.left + box.width, box.top + box.height))
                        .resize((96, 96), Image.BILINEAR))
    # Pillow's box resize reads filter support from just outside the box, so border pixels
    # can differ; torch rounds its fixed-point weights slightly differently (a few pixels off by a level or more).
    diff = np.abs(ours.astype(int) - theirs.astype(int))[2:-2, 2:-2]
    assert diff.mean() < 0.1 and np.percentile(diff, 99) <= 1


def test_eval_crop_is_resize_then_centre_crop(photo_jpeg, decoder):
    data = _jpeg(photo_jpeg, 600, 800, seed=2)
    ours = fc.fused_crop(data, "x.jpg", 112, fused=False, antialias=True).astype(int)
    img = Image.open(io.BytesIO(data)).convert("RGB")
    short = round(112 / fc.EVAL_CROP_FRACTION)  # 128: resize the shorter side, then crop 112
    resized = np.asarray(img.resize((round(800 * short / 600), short), Image.BILINEAR)).astype(int)
    top, left = (short - 112) // 2, (resized.shape[1] - 112) // 2
    ref = resized[top:top + 112, left:left + 112]
    # The two round the centre differently (box edges ~1 source pixel apart, 1/4 of an output
    # pixel: ~2.5 levels on these images' steepest gradients); a wrong crop fraction or centre gives tens.
    assert np.abs(ours - ref).mean() < 3.5
    fused = fc.fused_crop(data, "x.jpg", 112).astype(int)
    assert np.abs(fused - ours).mean() < 2.0


def test_flip_mirrors_the_same_crop(photo_jpeg):
    data = _jpeg(photo_jpeg, 300, 400)
    a = fc.fused_crop(data, "x.jpg", 48, rng=fc.example_rng(0, 0, 5), flip=False)
    b = fc.fused_crop(data, "x.jpg", 48, rng=fc.example_rng(0, 0, 5), flip=True)
    assert np.array_equal(a[:, ::-1], b) and not np.array_equal(a, b)


def test_large_boxes_are_decoded_at_reduced_scale(photo_jpeg, decoder, monkeypatch):
    shapes = []

    def whole_spy(real):
        def spy(*args):
            out = real(*args)
            shapes.append(out.shape[:2])
            return out
        return spy

    def region_spy(data, box, scale, name):
        out = real_region(data, box, scale, name)
        shapes.append((scale, out[0].shape[:2]))
        return out

    real_region = turbojpeg.decode_region
    for whole in ("decode_simplejpeg", "decode_pillow"):
        monkeypatch.setattr(backends, whole, whole_spy(getattr(backends, whole)))
    monkeypatch.setattr(turbojpeg, "decode_region", region_spy)
    data = _jpeg(photo_jpeg, 1200, 1600)
    fc.fused_crop(data, "x.jpg", 128)  # centre box 1050 x 1050 -> 1/8 gives 131 >= 128
    if decoder == "turbojpeg":  # only the box's rows, from an iMCU boundary on the left, at 1/8
        (scale, (h, w)), = shapes
        assert scale == (1, 8) and abs(h - 1050 / 8) <= 1 and 1050 / 8 - 1 <= w <= 1050 / 8 + 3
    else:
        assert shapes[-1] == (150, 200)


def test_bad_bytes_are_a_named_bad_image():
    with pytest.raises(BadImageError, match="broken.jpg"):
        fc.fused_crop(b"\xff\xd8\xff" + b"\x00" * 50, "broken.jpg", 32, rng=np.random.default_rng(0))
    with pytest.raises(BadImageError, match="text.jpg"):
        fc.fused_crop(b"hello", "text.jpg", 32)


@pytest.mark.parametrize("opencv", [True, False])
def test_default_resize_is_plain_bilinear_of_the_decoded_box(photo_jpeg, decoder, opencv, one_thread, monkeypatch):
    """Without antialias, every decoder path resizes the box (rounded to whole pixels of the
    DCT-scaled decode) with plain bilinear: OpenCV's when installed, else torch's (the same
    filter, within a level of rounding)."""
    if opencv and fc._opencv() is None:
        pytest.skip("OpenCV is not installed")
    if not opencv:
        monkeypatch.setattr(fc, "_cv2", False)
    for i in range(6):
        data = _jpeg(photo_jpeg, 375, 500, seed=i)
        rng = fc.example_rng(0, 0, i)
        ours = fc.fused_crop(data, "x.jpg", 96, rng=rng, flip=False).astype(int)
        box = fc.random_resized_box(375, 500, fc.example_rng(0, 0, i))
        f = fc.dct_scale(box, 96)
        full = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
        if f > 1:  # the reference downsamples by block averages, as the DCT-scaled decode does
            h, w = (full.shape[0] // f) * f, (full.shape[1] // f) * f
            full = full[:h, :w].reshape(h // f, f, w // f, f, 3).mean(axis=(1, 3)).round().astype(np.uint8)
        r = fc._scaled_box(box, f, full.shape[:2])
        crop = full[r.top:r.top + r.height, r.left:r.left + r.width]
        crop = torch.from_numpy(np.ascontiguousarray(crop)).permute(2, 0, 1)[None]
        ref = torch.nn.functional.interpolate(crop.float(), size=(96, 96), mode="bilinear", antialias=False,
                                              align_corners=False)[0].permute(1, 2, 0).round().numpy()
        diff = np.abs(ours - ref)
        # JPEG decoders differ by a level or two (chroma upsampling, IDCT); a wrong box or filter gives tens.
        assert diff.mean() < 2.5, (i, f, diff.mean())


def test_example_rngs_give_example_rngs_streams_and_keys_are_independent():
    rngs = fc.ExampleRngs()
    for seed, epoch, key in [(0, 0, 0), (1, 2, 3), (7, 0, 2**40 + 5), (2**33 + 1, 5, 12)]:
        fresh = fc.example_rng(seed, epoch, key)
        want = [fresh.uniform(0.08, 1.0), int(fresh.integers(0, 300)), fresh.random(), int(fresh.integers(0, 2**40))]
        g = rngs(seed, epoch, key)
        g.random()  # a partly used generator is re-keyed from its start
        g = rngs(seed, epoch, key)
        assert [g.uniform(0.08, 1.0), int(g.integers(0, 300)), g.random(), int(g.integers(0, 2**40))] == want
    firsts = {fc.example_rng(s, e, k).random() for s in (0, 1) for e in (0, 1) for k in (0, 1, 2**32)}
    assert len(firsts) == 12  # seed, epoch and key each change the stream


def test_crop_resized_into_its_slot_equals_the_crop_placed_after(photo_jpeg):
    data = _jpeg(photo_jpeg, 375, 500, seed=4)
    batch = np.zeros((3, 48, 48, 3), np.uint8)
    for i, flip in enumerate((False, True)):
        alone = fc.fused_crop(data, "x.jpg", 48, rng=fc.example_rng(0, 0, 9), flip=flip)
        placed = fc.fused_crop(data, "x.jpg", 48, rng=fc.example_rng(0, 0, 9), flip=flip, out=batch[i])
        assert placed is batch[i] or np.shares_memory(placed, batch[i])
        assert np.array_equal(batch[i], alone)
    assert np.array_equal(batch[1], batch[0][:, ::-1]) and not batch[2].any()


def test_a_large_png_is_cropped_where_its_box_is():
    """A PNG has no DCT scale: its box is cut at full size, the crop of the reference path
    (the box's coordinates at a JPEG's 1/8, cut from the full-size image, were another region)."""
    y, x = np.mgrid[0:800, 0:1000]
    img = np.stack([x * 255 // 1000, y * 255 // 800, (x // 50 % 2) * 255], axis=-1).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, "PNG")
    for rng in (None, fc.example_rng(0, 0, 1)):
        fused = fc.fused_crop(buf.getvalue(), "x.png", 64, rng=rng, flip=False)
        ref = fc.fused_crop(buf.getvalue(), "x.png", 64, rng=fc.example_rng(0, 0, 1) if rng else None, flip=False,
                            fused=False)
        assert np.array_equal(fused, ref)
