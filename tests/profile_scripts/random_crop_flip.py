"""A tiny CNN fed by a DataLoader whose dataset crops and flips at random in ``__getitem__``: docs/profile.md's
first report (``hasten profile --verify -- python random_crop_flip.py --workers 2``)."""
import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset


class RandomCropFlip(Dataset):
    def __init__(self, n=4096, size=40, crop=32):
        g = torch.Generator().manual_seed(0)
        self.images = torch.rand(n, 3, size, size, generator=g)
        self.labels = torch.randint(0, 10, (n,), generator=g)
        self.size, self.crop = size, crop

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        top, left = torch.randint(0, self.size - self.crop + 1, (2,)).tolist()
        x = self.images[i, :, top:top + self.crop, left:left + self.crop]
        if torch.rand(()) < 0.5:
            x = x.flip(-1)
        return x.contiguous(), self.labels[i]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--epochs", type=int, default=100)
    a = p.parse_args()
    loader = DataLoader(RandomCropFlip(), batch_size=64, shuffle=True, num_workers=a.workers)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(),
                          nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(a.epochs):
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()


if __name__ == "__main__":
    main()
