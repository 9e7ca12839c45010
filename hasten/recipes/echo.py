"""Data echoing recipe: train to a target accuracy through the streaming pipeline.

Reproduces the setting of Choi et al., "Faster Neural Network Training with Data
Echoing" (2019, arXiv:1907.05550): an input pipeline slower than the training
step (here: simulated slow storage, R = upstream time / step time), an echo stage
after it, and the question how many fresh examples, steps and seconds it takes
to reach a fixed accuracy. Everything is real: JPEGs are read from the record
cache behind ``SlowStorage``, decoded (at 16x16 on CPU by DCT downscaling),
augmented, echoed, shuffled and trained on; accuracy is measured on held-out
test images.

Timing: the training loop's clock counts waiting for input plus the steps; it
stops during evaluations, and so does the slow storage (``SlowStorage.paused``),
so an evaluation gives no run free upstream time.

Changes the training math: yes with echoing (repeated examples); e = 1 is plain
streaming training.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, replace
from itertools import count

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from hasten.stream.decode_pool import decode_records, read_records
from hasten.stream.records import ByteRecords, open_records
from hasten.stream.slow_storage import SlowStorage
from hasten.stream.loader import StreamLoader
from hasten.echo import AutoEcho, check_factor, check_variant
from hasten.errors import ConfigError

# ----------------------------------------------------------------------------- Hyperparameters
# CPU: a small network on 16x16 images so that one run reaches the target in
# about ten seconds of compute on two shared cores. GPU: the speedrun network.
HYP = {
    "cpu": {
        "image_size": 16,  # decoded at 1/2 DCT scale: a quarter of the pixels to decode and train on
        "width": 16,  # channels of the first conv; doubled at each of the next two
        "batch_size": 64,
        "lr": 0.05,  # SGD, Nesterov momentum 0.9; constant: runs of different length stay comparable
        "weight_decay": 5e-4,
        "label_smoothing": 0.1,
        "target": 0.40,  # test accuracy; reached in about 8k fresh examples without echoing
        "eval_every": 10,  # steps between evaluations
        "eval_images": 1000,  # test images used to detect the target (the full test set at the end)
        "max_fresh": 40_000,  # give up after this many fresh examples
        "shuffle_buffer": 256,  # examples (or batches, for batch echoing) mixed after the echo stage
    },
    "cuda": {
        "image_size": 32,
        "width": 0,  # 0 = hasten.models.speedrun_net defaults
        "batch_size": 512,
        "lr": 0.2,
        "weight_decay": 5e-4,
        "label_smoothing": 0.2,
        "target": 0.85,
        "eval_every": 20,
        "eval_images": 10_000,
        "max_fresh": 500_000,
        "shuffle_buffer": 2048,
    },
}

MEAN = (125.27, 122.93, 113.86)  # CIFAR-10-JPEG training set, RGB 0-255 (shared/data/README.md)
STD = (62.53, 61.91, 66.46)


@dataclass
class EchoRunConfig:
    data: str
    variant: str = "example-before"
    echo: float | str = 1.0  # a factor >= 1 or "auto"
    upstream_delay_s: float = 0.0  # slow-storage latency per example read
    target: float | None = None
    e_max: float = 8.0
    seed: int = 0
    device: str = "cpu"
    workers: int = 0  # decode processes; 0 = a decode thread (decoding is cheap next to the delay)
    batch_size: int | None = None
    shuffle_buffer: int | None = None
    max_fresh: int | None = None
    width: int | None = None  # a wider network makes the step slower than the pipeline (R < 1)

    def hyp(self) -> dict:
        h = dict(HYP["cuda" if torch.device(self.device).type == "cuda" else "cpu"])
        for key in ("target", "batch_size", "shuffle_buffer", "max_fresh", "width"):
            if getattr(self, key) is not None:
                h[key] = getattr(self, key)
        return h


def parse_echo(value) -> float | str:
    """``"auto"`` or a number >= 1 (ValueError naming the accepted values otherwise)."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    try:
        factor = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"echo factor must be 'auto' or a number >= 1; got {value!r}") from None
    return float(check_factor(factor))


def validate(cfg: EchoRunConfig) -> EchoRunConfig:
    check_variant(cfg.variant)
    cfg = replace(cfg, echo=parse_echo(cfg.echo))
    if not (math.isfinite(cfg.upstream_delay_s) and cfg.upstream_delay_s >= 0):
        raise ConfigError(f"upstream delay must be >= 0 seconds; got {cfg.upstream_delay_s}")
    h = cfg.hyp()
    if not 0 < h["target"] < 1:
        raise ConfigError(f"target accuracy must be in (0, 1); got {h['target']}")
    return cfg


# ----------------------------------------------------------------------------- Network
class SmallNet(nn.Sequential):
    """Three conv-BN-ReLU-maxpool stages and a linear head: fast enough to train on a CPU."""

    def __init__(self, width: int = 16, num_classes: int = 10):
        layers, cin = [], 3
        for cout in (width, 2 * width, 4 * width):
            layers += [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                       nn.MaxPool2d(2)]
            cin = cout
        super().__init__(*layers, nn.AdaptiveMaxPool2d(1), nn.Flatten(), nn.Linear(cin, num_classes))


def make_model(h: dict, num_classes: int) -> nn.Module:
    if h["width"]:
        return SmallNet(h["width"], num_classes)
    from hasten.models.speedrun_net import NetConfig, SpeedrunNet

    return SpeedrunNet(NetConfig(num_classes=num_classes))


def normalize(images: torch.Tensor, device: torch.device) -> torch.Tensor:
    mean = torch.tensor(MEAN, device=device).view(1, 3, 1, 1)
    std = torch.tensor(STD, device=device).view(1, 3, 1, 1)
    return (images.to(device, non_blocking=True).float() - mean) / std


# ----------------------------------------------------------------------------- Evaluation
class EvalSet:
    """Test images decoded once (at the training resolution) and kept in memory."""

    def __init__(self, records: ByteRecords, image_size: int, device: torch.device):
        chunk = decode_records(read_records(records, np.arange(len(records))), image_size)
        self.images = torch.from_numpy(chunk.images).permute(0, 3, 1, 2)
        self.labels = torch.from_numpy(chunk.labels)
        self.device = device
        # A fixed, class-balanced-by-chance subset to detect the target quickly.
        self.order = torch.from_numpy(np.random.default_rng(12345).permutation(len(self.labels)))

    @torch.no_grad()
    def accuracy(self, model: nn.Module, n: int | None = None) -> float:
        idx = self.order[:n] if n else self.order
        model.eval()
        correct = 0
        for part in idx.split(2000):
            x = normalize(self.images[part], self.device)
            correct += (model(x).argmax(1).cpu() == self.labels[part]).sum().item()
        model.train()
        return correct / len(idx)


# ----------------------------------------------------------------------------- Training
def measure_step_time(data: str, device: str = "cpu", steps: int = 40, seed: int = 0,
                      eval_set: "EvalSet | None" = None) -> float:
    """Seconds per training step of this recipe without storage delay: a short run
    of the real loop, so that a delay of R * step / batch per example gives about R."""
    cfg = EchoRunConfig(data=data, device=device, seed=seed, target=0.999)
    cfg.max_fresh = steps * cfg.hyp()["batch_size"]
    return train_to_target(cfg, eval_set=eval_set)["step_time_s"]


def train_to_target(cfg: EchoRunConfig, *, eval_set: EvalSet | None = None, log=None) -> dict:
    """Train until the test accuracy reaches the target; return the run's measurements."""
    cfg = validate(cfg)
    h = cfg.hyp()
    dev = torch.device(cfg.device)
    records = open_records(cfg.data, "train")
    if eval_set is None:
        eval_set = EvalSet(open_records(cfg.data, "test"), h["image_size"], dev)
    storage = SlowStorage(records, latency_s=cfg.upstream_delay_s)
    auto = AutoEcho(e_max=cfg.e_max, interval=4 * h["batch_size"]) if cfg.echo == "auto" else None
    if auto is not None and cfg.variant == "batch":
        auto.interval = 4
    loader = StreamLoader(
        storage, batch_size=h["batch_size"], seed=cfg.seed, workers=cfg.workers, image_size=h["image_size"],
        echo=auto if auto is not None else cfg.echo, variant=cfg.variant,
        # For batch echoing the buffer mixes batches: the same number of examples, in batches.
        shuffle_buffer=h["shuffle_buffer"] // h["batch_size"] if cfg.variant == "batch" else h["shuffle_buffer"],
        chunk_size=h["batch_size"], device=dev,
    )
    torch.manual_seed(cfg.seed)
    model = make_model(h, len(records.classes)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=h["lr"], momentum=0.9, nesterov=True,
                          weight_decay=h["weight_decay"])
    wait_s = step_s = 0.0
    steps = 0
    accuracy = 0.0
    reached = False
    factors = []
    for epoch in count():
        loader.set_epoch(epoch)
        it = iter(loader)
        try:
            while True:
                t0 = time.perf_counter()
                batch = next(it, None)
                t1 = time.perf_counter()
                wait_s += t1 - t0
                if batch is None:
                    break
                x, y = batch
                loss = F.cross_entropy(model(normalize(x, dev)), y.to(dev), label_smoothing=h["label_smoothing"])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                step_s += time.perf_counter() - t1
                steps += 1
                factors.append(auto.factor if auto is not None else cfg.echo)
                if steps % h["eval_every"] == 0:
                    with storage.paused():
                        if auto is not None:
                            with auto.paused():
                                accuracy = eval_set.accuracy(model, h["eval_images"])
                        else:
                            accuracy = eval_set.accuracy(model, h["eval_images"])
                    if log is not None:
                        log(step=steps, fresh=loader.counters.fresh_examples, accuracy=accuracy,
                            wall_s=wait_s + step_s, echo=factors[-1])
                    if accuracy >= h["target"]:
                        reached = True
                        break
                if loader.counters.fresh_examples >= h["max_fresh"]:
                    break
        finally:
            it.close()
        if reached or loader.counters.fresh_examples >= h["max_fresh"]:
            break
    c = loader.counters
    # Storage delay per batch over step time: the part of R the slow storage adds (decoding adds more).
    storage_ratio = (storage.delay_s / max(c.fresh_examples, 1)) * h["batch_size"] / (step_s / max(steps, 1))
    return {
        "variant": cfg.variant,
        "echo_factor": cfg.echo,
        "mean_echo_factor": float(np.mean(factors)) if factors else 1.0,
        "upstream_delay_s": cfg.upstream_delay_s,
        # Without echoing, an input-bound loop runs at the upstream's pace: (wait + step) / step
        # is R = upstream time / step time, measured. It reads ~1 when the loop is not input-bound.
        "upstream_ratio": (wait_s + step_s) / step_s if cfg.echo == 1.0 and step_s > 0 else None,
        "storage_ratio": storage_ratio,
        "reached_target": reached,
        "target": h["target"],
        "fresh_examples_to_target": c.fresh_examples if reached else None,
        "steps_to_target": steps if reached else None,
        "wall_time_to_target_s": wait_s + step_s if reached else None,
        "fresh_examples": c.fresh_examples,
        "steps": steps,
        "wall_time_s": wait_s + step_s,
        "final_accuracy": eval_set.accuracy(model),
        "idle_fraction": wait_s / (wait_s + step_s) if steps else 0.0,
        "step_time_s": step_s / max(steps, 1),
        "duplicate_rate": c.duplicate_rate,
        "skipped_images": len(loader.skipped),
        "seed": cfg.seed,
        "config": asdict(cfg),
    }
