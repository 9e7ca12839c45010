"""The real training scripts ``profile_real_scripts.py`` runs: where each comes from, how it is run, its data.

Each script is fetched at a pinned commit (``real_script_fetch.py``) and run unchanged: only
its own command-line flags, its working directory, ``PYTHONPATH`` (for a repository whose
scripts import its package, as its README's ``pip install -e .`` would give) and the data
made for it here differ from what its README shows. A slow-data variant is made the way users
meet it, through the script's flags (``num_workers=0``, a tiny context with a large batch) or
the cores it gets (``taskset -c 0``), never by editing the script.

Placeholders in ``args``: ``{checkout}`` (the script's repository at the commit) and
``{scratch}`` (a fresh folder per run, the working directory unless ``cwd="checkout"``).
"""

from __future__ import annotations

import io
import os
import pickle
import random
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Repo:
    name: str        # owner/name on GitHub
    commit: str      # the pinned commit
    licence: str     # as the repository states it


REPOS = {
    "minGPT": Repo("karpathy/minGPT", "37baab71b9abea1b76ab957409a1cc2fbfba8a26", "MIT"),
    "nanoGPT": Repo("karpathy/nanoGPT", "3adf61e154c3fe3fca428ad6bc3818b27a3b8291", "MIT"),
    "examples": Repo("pytorch/examples", "77f55b912142e11fcfdf5b530231fb9c52f181e8", "BSD-3-Clause"),
    "makemore": Repo("karpathy/makemore", "988aa59e4d8fefa526d06f3b453ad116258398d4", "MIT"),
    "Pytorch-UNet": Repo("milesial/Pytorch-UNet", "a013c80ca6b011ba34ba0700b961b77e0ed003a2",
                         "GPL-3.0: fetched, never copied"),
    "ng-video-lecture": Repo("karpathy/ng-video-lecture", "52201428ed7b46804849dea0b3ccf0de9df1a5c3",
                             "none stated (all rights reserved): fetched, never copied"),
    "timm": Repo("huggingface/pytorch-image-models", "aa4b5850c1543fa488abf260f18390eda46cf85d", "Apache-2.0"),
    "lightning": Repo("Lightning-AI/pytorch-lightning", "7f0c3436cd3f6ad3753125672024fc415cbcb414", "Apache-2.0"),
}


@dataclass(frozen=True)
class Case:
    name: str
    repo: str                 # a key of REPOS
    script: str               # path inside the repository
    args: tuple[str, ...]
    variant: str = "as shipped"   # or how its data was made slow
    cwd: str = "scratch"      # "scratch" or "checkout" (scripts that open files relative to their repository)
    pythonpath: bool = False  # the checkout on PYTHONPATH (the repository's package imported by the script)
    data: str | None = None   # a maker in DATA, writing the files the script reads
    data_fn: str | None = None    # no DataLoader: the script's function that makes a batch (truth: replayed)
    in_memory: bool = False   # the whole batch is in memory before the loop: no data path to make free
    taskset: str | None = None    # cores the whole run is pinned to (taskset -c)
    needs: str | None = None  # a package the script imports beyond torch and numpy (skipped without it;
    #                           torchvision, timm, lightning: the environment of _real_script_env.py)
    busy: int = 0             # processes spinning beside this case's runs, added to --busy (a busy core)
    est_s: float = 90.0       # about how long its truth and profile take here, quiet (the benchmark's estimate
    #                           where the results hold no run of it): timm's 1 worker measured at 49 s (truth
    #                           29 s, profile 20 s); the others scaled from it by their steps and pixels
    env: tuple[tuple[str, str], ...] = ()  # environment variables the script needs here, as a user would set them
    stubs: tuple[str, ...] = ()  # modules replaced by a no-op stand-in (STUBS: an online logging service)
    truth_warmup: int = 8     # more than 4 workers x 2 prefetched batches
    truth_block: int = 4      # counted steps per block (as run, data free, as run, data free, ...)
    truth_pairs: int = 5      # pairs of blocks
    profile_args: tuple[str, ...] = field(default=("--warmup", "3", "--steps", "12"))

    @property
    def source(self) -> Repo:
        return REPOS[self.repo]


# --- synthetic data, in the format each script reads ---------------------------------------

def _text(path: Path, chars: int = 1_000_000, seed: int = 0) -> None:
    """Random words over 65 characters, as tiny Shakespeare has."""
    rng = random.Random(seed)
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ .,;:!?'-&$3\n"
    words = ["".join(rng.choice(alphabet[:52]) for _ in range(rng.randint(1, 9))) for _ in range(5000)]
    out, n = [], 0
    while n < chars:
        w = rng.choice(words) + rng.choice(" \n ,. ")
        out.append(w)
        n += len(w)
    path.write_text(alphabet + "".join(out)[:chars])     # every character once: chargpt samples from "O God, O God!"


def chargpt_text(checkout: Path, scratch: Path) -> None:
    _text(scratch / "input.txt")


def shakespeare_char_bins(checkout: Path, scratch: Path) -> None:
    """nanoGPT's data/shakespeare_char/{train,val}.bin (uint16 tokens) and meta.pkl, as prepare.py writes them."""
    d = checkout / "data" / "shakespeare_char"
    rng = np.random.default_rng(0)
    rng.integers(0, 65, 1_000_000, dtype=np.uint16).tofile(d / "train.bin")
    rng.integers(0, 65, 100_000, dtype=np.uint16).tofile(d / "val.bin")
    with open(d / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": 65, "itos": {i: chr(32 + i) for i in range(65)},
                     "stoi": {chr(32 + i): i for i in range(65)}}, f)


def wikitext_like(checkout: Path, scratch: Path) -> None:
    """word_language_model's --data folder: train.txt, valid.txt, test.txt of words, one sentence a line."""
    rng = random.Random(0)
    vocab = [f"w{i}" for i in range(2000)]
    d = scratch / "wikitext"
    d.mkdir()
    for name, lines in (("train.txt", 4000), ("valid.txt", 300), ("test.txt", 300)):
        (d / name).write_text("".join(" ".join(rng.choice(vocab) for _ in range(rng.randint(5, 25))) + "\n"
                                      for _ in range(lines)))


def sine_waves(checkout: Path, scratch: Path) -> None:
    """time_sequence_prediction's traindata.pt, as its generate_sine_wave.py makes it but 200 long, not 1000."""
    import torch

    rng = np.random.RandomState(2)
    T, L, N = 20, 200, 100
    x = np.empty((N, L), "int64")
    x[:] = np.array(range(L)) + rng.randint(-4 * T, 4 * T, N).reshape(N, 1)
    torch.save(np.sin(x / 1.0 / T).astype("float64"), open(scratch / "traindata.pt", "wb"))


def carvana_like(checkout: Path, scratch: Path, n: int = 200, distinct: int = 10, size=(3000, 2000)) -> None:
    """Pytorch-UNet's ``data/imgs/<id>.jpg`` and ``data/masks/<id>_mask.gif`` (Carvana's layout and
    formats): photographs of 6 megapixels, larger than Carvana's 1918 x 1280 (what a phone or a camera
    gives), smooth colour fields with blotches as JPEG at quality 90 (about 1 MB), and a two-valued
    mask; ``distinct`` images, each under ``n / distinct`` names (the decode costs the same whichever
    file it reads)."""
    from PIL import Image

    imgs, masks = scratch / "data" / "imgs", scratch / "data" / "masks"
    imgs.mkdir(parents=True)
    masks.mkdir(parents=True)
    w, h = size
    for k in range(distinct):
        channels = [Image.effect_noise((w // 16, h // 16), 60 + 10 * c).resize(size, Image.BILINEAR)
                    for c in range(3)]
        photo = Image.merge("RGB", channels)
        mask = channels[0].point(lambda v: 1 if v > 128 else 0)
        jpeg, gif = io.BytesIO(), io.BytesIO()
        photo.save(jpeg, "JPEG", quality=90)
        mask.save(gif, "GIF")
        for j in range(k, n, distinct):
            (imgs / f"{j:04d}.jpg").write_bytes(jpeg.getvalue())
            (masks / f"{j:04d}_mask.gif").write_bytes(gif.getvalue())


def _image_folder(scratch: Path, train: int, val: int, size: tuple[int, int], classes: int = 4,
                  distinct: int = 8) -> None:
    """``scratch/images/{train,val}/<class>/<n>.jpg``: torchvision's ImageFolder layout (ImageNet's, as the
    scripts' READMEs lay it out), photographs of ``size`` at JPEG quality 90 made of smooth colour fields with
    blotches (the detail of a photograph: a decode costs what a real photo of that size costs); ``distinct``
    images per class, each under several names (hard links: the disk holds each once, a read is a read)."""
    from PIL import Image

    w, h = size
    originals = scratch / "originals"
    originals.mkdir(exist_ok=True)
    for c in range(classes):
        photos = []
        for k in range(distinct):
            channels = [Image.effect_noise((max(1, w // 16), max(1, h // 16)), 40 + 8 * ch + 5 * c + k)
                        .resize(size, Image.BILINEAR) for ch in range(3)]
            photos.append(originals / f"{c}-{k}.jpg")
            Image.merge("RGB", channels).save(photos[-1], "JPEG", quality=90)
        for split, n in (("train", train), ("val", val)):
            d = scratch / "images" / split / f"class{c}"
            d.mkdir(parents=True)
            for j in range(c, n, classes):
                os.link(photos[j % distinct], d / f"{j:05d}.jpg")


def photos_256x192(checkout: Path, scratch: Path) -> None:
    """2000 training and 40 validation photographs of 256 x 192 (a small photo), 4 classes."""
    _image_folder(scratch, 2000, 40, (256, 192))


def photos_1280x960(checkout: Path, scratch: Path) -> None:
    """2000 training and 40 validation photographs of 1280 x 960 (a small camera photo: the decode of a
    256 x 192 one 25 times over), 4 classes."""
    _image_folder(scratch, 2000, 40, (1280, 960))


def photos_600(checkout: Path, scratch: Path) -> None:
    """600 training and 32 validation photographs of 256 x 192: short epochs (38 steps of 16)."""
    _image_folder(scratch, 600, 32, (256, 192))


DATA = {f.__name__: f for f in (chargpt_text, shakespeare_char_bins, wikitext_like, sine_waves, carvana_like,
                                photos_256x192, photos_1280x960, photos_600)}

# Stand-ins for the online services a script logs to, found first on PYTHONPATH: the script is unchanged, its
# logging goes nowhere. Pytorch-UNet's wandb.Image renders tensors with torchvision in the wandb of its time
# (and fails on 2-D masks in wandb 0.31): with the real package, its evaluation round could not run here.
STUBS = {"wandb": '''"""A no-op stand-in for wandb (Weights & Biases), written by hasten's benchmarks/real_script_cases.py."""


class _Config:
    def update(self, *args, **kwargs):
        pass


class _Run:
    config = _Config()

    def log(self, *args, **kwargs):
        pass


def init(*args, **kwargs):
    return _Run()


class Histogram:
    def __init__(self, *args, **kwargs):
        pass


class Image(Histogram):
    pass
'''}


# --- the cases -----------------------------------------------------------------------------

NANOGPT_CPU = ("config/train_shakespeare_char.py", "--device=cpu", "--compile=False", "--eval_iters=20",
               "--log_interval=1", "--max_iters=2000", "--lr_decay_iters=2000", "--dropout=0.0")
# Images scaled to 0.03 (90 x 60) so that a step's U-Net is under a second here; 198 training images in
# batches of 2 (an epoch of 99 steps: its workers, not persistent, start again at each), 2 validation images
# (its evaluation round every 9 steps, one batch).
UNET = ("--scale", "0.03", "--validation", "1", "--batch-size", "2")
# the ImageNet scripts on the photographs made here: batch 8 (resnet18 at 224 px: about half a second a step on
# two cores), no accelerator, a print every 10 steps, an epoch of 250 steps
IMAGENET = ("{scratch}/images", "-b", "8", "--epochs", "100", "--no-accel", "-p", "10")
TIMM = ("--data-dir", "{scratch}/images", "--val-split", "val", "--model", "resnet18", "--num-classes", "4",
        "--img-size", "112", "-b", "16", "--epochs", "100", "--device", "cpu", "--log-interval", "10",
        "--output", "{scratch}/out", "--checkpoint-hist", "1")
LIGHTNING = ("fit", "--model.data_path", "{scratch}/images", "--model.batch_size", "8", "--model.workers", "2",
             "--trainer.accelerator", "cpu", "--trainer.max_epochs", "100", "--trainer.default_root_dir",
             "{scratch}/out")
CHARGPT = ("--model.model_type=gpt-nano", "--trainer.batch_size=16", "--data.block_size=64")

CASES = [
    Case("minGPT chargpt, 4 workers", "minGPT", "projects/chargpt/chargpt.py", CHARGPT,
         pythonpath=True, data="chargpt_text"),
    Case("minGPT chargpt, num_workers=0, 1 core", "minGPT", "projects/chargpt/chargpt.py",
         (*CHARGPT, "--trainer.num_workers=0"), variant="slow data: num_workers=0, taskset -c 0",
         pythonpath=True, data="chargpt_text", taskset="0"),
    Case("minGPT adder", "minGPT", "projects/adder/adder.py", (), pythonpath=True),
    Case("nanoGPT shakespeare_char, README CPU run", "nanoGPT", "train.py",
         (*NANOGPT_CPU, "--block_size=64", "--batch_size=12", "--n_layer=4", "--n_head=4", "--n_embd=128"),
         cwd="checkout", data="shakespeare_char_bins", data_fn="get_batch"),
    Case("nanoGPT shakespeare_char, tiny context", "nanoGPT", "train.py",
         (*NANOGPT_CPU, "--block_size=8", "--batch_size=512", "--n_layer=1", "--n_head=2", "--n_embd=32"),
         variant="slow data: block 8, batch 512 (get_batch's per-row list)",
         cwd="checkout", data="shakespeare_char_bins", data_fn="get_batch"),
    Case("word_language_model LSTM (update by hand)", "examples", "word_language_model/main.py",
         ("--data", "{scratch}/wikitext", "--model", "LSTM", "--emsize", "64", "--nhid", "64", "--epochs", "40",
          "--save", "{scratch}/model.pt"), data="wikitext_like", data_fn="get_batch"),
    Case("word_language_model Transformer, AdamW", "examples", "word_language_model/main.py",
         ("--data", "{scratch}/wikitext", "--model", "Transformer", "--emsize", "64", "--nhid", "128",
          "--epochs", "40", "--use-optimizer", "--lr", "0.001", "--save", "{scratch}/model.pt"),
         data="wikitext_like", data_fn="get_batch"),
    Case("regression (update by hand)", "examples", "regression/main.py", (), data_fn="get_batch"),
    Case("time_sequence_prediction, LBFGS", "examples", "time_sequence_prediction/train.py",
         ("--steps", "40"), data="sine_waves", in_memory=True,
         # its torch.load of a pickled numpy array: torch >= 2.6 loads weights only by default, and numpy 2's
         # array reconstructor is not on that list (the script fails without hasten otherwise)
         env=(("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1"),), truth_warmup=2, truth_block=2, truth_pairs=2,
         profile_args=("--warmup", "2", "--steps", "6")),
    Case("makemore transformer, 4 workers", "makemore", "makemore.py",
         ("-i", "{checkout}/names.txt", "-o", "{scratch}/out"), needs="tensorboard"),
    Case("makemore transformer, num_workers=0", "makemore", "makemore.py",
         ("-i", "{checkout}/names.txt", "-o", "{scratch}/out", "--num-workers", "0"),
         variant="slow data: num_workers=0", needs="tensorboard"),
    Case("REINFORCE on CartPole", "examples", "reinforcement_learning/reinforce.py", (), needs="gymnasium"),
    Case("actor-critic on CartPole", "examples", "reinforcement_learning/actor_critic.py", (), needs="gymnasium"),
    # JPEG decoding in the script's own Dataset (PIL, no torchvision), its 4 workers as shipped at this commit
    Case("Pytorch-UNet, 4 workers decoding JPEGs", "Pytorch-UNet", "train.py",
         UNET, variant="as shipped: 4 workers, PIL decode",
         data="carvana_like", stubs=("wandb",)),
    Case("Pytorch-UNet, 4 workers decoding JPEGs, 1 core", "Pytorch-UNet", "train.py",
         UNET,
         variant="few cores: the step and its 4 workers on one core (taskset -c 0)",
         data="carvana_like", stubs=("wandb",), taskset="0"),
    Case("ng-video-lecture bigram", "ng-video-lecture", "bigram.py", (), cwd="checkout", data_fn="get_batch"),

    # --- image training with torchvision, timm and Lightning (issue 43; the environment of _real_script_env.py)
    # pytorch/examples' ImageNet script: ImageFolder, RandomResizedCrop(224) and a flip in its workers, its
    # validation pass after each epoch; resnet18 at batch 8 (a step of about half a second here).
    Case("imagenet main.py resnet18, 4 workers", "examples", "imagenet/main.py",
         (*IMAGENET, "-a", "resnet18", "-j", "4"), data="photos_256x192", needs="torchvision", est_s=120),
    Case("imagenet main.py mobilenet_v3_small, 1 worker, 1280 x 960 photos", "examples", "imagenet/main.py",
         (*IMAGENET, "-a", "mobilenet_v3_small", "-j", "1"), variant="slow data: 1 worker, 1280 x 960 photos",
         data="photos_1280x960", needs="torchvision", est_s=60),
    Case("imagenet main.py mobilenet_v3_small, 1 worker beside a busy core", "examples", "imagenet/main.py",
         (*IMAGENET, "-a", "mobilenet_v3_small", "-j", "1"),
         variant="slow data: 1 worker, a process spinning beside it", data="photos_256x192", needs="torchvision",
         busy=1, est_s=60),
    # timm's train.py: its own loader (timm.data.create_loader: RandomResizedCropAndInterpolation, flip, colour
    # jitter), resnet18 at 112 px, batch 16, its cosine schedule; --val-split val (the folder made here).
    Case("timm train.py resnet18, 4 workers", "timm", "train.py", (*TIMM, "-j", "4"),
         data="photos_256x192", needs="timm", est_s=60),
    # 1 worker on 256 x 192 photos nearly keeps up here (data 6% of the step, 4-8%: undecided); on larger
    # photos it cannot
    Case("timm train.py resnet18, 1 worker, 1280 x 960 photos", "timm", "train.py", (*TIMM, "-j", "1"),
         variant="slow data: 1 worker, 1280 x 960 photos", data="photos_1280x960", needs="timm", est_s=90),
    Case("timm train.py resnet18, short epochs (600 images)", "timm", "train.py", (*TIMM, "-j", "4"),
         variant="short epochs: 38 steps, then validation and the workers started again",
         data="photos_600", needs="timm", est_s=90),
    # an augmenting dataset: RandAugment (2 of 15 PIL operations per image) and random erasing in the workers;
    # mmax9 (timm's own cap on the noisy magnitude): at magnitude 10 timm's increasing posterize asks for 0
    # bits, which Pillow >= 12 refuses, so the script fails without hasten 1 run in a few
    Case("timm train.py resnet18, RandAugment + random erasing, 2 workers", "timm", "train.py",
         (*TIMM, "-j", "2", "--aa", "rand-m9-mstd0.5-inc1-mmax9", "--reprob", "0.25"),
         variant="augmenting dataset: RandAugment, random erasing", data="photos_256x192", needs="timm",
         est_s=75),
    # Lightning's ImageNet template: LightningCLI and its Trainer around the same ImageFolder pipeline
    Case("Lightning imagenet.py resnet18, 2 workers", "lightning", "examples/pytorch/domain_templates/imagenet.py",
         LIGHTNING, data="photos_256x192", needs="lightning", est_s=100),
]
