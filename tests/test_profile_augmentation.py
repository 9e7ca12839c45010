"""The training dataset's random transforms and one item's size before them, in each rank's record (issue 43).

A device-resident loader decodes once and so freezes every random crop and flip: the analysis
marks it ``[changes the math]`` from ``random_transforms``, and sizes the decoded dataset from
``decoded_sample_bytes``. Read from tests/profile_scripts/augmented.py's datasets: the random
state of Python, numpy and torch, and the dataset's transform, are left as they were.
"""

import random
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from hasten.profile.inject import augmentation
from hasten.profile.launcher import ProfileConfig, run_instrumented

SCRIPTS = Path(__file__).parent / "profile_scripts"
sys.path.insert(0, str(SCRIPTS))
import augmented  # noqa: E402  (the script's datasets, read here in the test's own process)

IMAGE_BYTES = 32 * 32 * 3  # a uint8 image, before its transform to float


def _state(dataset):
    it = SimpleNamespace(_hasten_owner=DataLoader(dataset, batch_size=4))
    return SimpleNamespace(train_iter=(it, None), in_probe=False)


def _datasets():
    return {"augment": augmented.Subset(augmented.Images(augmented.augment), range(8)),
            "fixed": augmented.Images(augmented.fixed),
            "tensors": augmented.TensorDataset(torch.zeros(8, 3, 32, 32), torch.zeros(8)),
            "iterable": augmented.Stream()}


@pytest.mark.parametrize("kind,random_transforms,nbytes", [("augment", True, IMAGE_BYTES),
                                                            ("fixed", False, IMAGE_BYTES),
                                                            ("tensors", False, 3 * 32 * 32 * 4 + 4),  # and its label, a tensor
                                                            ("iterable", None, None)])
def test_two_reads_of_one_index_tell_random_transforms_and_the_item_before_them(kind, random_transforms, nbytes):
    dataset = _datasets()[kind]
    got = augmentation.facts(_state(dataset))
    assert got == {"random_transforms": random_transforms, "decoded_sample_bytes": nbytes}


def test_the_reads_leave_the_random_generators_and_the_transform_as_they_were():
    dataset = _datasets()["augment"]
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    before = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state().clone())
    st = _state(dataset)
    assert augmentation.facts(st)["random_transforms"] is True
    assert random.getstate() == before[0]
    assert (np.random.get_state()[1] == before[1]).all() and torch.equal(torch.get_rng_state(), before[2])
    assert dataset.dataset.transform is augmented.augment and st.in_probe is False


def test_no_training_loader_or_a_dataset_that_raises_is_not_checked():
    assert augmentation.facts(SimpleNamespace(train_iter=None, in_probe=False)) == {
        "random_transforms": None, "decoded_sample_bytes": None}

    class Broken(augmented.Images):
        def __getitem__(self, i):
            raise OSError("the file is gone")

    assert augmentation.facts(_state(Broken(None))) == {"random_transforms": None, "decoded_sample_bytes": None}


def test_a_read_that_blocks_leaves_the_fields_unchecked_and_the_process_free(monkeypatch):
    class Blocking(augmented.Images):
        def __getitem__(self, i):
            time.sleep(60)

    monkeypatch.setattr(augmentation, "READ_TIMEOUT_S", 0.2)
    t0 = time.monotonic()
    assert augmentation.facts(_state(Blocking(None))) == {"random_transforms": None, "decoded_sample_bytes": None}
    assert time.monotonic() - t0 < 30


def test_a_profiled_run_records_both_fields_for_the_analysis():
    config = ProfileConfig((sys.executable, str(SCRIPTS / "augmented.py"), "--augment"), warmup=1, steps=3,
                           probe_steps=2, capture=True, timeout_s=240, decide_s=0)
    (rank,) = run_instrumented(config, log=lambda m: None).ranks
    assert rank["random_transforms"] is True and rank["decoded_sample_bytes"] == IMAGE_BYTES
