"""Throughput on the GPU: ResNet-18 training steps in float32 against bf16 autocast, each
in NCHW and channels_last (``benchmarks/large_batch_precision.py``'s step, timed the
same way), and hasten's device-resident loader (``GpuLoader``) against a torch
``DataLoader`` with per-sample augmentation in worker processes, each delivering
augmented, normalised float batches on the device. Configurations interleaved within
every repeat (``hasten.timing.interleaved``).

The loaders: the same augmentation (reflect-pad by 2 and crop, random flip), the
same normalisation, the same batch; the DataLoader pins memory and copies with
``non_blocking`` on CUDA, as a tuned PyTorch pipeline does. One untimed epoch each
first (worker start-up, allocations), then the timed epochs; a batch counts as
delivered once it is on the device (the clock synchronises at the end).

"fp32" rows are float32 throughout: TF32 is off for them (cuDNN convolutions use TF32
by default in PyTorch, which would make them a TF32 row), and the caller's setting is
back after each (``gpu.context.strict_fp32``); the JSON records the flags each row ran
with. On the CPU, channels_last needs a width that is a multiple of 8 (``check_width``).
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from _common import mean_ci
from gpu.context import strict_fp32
from hasten.cores import usable_cores
from hasten.data.device_loader import Augmentation, GpuLoader
from hasten.errors import ConfigError
from hasten.timing import Stopwatch, interleaved

PAD = 2
PRECISION = [("fp32", False, False), ("bf16", True, False), ("fp32 channels_last", False, True),
             ("bf16 channels_last", True, True)]


class AugmentedImages(torch.utils.data.Dataset):
    """uint8 (N, C, H, W) images as a map-style dataset: each item reflect-padded and
    randomly cropped, randomly flipped and normalised on the host, as a torchvision
    transform pipeline does per sample."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, mean, std):
        self.images, self.labels = images, labels
        self.mean = torch.tensor(mean).view(-1, 1, 1)
        self.std = torch.tensor(std).view(-1, 1, 1)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        x = self.images[i].float().div_(255)
        h, w = x.shape[-2:]
        x = F.pad(x.unsqueeze(0), (PAD,) * 4, mode="reflect").squeeze(0)
        dy, dx = torch.randint(0, 2 * PAD + 1, (2,)).tolist()
        x = x[:, dy:dy + h, dx:dx + w]
        if torch.rand(()) < 0.5:
            x = x.flip(-1)
        return (x - self.mean) / self.std, self.labels[i]


def _one_thread(_):
    torch.set_num_threads(1)  # many workers on few cores: no oversubscription


def check_width(device, width: int) -> None:
    """ResNet-18 in channels_last on a CPU: its 1x1 stride-2 shortcut convolutions have
    ``width``, 2 x and 4 x ``width`` input channels, and oneDNN's weight gradient of such a
    convolution in channels_last writes out of bounds with fewer than 8 input channels
    on AVX2 (a segfault, an abort or a hang depending on threads; oneDNN issue 6035, in
    torch 2.13's oneDNN 3.12): refuse the width before the process crashes."""
    if device.type == "cpu" and width % 8:
        raise ConfigError(f"throughput on the CPU needs a ResNet width that is a multiple of 8 (got {width}): "
                          "oneDNN's channels_last 1x1 stride-2 weight gradient crashes below 8 input channels")


def tf32_flags() -> dict:
    return {"cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
            "cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32}


def step_images_per_s(ctx, bf16: bool, channels_last: bool) -> tuple[float, dict]:
    """One configuration's training-step rate, fp32 with TF32 off; and the TF32 flags it ran with."""
    from large_batch_precision import images_per_s  # benchmarks/: the training step it times

    s = ctx.sizes
    with contextlib.nullcontext() if bf16 else strict_fp32():
        flags = tf32_flags()
        rate = images_per_s(ctx.device, "resnet18", s.tp_width, 32, s.tp_batch, bf16, channels_last,
                            s.tp_warmup, s.tp_steps)
    return rate, flags


def loader_images_per_s(name: str, images, labels, batch: int, epochs: int, device, workers: int,
                        mean_std) -> dict:
    mean, std = mean_std
    cuda = device.type == "cuda"
    clock = Stopwatch(device)
    clock.start()
    if name == "GpuLoader":
        loader = GpuLoader(images, labels, batch, device=device, augment=Augmentation(translate=PAD, flip="random"),
                           mean=mean, std=std)
    else:
        loader = torch.utils.data.DataLoader(AugmentedImages(images, labels, mean, std), batch_size=batch,
                                             shuffle=True, drop_last=True, num_workers=workers, pin_memory=cuda,
                                             persistent_workers=workers > 0, worker_init_fn=_one_thread)
    setup_s = clock.stop()
    total = 0
    for epoch in range(1 + epochs):
        if epoch == 1:
            clock = Stopwatch(device)
            clock.start()
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            total += len(y) if epoch else 0
    clock.stop()
    return {"images_per_s": total / clock.elapsed, "setup_s": setup_s}


def throughput(ctx) -> dict:
    s = ctx.sizes
    check_width(ctx.device, s.tp_width)
    data = ctx.dataset()
    workers = min(s.tp_loader_workers, usable_cores())
    precision = {name: [] for name, _, _ in PRECISION}
    flags = {}
    loaders = {"GpuLoader": [], f"DataLoader ({workers} workers)": []}
    order = []
    jobs = [("step", c) for c in PRECISION] + [("loader", name) for name in loaders]
    for rep, (kind, job) in interleaved(jobs, s.tp_repeats, seed=0):
        if kind == "step":
            name, bf16, cl = job
            rate, flags[name] = step_images_per_s(ctx, bf16, cl)
            precision[name].append(rate)
        else:
            name = job
            loaders[name].append(loader_images_per_s(name.split()[0], data.train.images, data.train.labels,
                                                     s.tp_batch, s.tp_loader_epochs, ctx.device, workers,
                                                     ctx.mean_std()))
        order.append([rep, name])
        ctx.checkpoint({"order": order, "samples_so_far": precision, "loaders_so_far": loaders})
    base = mean_ci(precision["fp32"])
    steps = []
    for name, xs in precision.items():
        stats = mean_ci(xs)
        steps.append({"config": name, "images_per_s": stats["mean"], "images_per_s_std": stats["std"],
                      "images_per_s_ci95": stats["ci95"], "samples": xs,
                      "speedup_vs_fp32": stats["mean"] / base["mean"], "tf32": flags[name]})
    feeds = []
    for name, rs in loaders.items():
        stats = mean_ci([r["images_per_s"] for r in rs])
        feeds.append({"loader": name, "images_per_s": stats["mean"], "images_per_s_std": stats["std"],
                      "images_per_s_ci95": stats["ci95"],
                      "setup_s": mean_ci([r["setup_s"] for r in rs])["mean"], "samples": rs})
    recipes_use = steps[-1]  # bf16 channels_last: what the recipes run on CUDA
    loader_ratio = feeds[0]["images_per_s"] / feeds[1]["images_per_s"]
    return {"model": "resnet18", "width": s.tp_width, "batch": s.tp_batch, "steps": s.tp_steps,
            "warmup_steps": s.tp_warmup, "loader_epochs": s.tp_loader_epochs, "n_runs": s.tp_repeats,
            "order": order, "training_step": steps, "loaders": feeds, "loader_speedup": loader_ratio,
            "timed": "training step: forward, backward, LARS step on one fixed batch after warm-up steps; "
                     "fp32 rows with TF32 off (cuDNN and cuBLAS); loaders: timed epochs after one untimed "
                     "epoch, batches delivered on the device",
            "headline": {"key": f"{recipes_use['config']} x{recipes_use['speedup_vs_fp32']:.2f} vs fp32 (TF32 off); "
                                f"GpuLoader x{loader_ratio:.1f} vs DataLoader", "n": s.tp_repeats,
                         "spread": f"fp32 ±{base['std'] or 0:.0f} img/s (std)"}}
