"""`hasten train --loader stream`: tar shards, and the normalisation of streamed batches."""

import numpy as np
import pytest
import torch
from conftest import write_image_folder

from hasten.data.normalize import normalize
from hasten.recipes.train import TrainConfig, train
from hasten.recipes.train_input import STREAM_MEAN, STREAM_STD, StreamNormalizer, packed_name, stream_input
from hasten.stream.pack import pack


@pytest.fixture(scope="module")
def shard_dir(photo_folder, tmp_path_factory):
    out = tmp_path_factory.mktemp("shards") / "set"
    pack(photo_folder, out, shard_bytes=40_000)
    return out


def test_train_runs_on_shards(shard_dir, one_thread):
    cfg = TrainConfig(data=str(shard_dir), loader="stream", model="resnet10", width=8, image_size=32,
                      batch_size=8, epochs=2, warmup_epochs=0, device="cpu")
    report = train(cfg)
    assert report["steps"] == 2 * (54 // 8) and 0 <= report["accuracy"] <= 1
    assert report["images_per_epoch"] == 48


@pytest.mark.parametrize("source", ["shards", "folder"])
def test_stream_input_resumes_the_data_position(shard_dir, photo_folder, source):
    data_path = shard_dir if source == "shards" else photo_folder
    cfg = TrainConfig(data=str(data_path), loader="stream", image_size=24, batch_size=6, device="cpu")
    data = stream_input(cfg, "cpu", 0, 1, 6)
    assert data.image_size == 24 and data.num_classes == 3 and data.steps_per_epoch == 9
    # Packed shards: the fused random-resized crop; a folder: the small-image crop it had before.
    assert data.position.crop == ("random-resized" if source == "shards" else "pad-crop")
    full = [y.tolist() for _, y in data.epoch_batches(1)]
    assert len(full) == 9
    again = stream_input(cfg, "cpu", 0, 1, 6)
    batches = data.epoch_batches(1)
    for _ in range(4):
        next(batches)
    state = data.position.state_dict()
    again.position.load_state_dict(state)
    assert [y.tolist() for _, y in again.epoch_batches(1)] == full[4:]
    assert sum(len(y) for _, y in data.test_batches()) == 18  # each test image once


def test_a_folder_of_photos_gets_the_region_decode_without_packing(tmp_path, photo_jpeg):
    """An ImageNet-layout folder of photos (shorter side >= 224) is streamed with the fused
    random-resized crop, as its packed shards would be; small images keep the padded crop."""
    rng = np.random.default_rng(5)
    root = write_image_folder(tmp_path / "photos", ("ant", "bee"), {"train": 3, "test": 1},
                              lambda c, i: photo_jpeg(rng, 240, 320))
    cfg = TrainConfig(data=str(root), loader="stream", image_size=32, batch_size=2, device="cpu")
    data = stream_input(cfg, "cpu", 0, 1, 2)
    assert data.position.crop == "random-resized"
    x, _ = next(iter(data.epoch_batches(0)))
    assert tuple(x.shape) == (2, 3, 32, 32)


def test_packed_shards_are_named_for_what_they_were_packed_from(shard_dir, photo_folder, tmp_path):
    """Results named a packed CIFAR-10-JPEG `shards`, the folder it was written to."""
    cfg = TrainConfig(data=str(shard_dir), loader="stream", image_size=24, batch_size=6, device="cpu")
    assert shard_dir.name == "set" and stream_input(cfg, "cpu", 0, 1, 6).name == photo_folder.name
    pack(photo_folder, tmp_path / "shards")
    index = tmp_path / "shards" / "index.json"
    index.write_text(index.read_text().replace(f'"source": "{photo_folder.name}"', '"source": "cifar10-jpeg.tar.xz"'))
    assert packed_name(tmp_path / "shards") == "cifar10-jpeg"
    index.unlink()  # shards without an index: the folder's name
    assert packed_name(tmp_path / "shards") == "shards"


# --- normalising streamed batches: constants on the device once, one op per batch -----------------

@pytest.fixture(params=["shards", "folder"])
def stream_source(request, shard_dir, photo_folder):
    return {"shards": shard_dir, "folder": photo_folder}[request.param]


def _count_constants(monkeypatch) -> list:
    """Tensors made from Python numbers from now on: on CUDA, each a blocking host-to-device copy."""
    made = []
    for name in ("tensor", "as_tensor"):
        real = getattr(torch, name)

        def counting(data, *args, _real=real, **kwargs):
            if isinstance(data, (list, tuple, float, int)):
                made.append(data)
            return _real(data, *args, **kwargs)

        monkeypatch.setattr(torch, name, counting)
    return made


@pytest.mark.parametrize("channels_last", [False, True])
def test_streamed_batches_make_no_constants_per_step(stream_source, channels_last, monkeypatch):
    cfg = TrainConfig(data=str(stream_source), loader="stream", image_size=24, batch_size=6, device="cpu",
                      channels_last=channels_last)
    data = stream_input(cfg, torch.device("cpu"), 0, 1, 6)
    std, mean = torch.tensor(STREAM_STD).view(1, 3, 1, 1), torch.tensor(STREAM_MEAN).view(1, 3, 1, 1)
    made = _count_constants(monkeypatch)
    batches = data.epoch_batches(0)
    got = [next(batches) for _ in range(4)] + list(data.test_batches())[:2]
    assert made == []
    for x, _ in got:
        # The layout asked for, whatever the decoder's (NHWC views): an NCHW model fed NHWC
        # inputs converts its weights at every convolution.
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        assert x.dtype == torch.float32 and x.is_contiguous(memory_format=fmt)
        # Undoing the normalisation gives back the uint8 pixels.
        pixels = (x * std + mean) * 255
        assert (pixels - pixels.round()).abs().max() < 1e-3 and pixels.min() > -1e-3 and pixels.max() < 255 + 1e-3

def test_stream_normalizer_is_normalize_in_one_op():
    g = torch.Generator().manual_seed(0)
    nhwc = torch.randint(0, 256, (4, 9, 7, 3), dtype=torch.uint8, generator=g).permute(0, 3, 1, 2)
    norm = StreamNormalizer(STREAM_MEAN, STREAM_STD, "cpu")
    torch.testing.assert_close(norm(nhwc), normalize(nhwc, STREAM_MEAN, STREAM_STD), rtol=0, atol=1e-6)
    assert norm(nhwc).is_contiguous()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        norm(nhwc)
    # One arithmetic op; the old map took four (float, /255, -mean, /std).
    ops = {e.key for e in prof.key_averages()}
    assert "aten::addcmul" in ops and not ops & {"aten::div", "aten::sub", "aten::mul", "aten::add",
                                                  "aten::rsub", "aten::true_divide"}, ops


@pytest.mark.parametrize("sides, expected", [((32, 32), 32), ((40, 28), 28), ((260, 300), 224)])
def test_shards_train_at_the_images_own_size_below_224(tmp_path, photo_jpeg, sides, expected):
    # Without --image-size, 32 px images (CIFAR-10) were upsampled to 224 px: 49x the pixels to
    # resize, normalise and train on. Larger images (ImageNet) still train at 224.
    rng = np.random.default_rng(0)
    folder = write_image_folder(tmp_path / "src", ("a", "b"), {"train": 4, "test": 2},
                                lambda c, i: photo_jpeg(rng, *sides))
    pack(folder, tmp_path / "shards")
    cfg = TrainConfig(data=str(tmp_path / "shards"), loader="stream", batch_size=4, device="cpu")
    data = stream_input(cfg, "cpu", 0, 1, 4)
    x, _ = next(data.epoch_batches(0))
    assert data.image_size == expected and tuple(x.shape) == (4, 3, expected, expected)
