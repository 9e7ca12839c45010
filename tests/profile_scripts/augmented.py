"""A map-style dataset in torchvision's style: a ``transform`` applied in ``__getitem__`` (issue 43).

    python augmented.py [--augment | --fixed | --tensors | --iterable] [--digest PATH]

``--augment``: a random crop and flip (torch's generator), numpy noise and a ``random`` shift of each
32x32x3 uint8 image; ``--fixed``: a transform without randomness (to float, scaled); ``--tensors``: a
``TensorDataset`` of the float images; ``--iterable``: an IterableDataset of them. ``--digest PATH``
writes, after each optimizer step, a hash of the three random generators' states: a profile that
reads the dataset must leave them as they were.
"""

import argparse
import hashlib
import random

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset, Subset, TensorDataset

IMAGES = torch.randint(0, 256, (256, 32, 32, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))


def fixed(img):
    return img.permute(2, 0, 1).float() / 255


def augment(img):
    x = fixed(img)
    i, j = torch.randint(0, 5, (2,)).tolist()
    x = F.pad(x, (2, 2, 2, 2))[:, i:i + 32, j:j + 32]
    if torch.rand(()) < 0.5:
        x = x.flip(2)
    return x + torch.from_numpy(np.random.normal(0, 0.01, x.shape).astype("float32")) * random.random()


class Images(Dataset):
    def __init__(self, transform):
        self.transform = transform

    def __len__(self):
        return len(IMAGES)

    def __getitem__(self, i):
        img = IMAGES[i]
        if self.transform is not None:
            img = self.transform(img)
        return img, i % 10


class Stream(IterableDataset):
    def __iter__(self):
        for i in range(len(IMAGES)):
            yield fixed(IMAGES[i]), i % 10


def digest() -> str:
    h = hashlib.sha256(repr(random.getstate()).encode())
    h.update(repr(np.random.get_state()[1].tolist()).encode())
    h.update(torch.get_rng_state().numpy().tobytes())
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser()
    kind = ap.add_mutually_exclusive_group()
    for k in ("augment", "fixed", "tensors", "iterable"):
        kind.add_argument(f"--{k}", dest="kind", action="store_const", const=k)
    ap.add_argument("--digest", default=None)
    args = ap.parse_args()
    kind = args.kind or "augment"
    if kind == "tensors":
        data = TensorDataset(torch.stack([fixed(x) for x in IMAGES]), torch.arange(len(IMAGES)) % 10)
    elif kind == "iterable":
        data = Stream()
    else:
        data = Subset(Images(augment if kind == "augment" else fixed), range(len(IMAGES)))
    loader = DataLoader(data, batch_size=16, shuffle=kind != "iterable")
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    out = open(args.digest, "w") if args.digest else None
    for _ in range(100):
        for x, y in loader:
            F.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            if out:
                out.write(digest() + "\n")
                out.flush()


if __name__ == "__main__":
    main()
