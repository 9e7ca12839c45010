"""Shared by the speedrun recipe's test files: a tiny in-memory data set, a small
recipe, and a RunResult builder."""

import torch

import hasten.recipes.speedrun as speedrun
from hasten.data import ImageDataset, Split
from hasten.recipes.speedrun import build_recipe


def colours_split(n: int, seed: int) -> Split:
    """16x16 images whose class (0..2) is the dominant colour channel."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % 3
    images = torch.randint(0, 60, (n, 3, 16, 16), generator=g)
    images[torch.arange(n), labels] += 150
    return Split(images.to(torch.uint8), labels)


TINY_DATA = ImageDataset("colours", ["r", "g", "b"], colours_split(96, 0), colours_split(30, 1), "memory")
SMALL = build_recipe("tiny", epochs=2, batch_size=32, **{"net.widths": (8, 8, 8)})


def run_result(tta, time_s, accuracy=0.5, cpu=1.0, epochs_to_target=None, time_to_target_s=None):
    return speedrun.RunResult(accuracy=accuracy, tta_accuracy=tta, time_s=time_s, cpu_time_s=cpu,
                              epochs_to_target=epochs_to_target, time_to_target_s=time_to_target_s)
