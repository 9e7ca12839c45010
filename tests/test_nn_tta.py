import pytest
import torch
import torch.distributed as dist

from hasten.harness.launch import spawn
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
    with pytest.raises(ValueError, match="Invalid TTA level 'rotate'; accepted: none, flip, flip_translate"):
        tta_logits(model, x, "rotate")


class _Tanh(torch.nn.Module):
    """A fixed random nonlinear model: every pixel of every view changes its logits."""

    def __init__(self, c=2, h=5, w=6, classes=4, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.weight = torch.randn(classes, c * h * w, generator=g, dtype=torch.float64)

    def forward(self, x):
        return torch.tanh(x.reshape(len(x), -1).to(self.weight.dtype) @ self.weight.T)


def _reflect(i: int, n: int) -> int:
    """Index of pixel ``i`` of a row of ``n`` after reflect padding (edge not repeated)."""
    return -i if i < 0 else 2 * (n - 1) - i if i >= n else i


def _view(image, dy: int, dx: int, mirror: bool):
    """``image`` (C, H, W) read at (y + dy, x + dx), reflected at the borders, then
    mirrored left-right if asked: built pixel by pixel."""
    c, h, w = image.shape
    out = torch.empty_like(image)
    for y in range(h):
        for x in range(w):
            xs = w - 1 - x if mirror else x
            out[:, y, x] = image[:, _reflect(y + dy, h), _reflect(xs + dx, w)]
    return out


def _reference_logits(model, x, level):
    """airbench's TTA weights, written out per example: flip = (1/2, 1/2) on the image
    and its mirror; flip_translate = 1/4 each on those two and 1/8 each on the mirror
    pairs of the views shifted by one pixel (reflect padding) in both directions."""
    if level == "none":
        views = [((0, 0, False), 1.0)]
    elif level == "flip":
        views = [((0, 0, False), 0.5), ((0, 0, True), 0.5)]
    else:
        views = [((0, 0, False), 0.25), ((0, 0, True), 0.25)]
        views += [((d, d, m), 0.125) for d in (-1, 1) for m in (False, True)]
    rows = []
    for image in x:
        rows.append(sum(weight * model(_view(image, *view)[None])[0] for view, weight in views))
    return torch.stack(rows)


@pytest.mark.parametrize("level", ["none", "flip", "flip_translate"])
def test_tta_logits_match_a_per_example_reference(level):
    x = torch.randn(3, 2, 5, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    model = _Tanh()
    assert torch.allclose(tta_logits(model, x, level), _reference_logits(model, x, level), rtol=0, atol=1e-12)


def test_the_reference_rejects_other_shift_padding_and_weights():
    """The reference is not vacuous: a 2-pixel shift, zero padding or equal
    weights of 1/3 each give different logits."""
    import torch.nn.functional as F

    x = torch.randn(3, 2, 5, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    model = _Tanh()
    ref = _reference_logits(model, x, "flip_translate")

    def flip_avg(v):
        return 0.5 * model(v) + 0.5 * model(v.flip(-1))

    def variant(pad, mode, weights):
        p = F.pad(x, (pad,) * 4, mode=mode)
        shifted = [p[..., :5, :6], p[..., 2 * pad:2 * pad + 5, 2 * pad:2 * pad + 6]]
        parts = [flip_avg(x)] + [flip_avg(v) for v in shifted]
        return sum(w * part for w, part in zip(weights, parts))

    assert torch.allclose(variant(1, "reflect", (0.5, 0.25, 0.25)), ref, rtol=0, atol=1e-12)
    for wrong in [variant(2, "reflect", (0.5, 0.25, 0.25)), variant(1, "constant", (0.5, 0.25, 0.25)),
                  variant(1, "reflect", (1 / 3, 1 / 3, 1 / 3))]:
        assert (wrong - ref).abs().max() > 1e-3


def test_evaluate_with_flip_translate_counts_the_reference_argmax():
    x = torch.randn(40, 2, 5, 6, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    model = _Tanh()
    predicted = _reference_logits(model, x, "flip_translate").argmax(1)
    y = predicted.clone()
    y[::4] = (y[::4] + 1) % 4  # a quarter wrong on purpose
    batches = [(x[:25], y[:25]), (x[25:], y[25:])]
    assert evaluate(model, batches, "flip_translate") == pytest.approx(30 / 40)
    plain = (model(x).argmax(1) == y).float().mean().item()
    assert plain != pytest.approx(30 / 40)  # the level matters for this model and data


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


def test_defaults_are_flip_and_full_precision():
    x = torch.randn(3, 2, 5, 6, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    model = _Tanh()
    assert torch.equal(tta_logits(model, x), tta_logits(model, x, "flip"))
    seen = []

    class Probe(_Asymmetric):
        def forward(self, x):
            seen.append(torch.is_autocast_enabled("cpu"))
            return super().forward(x)

    evaluate(Probe(), [(_left_right_batch(), torch.tensor([0, 0, 1, 1]))])
    assert seen == [False]  # level "none", no autocast unless asked


def test_evaluate_of_one_example_and_of_no_batches():
    model = _Asymmetric()
    x = _left_right_batch()
    assert evaluate(model, [(x[:1], torch.tensor([0]))]) == 1.0
    assert evaluate(model, [(x[:1], torch.tensor([1]))]) == 0.0
    assert evaluate(model, []) == 0.0


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


def test_distributed_evaluate_adds_what_all_reduce_returns(monkeypatch):
    """The distributed branch in one process: all_reduce is replaced by one that adds
    another rank's counts (1 correct of 4), so the sum is checked without spawning."""
    sent = []

    def all_reduce(counts):
        sent.append(counts.clone())
        counts += torch.tensor([1, 4])

    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    x = _left_right_batch()
    assert evaluate(_Asymmetric(), [(x, torch.tensor([0, 0, 1, 0]))], distributed=True) == 4 / 8
    assert sent[-1].tolist() == [3, 4]
    with_parameters = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 2))
    assert evaluate(with_parameters, [], distributed=True) == 1 / 4  # no batches here: joins with zeros
    assert sent[-1].tolist() == [0, 0]
    assert evaluate(_Asymmetric(), [(x, torch.tensor([0, 0, 1, 1]))]) == 1.0 and len(sent) == 2  # not distributed


def _evaluate_on_rank(rank, world):
    """One rank of a real gloo group (hasten.harness.launch.spawn forks it and joins the group)."""
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 2))  # has parameters, for rank 1
    with torch.no_grad():
        model[1].weight.copy_(torch.tensor([[1.0, 0, 1, 0], [0, 1.0, 0, 1]]))
        model[1].bias.zero_()
    x = _left_right_batch()
    # Rank 0 holds the whole share (3 of 4 right), rank 1 none: the sum is over both.
    batches = [(x, torch.tensor([0, 0, 1, 0]))] if rank == 0 else []
    return evaluate(model, batches, distributed=True)


@pytest.mark.multiproc
def test_evaluate_sums_counts_over_ranks():
    assert spawn(_evaluate_on_rank, 2) == [0.75, 0.75]
