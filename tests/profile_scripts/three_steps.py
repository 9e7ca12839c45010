"""Three optimizer steps of a tiny model, then exit: the least a Python must do to show it was attached.

Ignores its arguments (``deepspeed`` appends ``--local_rank=0``)."""

import torch

torch.set_num_threads(1)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    loss = model(torch.randn(4, 8)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
