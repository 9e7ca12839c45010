import pytest
import torch

from hasten.data import ImageDataset, Split
from hasten.errors import ConfigError
from hasten.recipes.common import TrainMeter, load_training_data, optimizer_step


def _class_by_class(n=100):
    images = torch.arange(n, dtype=torch.uint8).view(n, 1, 1, 1).expand(n, 3, 2, 2).contiguous()
    labels = torch.arange(n) // 10  # stored class by class, like an image folder
    return ImageDataset("x", list("abcdefghij"), Split(images, labels), Split(images, labels), "mem")


def test_train_subset_is_seeded_and_keeps_all_classes():
    data = _class_by_class()
    a, b = (load_training_data(None, dataset=data, batch_size=1, train_subset=50) for _ in range(2))
    assert torch.equal(a.train.labels, b.train.labels) and len(a.train) == 50
    assert len(set(a.train.labels.tolist())) == 10
    assert torch.equal(a.train.images[:, 0, 0, 0].long() // 10, a.train.labels)  # images stay paired with labels
    with pytest.raises(ValueError, match="train-subset"):
        load_training_data(None, dataset=data, batch_size=1, train_subset=101)


def test_zero_subset_is_the_whole_set_and_a_batch_must_fit():
    data = _class_by_class()
    assert load_training_data(None, dataset=data, batch_size=100) is data
    with pytest.raises(ConfigError, match="100 images, fewer than one global batch of 128: pass a smaller --batch-size"):
        load_training_data(None, dataset=data, batch_size=128)
    with pytest.raises(ConfigError, match="fewer than one global batch of 64"):
        load_training_data(None, dataset=data, batch_size=64, train_subset=32)


def test_optimizer_step_frees_gradients_and_steps_the_schedule():
    w = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([w], lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 ** s)
    w.grad = torch.full((2,), 100.0)  # stale: must not leak into the step
    optimizer_step((3 * w).sum(), opt, sched)
    assert torch.equal(w.detach(), torch.full((2,), -2.0))
    assert opt.param_groups[0]["lr"] == 0.5
    optimizer_step((3 * w).sum(), opt)  # no scheduler: the lr stays
    assert torch.equal(w.detach(), torch.full((2,), -3.5)) and opt.param_groups[0]["lr"] == 0.5


def test_train_meter_averages_per_example_and_resets():
    meter = TrainMeter("cpu")
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [3.0, 0.0]])
    meter.update(torch.tensor(6.0), logits, torch.tensor([0, 1, 1]))
    meter.update(torch.tensor(2.0, requires_grad=True) * 1, logits[:1], torch.tensor([1]))
    assert meter.seen == 4 and meter.loss == pytest.approx(2.0) and meter.accuracy == pytest.approx(0.5)
    meter.reset()
    assert meter.seen == 0 and meter.loss == 0.0 and meter.accuracy == 0.0
