"""hasten: make neural-network training as fast as the hardware allows.

Every technique works on its own in a plain PyTorch loop and is also wired into a recipe
and the ``hasten`` command line. Subpackages, each named for what it holds:

- ``hasten.data``: CIFAR-10 and image-folder datasets decoded once; device and host loaders, augmentation.
- ``hasten.stream``: the input pipeline that decodes every epoch (``ShardLoader`` over shards, their URL, a folder or an archive; echo as a stage on it).
- ``hasten.echo``: data echoing (Choi et al., 2019): echo stages, the shuffle buffer's size after them, AutoEcho.
- ``hasten.distributed``: ring, torus and naive all-reduce, DDP hooks, data-parallel set-up, lost ranks.
- ``hasten.harness``: what the all-reduce benchmarks run on: rank launcher, emulated cluster, timing.
- ``hasten.nn``: ghost / group batch norm, patch whitening, EMA, bf16 precision, test-time augmentation.
- ``hasten.optim``: LARS, learning-rate schedules, the gradient noise scale.
- ``hasten.models``: the speedrun network and ResNets.
- ``hasten.recipes``: the end-to-end training runs (speedrun, echo, allreduce, train) behind the CLI.
- ``hasten.profile``: why training is slower than the hardware, and the fixes, predicted and verified.
- ``hasten.commands``: one thin module per ``hasten`` sub-command (parse, build a config, call a recipe).

Modules:

- ``hasten.cli``: the ``hasten`` command line (also ``python -m hasten``).
- ``hasten.cli_types``: the command line's option types, each checking its value.
- ``hasten.errors``: errors meant for the user, printed by the CLI as one line.
- ``hasten.timing``: the one stopwatch, synchronising the device at both ends.
- ``hasten.stats``: means, sample std, exact Student-t 95% intervals, paired ratios.
- ``hasten.checkpoint``: checkpoints written atomically, loaded safely.
- ``hasten.rundir``: run directories (config, environment, metrics, results) and run journals.
- ``hasten.environment``: what a result was measured on: version, git commit, software, hardware.
- ``hasten.progress``: a progress bar on a terminal, a plain line every 30 s in a log.
- ``hasten.plots``: PNG plots for run directories and benchmarks.
"""

__version__ = "0.1.0"
