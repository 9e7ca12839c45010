"""A script that trains without ever iterating a torch DataLoader."""

import torch

model = torch.nn.Linear(4, 1)
for _ in range(3):
    model(torch.randn(8, 4)).sum().backward()
print("done without a DataLoader")
