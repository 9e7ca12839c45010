"""hasten: make neural-network training as fast as the hardware allows.

Subpackages, each named for what it holds:

- ``hasten.data``: CIFAR-10 (canonical binary) and image-folder datasets, decode-once
  caching, the GPU-resident loader and batched on-device augmentation, the
  streaming input pipeline.
- ``hasten.echo``: data echoing (Choi et al., 2019) stages and AutoEcho.
- ``hasten.distributed``: ring, naive and 2-D torus all-reduce on torch.distributed, DDP
  communication hooks, the alpha-beta cost model.
- ``hasten.nn``: ghost / group batch norm, patch whitening, EMA, test-time augmentation.
- ``hasten.optim``: LARS and learning-rate schedules.
- ``hasten.models``: the speedrun networks and ResNets.
- ``hasten.recipes``: end-to-end training recipes wired into the ``hasten`` CLI.
"""

__version__ = "0.1.0"
