"""The loss of tests/profile_scripts/helper_loss.py, in a second file of the user's."""

import torch
import torch.nn.functional as F
from torch import nn


class Sharpen(nn.Module):
    """No parameters: hasten's hooks time no interval around it. ``probe``, where a test sets it, is
    called inside the forward (tests/test_profile_sampler.py samples the stack there)."""

    probe = None

    def forward(self, logits):
        if self.probe is not None:
            self.probe()
        for _ in range(5):
            logits = logits - torch.logsumexp(logits, 1, keepdim=True)
        return logits


def loss_of(model, sharpen, x, y):
    return F.cross_entropy(sharpen(model(x)), y, label_smoothing=0.1)
