"""The device-resident loader over a dataset with random transforms (issue 43: "a fix that changes the
training, labelled as not changing it"): stacking the items once freezes every random crop and flip."""

import pytest
import torch

from hasten.profile.inject.batches import tensor_layout
from hasten.profile.report import format_report
from hasten.profile.verdict import analyse
from test_profile_loop_kind import IMAGES, TOKENS, _printed
from test_profile_verdict import _rank

VARIANT = "decoded images resident, augmentation per step (as hasten's own loaders do)"


def _image_rank(random, decoded=None, dataset_len=1024, where="rank"):
    rank = _rank(wait=0.050, work=0.020)  # input-bound
    rank.update(batch_layout=IMAGES, dataset_len=dataset_len, batch_size=8, batch_bytes=8 * 3 * 32 * 32 * 4)
    fields = {"random_transforms": random, "decoded_sample_bytes": decoded}
    if where == "rank":
        rank.update(fields)
    else:  # on the training loader's entry
        rank["loaders"] = [{"name": "DataLoader(ImageFolder)", "training": True, "batches": 30, **fields}]
    return rank


def _fixes(a):
    return {r.fix: r for r in a.recommendations}


@pytest.mark.parametrize("where", ["rank", "loader"])
def test_random_transforms_make_the_resident_loader_change_the_math_and_add_the_per_step_variant(where):
    a = analyse([_image_rank(True, decoded=3 * 32 * 32, where=where)], cpus={"available": 2.0})
    fixes = _fixes(a)
    frozen = fixes["device-resident loader"]
    # what is known is that two reads of an index differ, not that they are crops and flips (pytorch/examples'
    # siamese_network draws its pairs at random, and was told its crops and flips were frozen)
    assert frozen.changes_math and "freezes what each item draws at random (two reads" in frozen.math_note
    assert "changes the math: freezes what each item draws at random" in format_report(a)
    variant = fixes[VARIANT]
    assert not variant.changes_math and variant.apply is None  # a code change: not verified
    assert "augment=Augmentation(translate=4, flip='random')" in variant.how
    compile(_printed(variant.how), "<variant>", "exec")
    # its memory: the decoded items, 3 KiB each, times the dataset's 1024: 3 MiB
    assert "3 MiB (decoded items" in variant.basis


def test_no_random_transforms_no_change_and_no_variant():
    for random in (False, None):
        fixes = _fixes(analyse([_image_rank(random, decoded=3 * 32 * 32)], cpus={"available": 2.0}))
        assert not fixes["device-resident loader"].changes_math and VARIANT not in fixes
    unchecked = _fixes(analyse([_image_rank(None)], cpus={"available": 2.0}))["device-resident loader"]
    assert "was not checked" in unchecked.basis


def test_the_memory_check_counts_decoded_items_not_the_transformed_batch():
    # 224x224 crops in the batch (600 KiB a float item), 1000x750 decoded JPEGs (2.1 MiB each): 4,000 of them
    # fit in 8 GiB as batched (2.3 GiB) and do not decoded (8.4 GiB)
    rank = _image_rank(True, decoded=3 * 1000 * 750, dataset_len=4000)
    rank["batch_bytes"] = 8 * 3 * 224 * 224 * 4
    fixes = _fixes(analyse([rank], cpus={"available": 2.0}, memory_bytes=8 * 2**30))
    assert "device-resident loader" not in fixes and VARIANT not in fixes
    fits = _fixes(analyse([rank], cpus={"available": 2.0}, memory_bytes=64 * 2**30))
    assert "device-resident loader" in fits and VARIANT in fits


def test_a_token_loop_with_random_transforms_gets_no_image_variant():
    rank = _image_rank(True, decoded=64 * 8)
    rank["batch_layout"] = TOKENS
    fixes = _fixes(analyse([rank], cpus={"available": 2.0}))
    assert fixes["device-resident loader"].changes_math and VARIANT not in fixes


def test_the_image_loader_hint_says_what_it_takes_and_does():
    how = _fixes(analyse([_image_rank(False)], cpus={"available": 2.0}))["device-resident loader"].how
    assert "HostLoader(images, labels, batch_size)" in how
    assert "uint8 (N, C, H, W)" in how and "int64 (N,)" in how
    assert "load_dataset" in how  # where decoded images come from
    assert "normalises" in how and "does not augment" in how  # HostLoader's defaults, said


def test_the_printed_image_loader_runs_on_decoded_images():
    from hasten.data.device_loader import Augmentation
    from hasten.data.host_loader import HostLoader
    hasten = type("hasten", (), {"data": type("data", (), {"host_loader": type("m", (), {"HostLoader": HostLoader})})})
    fixes = _fixes(analyse([_image_rank(True, decoded=3 * 32 * 32)], cpus={"available": 2.0}))
    images, labels = torch.randint(0, 255, (16, 3, 32, 32), dtype=torch.uint8), torch.arange(16)
    for name in ("device-resident loader", VARIANT):
        scope = {"hasten": hasten, "images": images, "labels": labels, "batch_size": 4, "Augmentation": Augmentation}
        exec(compile(_printed(fixes[name].how), name, "exec"), scope)
        x, y = next(iter(scope["loader"]))
        assert x.shape == (4, 3, 32, 32) and x.dtype == torch.float32 and y.shape == (4,)
