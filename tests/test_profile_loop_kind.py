"""Advice in the loop's own words (issue 32, item 5): a token loop or a loop of plain tensors is never told
about images, and the code it is given runs on its data.

minGPT's chargpt and makemore (token batches from a DataLoader) were told to build
``HostLoader(images, labels, batch_size)``, an image loader that would crop and normalise token ids."""

import re

import numpy as np
import pytest
import torch

from hasten.profile.inject.batches import tensor_layout
from hasten.profile.loop_kind import WORDS, loop_kind, resident_code
from hasten.profile.report import format_report
from hasten.profile.verdict import analyse

TOKENS = tensor_layout((torch.zeros(16, 64, dtype=torch.long), torch.zeros(16, 64, dtype=torch.long)))
TENSORS = tensor_layout((torch.zeros(32, 4), torch.zeros(32, 1)))
IMAGES = tensor_layout((torch.zeros(8, 3, 32, 32), torch.zeros(8, dtype=torch.long)))
IMAGE_WORDS = re.compile(r"image|decode|jpeg|pixel|crop|HostLoader|GpuLoader|labels", re.IGNORECASE)


@pytest.mark.parametrize("batch, kind", [
    ((torch.zeros(8, 3, 32, 32), torch.zeros(8, dtype=torch.long)), "images"),
    ((torch.zeros(8, 224, 224, 3, dtype=torch.uint8),), "images"),  # channels last, undecoded range
    ((torch.zeros(8, 1, 28, 28),), "images"),  # MNIST
    ((torch.zeros(16, 64, dtype=torch.long), torch.zeros(16, 64, dtype=torch.long)), "tokens"),
    ({"input_ids": torch.zeros(4, 128, dtype=torch.int32)}, "tokens"),
    ((torch.zeros(32, 4), torch.zeros(32, 1)), "tensors"),  # regression's features
    ((torch.zeros(8, 100, 3),), "tensors"),  # a time series: three dimensions, not an image
    ((torch.zeros(8, 3, 4, 4),), "tensors"),  # 4x4 "images" are too small to be any
    ((torch.zeros(16, 64, dtype=torch.long).float(),), "tensors"),  # floats in two dimensions: not token ids
    ((), "tensors"),
])
def test_the_loop_kind_is_read_from_the_batch_tensors(batch, kind):
    assert loop_kind(tensor_layout(batch)) == kind


def _loader_rank(layout):
    from test_profile_verdict import _rank
    rank = _rank(wait=0.050, work=0.020)  # input-bound: the device-resident loader is among the fixes
    rank["batch_layout"] = layout
    return rank


def _no_loader_rank(layout):
    from test_profile_advice import _tiny_context_rank
    rank = _tiny_context_rank(prepared=False, per_row=False)  # "prepare the data once" is among the fixes
    rank["batch_layout"] = layout
    return rank


def _advice(a) -> list[str]:
    fixes = a.recommendations + [type("R", (), r) for r in a.rejected if r.get("how")]
    return [text for f in fixes for text in (f.fix, f.how, getattr(f, "basis", ""))]


@pytest.mark.parametrize("layout", [TOKENS, TENSORS], ids=["tokens", "tensors"])
@pytest.mark.parametrize("make_rank", [_loader_rank, _no_loader_rank], ids=["DataLoader", "no DataLoader"])
def test_a_token_or_tensor_loop_is_advised_without_image_words(layout, make_rank):
    a = analyse([make_rank(layout)], cpus={"available": 2.0})
    fixes = [r.fix for r in a.recommendations]
    assert any("device-resident" in f or "prepare the data once" in f for f in fixes), fixes
    for text in _advice(a) + [format_report(a)]:
        assert not IMAGE_WORDS.search(text), text


def test_an_image_loop_keeps_the_image_loader():
    a = analyse([_loader_rank(IMAGES)], cpus={"available": 2.0})
    resident = next(r for r in a.recommendations if r.fix == "device-resident loader")
    assert "HostLoader(images, labels, batch_size)" in resident.how
    prep = analyse([_no_loader_rank(IMAGES)], cpus={"available": 2.0})
    assert any("decode the images" in r.fix for r in prep.recommendations)


def _printed(how: str) -> str:
    first, *rest = how.splitlines()
    return "\n".join([first] + [line[5:] if line.startswith("     ") else line for line in rest])


@pytest.mark.parametrize("items", [
    [(torch.full((5,), i), torch.full((5,), -i)) for i in range(23)],   # (x, y) pairs, as chargpt's dataset
    [torch.full((3,), float(i)) for i in range(23)],                     # one tensor per item
    [(torch.full((2,), i), torch.tensor(i), torch.tensor(2 * i)) for i in range(23)],  # three parts
])
def test_the_in_memory_loader_code_hands_out_every_item_once_an_epoch(items):
    layout = tensor_layout(items[0])
    first = "batch[0]" if len(layout) > 2 else "x"  # the inputs, as the code names them
    seen = []
    code = _printed(resident_code(layout, "cpu")).replace("   # an epoch of batches", f"; seen.append({first})")
    exec(compile(code, "<resident>", "exec"), {"torch": torch, "dataset": items, "batch_size": 5, "seen": seen})
    assert [len(b) for b in seen] == [5, 5, 5, 5, 3]
    inputs = [it[0] if isinstance(it, tuple) else it for it in items]
    assert sorted(row[0].item() for row in torch.cat(seen)) == sorted(x[0].item() for x in inputs)


@pytest.mark.parametrize("kind", sorted(WORDS))
def test_the_prepare_once_line_of_every_kind_runs(kind, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    scope = {"np": np, "tokens": np.arange(100, dtype=np.uint16), "images": np.zeros((4, 8, 8, 3), np.uint8),
             "inputs": np.zeros((10, 4)), "targets": np.zeros((10, 1))}
    exec(compile(WORDS[kind].once, f"<{kind}>", "exec"), scope)
    assert any(tmp_path.iterdir())


@pytest.mark.parametrize("layout", [TOKENS, TENSORS, IMAGES, []], ids=["tokens", "tensors", "images", "unseen"])
@pytest.mark.parametrize("make_rank", [_loader_rank, _no_loader_rank], ids=["DataLoader", "no DataLoader"])
def test_every_snippet_of_every_kind_compiles(layout, make_rank):
    a = analyse([make_rank(layout)], cpus={"available": 2.0})
    for r in a.recommendations + [type("R", (), x) for x in a.rejected if x.get("how")]:
        compile(_printed(r.how), f"<{r.fix}>", "exec")


def test_a_segmentation_loop_of_dicts_is_given_code_that_keeps_its_masks_with_its_images():
    # Pytorch-UNet's dataset: {'image': 3 x H x W floats, 'mask': H x W class indices}. hasten's image loader
    # crops and flips images, not masks: the code stacks both once and indexes them together.
    items = [{"image": torch.full((3, 8, 8), float(i)), "mask": torch.full((8, 8), i)} for i in range(7)]
    layout = tensor_layout({k: v[None] for k, v in items[0].items()})
    assert loop_kind(layout) == "images" and [t["key"] for t in layout] == ["image", "mask"]
    code = resident_code(layout, "cpu")
    assert "HostLoader" not in code
    seen = []
    run = _printed(code).replace("   # an epoch of batches", "; seen.append(batch)")
    exec(compile(run, "<resident>", "exec"), {"torch": torch, "dataset": items, "batch_size": 3, "seen": seen})
    assert sorted(b["image"][j, 0, 0, 0].item() for b in seen for j in range(len(b["image"]))) == list(range(7))
    assert all(torch.equal(b["mask"][:, 0, 0].float(), b["image"][:, 0, 0, 0]) for b in seen)  # still paired
    # images with dense targets as a tuple: the same, by position
    pair = tensor_layout((torch.zeros(2, 3, 32, 32), torch.zeros(2, 32, 32, dtype=torch.long)))
    assert "HostLoader" not in resident_code(pair, "cpu") and "labels" not in resident_code(pair, "cpu")
