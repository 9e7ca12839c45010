"""Optimizer steps that are not a plain ``opt.step()``: LBFGS's closure, or a gradient scaler.

    python closure_step.py --optimizer lbfgs|scaler

``lbfgs``: ``opt.step(closure)``, the forward and backward inside the optimizer's step
(evaluated up to ``max_iter`` times). ``scaler``: ``torch.amp.GradScaler``'s
``scaler.scale(loss).backward(); scaler.step(opt); scaler.update()``, which steps the
optimizer only when the gradients are finite.
"""

import argparse

import torch
from _truth import Truth
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--optimizer", choices=("lbfgs", "scaler"), required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    loader = DataLoader(TensorDataset(torch.randn(2048, 16), torch.randn(2048, 1)), batch_size=64, shuffle=True)
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1))
    truth = Truth()
    if args.optimizer == "lbfgs":
        opt = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=4)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    for _ in range(1000):
        for x, y in loader:
            if args.optimizer == "lbfgs":
                def closure():
                    opt.zero_grad()
                    loss = nn.functional.mse_loss(model(x), y)
                    loss.backward()
                    return loss
                opt.step(closure)
            else:
                loss = nn.functional.mse_loss(model(x), y)
                opt.zero_grad()
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            truth.tick()


if __name__ == "__main__":
    main()
