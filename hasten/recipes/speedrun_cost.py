"""What one run of the CIFAR-10 speedrun costs (``hasten.recipes.speedrun_train.train_run``):
its training steps (``steps_per_run``) and the FLOPs of its training and final evaluation
(``flops_per_run``), which the speedrun's summary turns into an achieved FLOP rate.

Changes the training math: no (it counts).
"""

from __future__ import annotations

import math

import torch

from hasten.data import ImageDataset
from hasten.models.speedrun_net import SpeedrunNet
from hasten.recipes.speedrun_recipe import Recipe


def flops_per_run(recipe: Recipe, data: ImageDataset) -> int:
    """Training plus final-evaluation FLOPs of one run (torch.utils.flop_counter),
    counted on a 2-image batch and scaled: convolution and matmul FLOPs only.

    Counted as the run trains: a whitened first layer's frozen weight gets no
    gradient, and once its bias freezes (after ``whiten_bias_epochs``) nothing
    before the first conv group trains, so eager runs skip that group's input
    gradient; compiled runs keep computing it (the bias keeps ``requires_grad``, its
    lr is 0), and are charged for it."""
    from torch.utils.flop_counter import FlopCounterMode

    model = SpeedrunNet(recipe.net)
    model.whiten.weight.requires_grad_(not recipe.whiten)
    x = torch.zeros(2, 3, *data.train.images.shape[-2:])

    def train_flops_per_example(bias_trains: bool) -> float:
        model.whiten.bias.requires_grad_(bias_trains)
        with FlopCounterMode(display=False) as counter:
            model(x).sum().backward()
        return counter.get_total_flops() / 2

    model.eval()
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(x)
    forward_per_example = counter.get_total_flops() / 2
    model.train()
    steps_per_epoch = len(data.train.labels) // recipe.batch_size  # the loader drops the last partial batch
    steps = steps_per_run(recipe, len(data.train.labels))
    bias_steps = steps if recipe.compile else min(steps, steps_per_epoch * recipe.whiten_bias_epochs)
    train = (train_flops_per_example(True) * bias_steps + train_flops_per_example(False) * (steps - bias_steps))
    views = {"none": 1, "flip": 2, "flip_translate": 6}[recipe.tta]
    return int(train * recipe.batch_size + forward_per_example * views * len(data.test.labels))


def steps_per_run(recipe: Recipe, n_train: int) -> int:
    """Training steps of one run on ``n_train`` images (the loader drops the last partial batch)."""
    return math.ceil(n_train // recipe.batch_size * recipe.epochs)
