"""A GAN's loop, as pytorch/examples' DCGAN writes it: two optimizers, the discriminator stepped first.

    python gan.py [--no-loader] [--retain-graph] [--device-sleep 0.01]

One optimizer step of the discriminator, then one of the generator, per batch. The
generator's output goes into the discriminator twice: detached for the discriminator's
step, attached for the generator's. ``--retain-graph`` keeps the generator's graph through
the discriminator's backward instead of detaching (the other common way). Without a
loader (``--no-loader``), real examples are drawn in the loop.
"""

import argparse

import torch
from _truth import Truth, sleep_module
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-loader", action="store_true")
    ap.add_argument("--retain-graph", action="store_true")
    ap.add_argument("--device-sleep", type=float, default=0.0, help="accelerator time per discriminator forward")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    batch, noise = 32, 8
    netG = nn.Sequential(nn.Linear(noise, 32), nn.ReLU(), nn.Linear(32, 16))
    netD = nn.Sequential(sleep_module()(args.device_sleep), nn.Linear(16, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))
    optD = torch.optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
    optG = torch.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))
    criterion = nn.BCEWithLogitsLoss()
    real_label, fake_label = torch.ones(batch, 1), torch.zeros(batch, 1)
    truth = Truth()

    def batches():
        if args.no_loader:
            while True:
                yield torch.randn(batch, 16) + 2.0
        loader = DataLoader(TensorDataset(torch.randn(4096, 16) + 2.0), batch_size=batch, shuffle=True,
                            drop_last=True)
        while True:
            for (real,) in loader:
                yield real

    for real in batches():
        # (1) the discriminator: maximize log(D(x)) + log(1 - D(G(z)))
        netD.zero_grad()
        errD_real = criterion(netD(real), real_label)
        errD_real.backward()
        fake = netG(torch.randn(batch, noise))
        if args.retain_graph:
            errD_fake = criterion(netD(fake), fake_label)
            errD_fake.backward(retain_graph=True)
        else:
            errD_fake = criterion(netD(fake.detach()), fake_label)
            errD_fake.backward()
        optD.step()
        # (2) the generator: maximize log(D(G(z)))
        netG.zero_grad()
        errG = criterion(netD(fake), real_label)
        errG.backward()
        optG.step()
        truth.tick()


if __name__ == "__main__":
    main()
