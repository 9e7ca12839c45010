"""An LSTM classifier on CPU, the issue-32 case: some CPUs' oneDNN has no bf16 LSTM.

    python lstm.py [--no-bf16-lstm] [--digest PATH] [--reject-repeated-batch] [--steps N]

``--no-bf16-lstm`` makes the LSTM refuse bf16 autocast with oneDNN's own error, as it does
on a CPU without bf16 support, whatever CPU runs the test. ``--digest PATH`` writes, after
each optimizer step, a hash of everything a probe must leave alone: weights, gradients,
BatchNorm buffers, Adam's state and the random number generator (dropout and the loader's
shuffle draw from it). ``--reject-repeated-batch`` raises on a batch it has seen before,
as a loop that checks its data would: a replayed step then fails inside the loop.
"""

import argparse
import hashlib

import torch
from _truth import Truth
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Lstm(nn.LSTM):
    def __init__(self, *args, refuse_bf16: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.refuse_bf16 = refuse_bf16

    def forward(self, x, hx=None):
        if self.refuse_bf16 and torch.is_autocast_enabled("cpu"):
            raise RuntimeError("could not create a primitive descriptor for the LSTM forward propagation primitive")
        return super().forward(x, hx)


class Classifier(nn.Module):
    def __init__(self, refuse_bf16: bool):
        super().__init__()
        self.norm = nn.BatchNorm1d(16)  # running statistics: buffers a probe's forward would move
        self.drop = nn.Dropout(0.2)  # draws from the random number generator
        self.lstm = Lstm(16, 32, batch_first=True, refuse_bf16=refuse_bf16)
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        x = self.drop(self.norm(x.transpose(1, 2)).transpose(1, 2))
        out, _ = self.lstm(x)
        return self.head(out[:, -1])


def digest(model, opt) -> str:
    h = hashlib.sha256()
    tensors = [*model.parameters(), *(p.grad for p in model.parameters() if p.grad is not None), *model.buffers(),
               *(v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)), torch.get_rng_state()]
    for t in tensors:
        h.update(t.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-bf16-lstm", action="store_true")
    ap.add_argument("--digest", default=None)
    ap.add_argument("--reject-repeated-batch", action="store_true")
    ap.add_argument("--steps", type=int, default=10**9)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    data = TensorDataset(torch.randn(512, 12, 16), torch.randint(0, 4, (512,)))
    loader = DataLoader(data, batch_size=32, shuffle=True)
    model = Classifier(args.no_bf16_lstm)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    truth = Truth()
    seen = set()
    out = open(args.digest, "w") if args.digest else None
    step = 0
    while step < args.steps:
        for x, y in loader:
            if args.reject_repeated_batch:
                key = hashlib.sha256(x.numpy().tobytes()).hexdigest()
                if key in seen:
                    raise ValueError("this batch was seen before")
                seen.add(key)
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            truth.tick()
            if out:
                out.write(f"{step} {digest(model, opt)}\n")
                out.flush()
            if step >= args.steps:
                break


if __name__ == "__main__":
    main()
