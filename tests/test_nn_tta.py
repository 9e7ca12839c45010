import datetime
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hasten.nn.tta import evaluate, tta_logits


class _Asymmetric(torch.nn.Module):
    """Logits that depend on where the mass of the image is: flips matter."""

    def forward(self, x):
        w = x.shape[-1]
        left, right = x[..., : w // 2].sum(dim=(1, 2, 3)), x[..., w // 2:].sum(dim=(1, 2, 3))
        return torch.stack([left, right], 1)


def test_tta_flip_averages_the_mirror():
    x = torch.rand(4, 3, 8, 8)
    model = _Asymmetric()
    flip = tta_logits(model, x, "flip")
    assert torch.allclose(flip, 0.5 * model(x) + 0.5 * model(x.flip(-1)))
    assert torch.allclose(flip[:, 0], flip[:, 1])  # symmetric after flip averaging
    assert torch.equal(tta_logits(model, x, "none"), model(x))
    translate = tta_logits(model, x, "flip_translate")
    assert translate.shape == (4, 2) and not torch.allclose(translate, flip)
    with pytest.raises(ValueError, match="flip_translate"):
        tta_logits(model, x, "rotate")


def _left_right_batch():
    x = torch.zeros(4, 1, 2, 2)
    x[:2, ..., 0] = 1  # mass on the left -> class 0
    x[2:, ..., 1] = 1
    return x


def test_evaluate_counts_correct_predictions():
    model = _Asymmetric()
    x = _left_right_batch()
    assert evaluate(model, [(x, torch.tensor([0, 0, 1, 1]))]) == 1.0
    assert evaluate(model, [(x, torch.tensor([0, 1, 1, 1]))]) == 0.75


def test_evaluate_in_bf16_restores_the_training_mode():
    seen = []

    class Probe(_Asymmetric):
        def forward(self, x):
            seen.append((self.training, torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu")
                         else None))
            return super().forward(x)

    model = Probe().train()
    assert evaluate(model, [(_left_right_batch(), torch.tensor([0, 0, 1, 1]))], bf16=True) == 1.0
    assert seen == [(False, torch.bfloat16)] and model.training


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _evaluate_worker(rank, world, port, results):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    try:
        model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 2))  # has parameters, for rank 1
        with torch.no_grad():
            model[1].weight.copy_(torch.tensor([[1.0, 0, 1, 0], [0, 1.0, 0, 1]]))
            model[1].bias.zero_()
        x = _left_right_batch()
        # Rank 0 holds the whole share (3 of 4 right), rank 1 none: the sum is over both.
        batches = [(x, torch.tensor([0, 0, 1, 0]))] if rank == 0 else []
        results[rank] = evaluate(model, batches, distributed=True)
    finally:
        dist.destroy_process_group()


@pytest.mark.multiproc
def test_evaluate_sums_counts_over_ranks():
    results = mp.Manager().dict()
    mp.spawn(_evaluate_worker, args=(2, _free_port(), results), nprocs=2, join=True)
    assert dict(results) == {0: 0.75, 1: 0.75}
