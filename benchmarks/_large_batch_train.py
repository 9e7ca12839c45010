"""One run of benchmarks/large_batch.py: the data pooled and normalised in memory, ``SmallNet``,
tuned momentum SGD (Nesterov) or LARS under linear warm-up and polynomial decay, label smoothing,
random flips, the test accuracy along the way and the gradient noise scale probed every
``--probe-images`` images (BN statistics frozen during a probe, so training is unchanged)."""

from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F
from torch import nn

from hasten.nn.ghost_bn import apply_ghost_batchnorm
from hasten.optim import Lars, WarmupPolyDecay, lars_param_groups
from hasten.optim.noise_scale import NoiseScale, micro_batch_sq_norms

LABEL_SMOOTHING, WEIGHT_DECAY, MOMENTUM, TRUST = 0.1, 5e-4, 0.9, 0.001


class SmallNet(nn.Module):
    """conv3x3(3->w) BN ReLU maxpool2, FC(w*(r/2)^2 -> h) BN ReLU, FC(h -> 10)."""

    def __init__(self, resolution: int = 8, width: int = 16, hidden: int = 128, classes: int = 10):
        super().__init__()
        self.conv = nn.Conv2d(3, width, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.fc1 = nn.Linear(width * (resolution // 2) ** 2, hidden, bias=False)
        self.bn2 = nn.BatchNorm2d(hidden)
        self.fc2 = nn.Linear(hidden, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv(x))), 2)
        x = self.fc1(x.flatten(1))[:, :, None, None]
        return self.fc2(F.relu(self.bn2(x)).flatten(1))


def prepare(split, factor: int, mean=None, std=None):
    x = split.images.float()
    if factor > 1:
        x = F.avg_pool2d(x, factor)
    if mean is None:
        mean, std = x.mean((0, 2, 3), keepdim=True), x.std((0, 2, 3), keepdim=True)
    return ((x - mean) / std).contiguous(), split.labels.long(), mean, std


def loss_fn(logits, y):
    return F.cross_entropy(logits, y, label_smoothing=LABEL_SMOOTHING)


@torch.no_grad()
def accuracy(model, x, y, chunk=5000):
    model.eval()
    correct = sum(int((model(x[i:i + chunk]).argmax(1) == y[i:i + chunk]).sum()) for i in range(0, len(x), chunk))
    model.train()
    return correct / len(x)


def flip(x, gen):
    mask = torch.rand(len(x), 1, 1, 1, generator=gen) < 0.5
    return torch.where(mask, x.flip(3), x)


def train_run(cfg: dict, data: dict, args) -> dict:
    """One run of ``cfg`` (batch, optimizer, peak_lr, seed, epochs, ghost); returns its record."""
    X, Y, Xt, Yt = data["X"], data["Y"], data["Xt"], data["Yt"]
    torch.manual_seed(cfg["seed"])
    gen = torch.Generator().manual_seed(cfg["seed"])
    probe_gen = torch.Generator().manual_seed(10_000 + cfg["seed"])
    model = SmallNet(args.resolution, args.width, args.hidden)
    if cfg.get("ghost"):
        apply_ghost_batchnorm(model, cfg["ghost"])
    groups = lars_param_groups(model, WEIGHT_DECAY)
    if cfg["optimizer"] == "lars":
        opt = Lars(groups, lr=cfg["peak_lr"], momentum=MOMENTUM, trust_coefficient=TRUST)
    else:
        for g in groups:
            g.pop("adapt", None)
        opt = torch.optim.SGD(groups, lr=cfg["peak_lr"], momentum=MOMENTUM, nesterov=True)
    B, n = cfg["batch"], len(X)
    spe = n // B
    total = round(cfg["epochs"] * spe)
    warmup = min(round(args.warmup_epochs * spe), total - 1)
    sched = WarmupPolyDecay(opt, warmup, total, power=2.0)
    probe_every = max(1, round(args.probe_images / B))
    est = NoiseScale(beta=args.probe_beta)
    n_probe = args.probe_batch * args.probe_micro
    curve, noise, raw, step, probe_s, eval_s, diverged = [], [], [], 0, 0.0, 0.0, False
    t0 = time.perf_counter()
    epochs = math.ceil(cfg["epochs"])
    for epoch in range(epochs):
        perm = torch.randperm(n, generator=gen)
        for i in range(spe):
            if step >= total:
                break
            idx = perm[i * B:(i + 1) * B]
            xb, yb = flip(X[idx], gen), Y[idx]
            loss = loss_fn(model(xb), yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            if step % probe_every == 0:
                tp = time.perf_counter()
                pidx = torch.randint(0, n, (n_probe,), generator=probe_gen)
                px, py = flip(X[pidx], probe_gen), Y[pidx]
                small, big = micro_batch_sq_norms(model, loss_fn, list(zip(px.split(args.probe_batch),
                                                                           py.split(args.probe_batch))))
                est.update(small, big, args.probe_batch, n_probe, step)
                raw.append([step, small, big])
                probe_s += time.perf_counter() - tp
        if not math.isfinite(loss.item()):
            diverged = True
            curve.append([step, (epoch + 1), 0.1])
            break
        last = epoch + 1 == epochs
        if last or epoch + 1 > epochs / 2 or (epoch + 1) % 2 == 0:
            te = time.perf_counter()
            curve.append([step, round(step / spe, 4), accuracy(model, Xt, Yt)])
            eval_s += time.perf_counter() - te
            noise.append([step, est.b_simple, est.g2, est.trace])
    time_s = time.perf_counter() - t0
    return {**cfg, "steps": step, "total_steps": total, "warmup_steps": warmup, "steps_per_epoch": spe,
            "accuracy": curve[-1][2], "curve": curve, "diverged": diverged,
            "noise_scale": {"final": est.b_simple, "g2": est.g2, "trace": est.trace, "curve": noise,
                            "probes": est.updates, "b_small": args.probe_batch, "b_big": n_probe,
                            "raw": raw},
            "time_s": time_s, "probe_s": probe_s, "eval_s": eval_s}
