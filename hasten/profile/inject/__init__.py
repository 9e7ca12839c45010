"""What ``hasten profile`` runs inside every process of a profiled command.

:mod:`hasten.profile.attach` calls :func:`install` in each Python of a profiled command
(``HASTEN_PROFILE_DIR`` set) once it has imported torch. From then on, in each process
of the user's unmodified command (every torchrun worker included):

- :mod:`~hasten.profile.inject.settings`: the ``HASTEN_PROFILE_*`` environment;
- :mod:`~hasten.profile.inject.state`: what the process has seen so far;
- :mod:`~hasten.profile.inject.steps`: where a step ends (an optimizer step), compute
  intervals, and each step's record;
- :mod:`~hasten.profile.inject.torch_patches`: module forward hooks, ``backward``,
  ``clip_grad_norm_`` and collectives;
- :mod:`~hasten.profile.inject.loader`: DataLoader iterators, the training loader;
- :mod:`~hasten.profile.inject.ddp`: DDP's dispatching communication hook, link timings;
- :mod:`~hasten.profile.inject.phases`: warm-up, measure, replay, loader alone;
- :mod:`~hasten.profile.inject.epoch_fit`: the replayed steps inside the training loader's
  pass, never a batch past ``len(loader)``;
- :mod:`~hasten.profile.inject.augmentation`: whether the training dataset's items are drawn
  at random, and one item's size before its transform;
- :mod:`~hasten.profile.inject.probes`: dropping a probe that fails; the loader alone
  and a batch's hand-off;
- :mod:`~hasten.profile.inject.autocast_check`: the model under bf16 autocast, tried in
  isolation before a replayed step does;
- :mod:`~hasten.profile.inject.batches`: batch sizes, data or not, copies to replay;
- :mod:`~hasten.profile.inject.fixes`: the fixes a verification run applies;
- :mod:`~hasten.profile.inject.batch_fn`: ... and those it applies to the batch function of a
  loop without a DataLoader;
- :mod:`~hasten.profile.inject.resident`: ... and the device-resident loader's, from the loop's own
  batches kept in memory;
- :mod:`~hasten.profile.inject.sampler`: where the main thread is, and the status file;
- :mod:`~hasten.profile.inject.batch_source`: the lines that make the batch (no DataLoader);
- :mod:`~hasten.profile.inject.batch_shape`: what those lines do, for the input fixes to fit them;
- :mod:`~hasten.profile.inject.rows_at_once`: the rows fix, a batch made row by row rewritten as one index;
- :mod:`~hasten.profile.inject.source_tree`: the user's script read as a syntax tree;
- :mod:`~hasten.profile.inject.cpu_window`: the cores other processes left over the window;
- :mod:`~hasten.profile.inject.messages`: one-line messages, error lines, the status file,
  hasten's own failure;
- :mod:`~hasten.profile.inject.report`: the rank's report, and how its process exits;
- :mod:`~hasten.profile.inject.user_code`: which frames are the user's own code;
- :mod:`~hasten.profile.inject.device_sync`: the device synchronised at step boundaries.

Nothing here imports torch at import time: :mod:`hasten.profile.attach` runs in every
Python the command starts.

Changes the training math: only with the fixes of :mod:`~hasten.profile.inject.fixes`,
and in the replayed steps (a repeated batch; in ``comm_off`` steps, without averaging
gradients), after which the process exits.
"""

from __future__ import annotations

import atexit
import os
import sys

from hasten.profile.inject.settings import ENV_DIR


def install() -> None:
    """Patch optimizers, modules, backward, DataLoader iterators, DDP and collectives (idempotent).

    hasten's own failure here leaves the command running unprofiled, and says so to the
    launcher (a status file with ``hasten_error``), which stops it and reports hasten's
    failure, not the command's."""
    if ENV_DIR not in os.environ:
        return
    try:
        from hasten.profile.inject import state
        if state.current is not None:
            return
        _install()
    except Exception as exc:
        _install_failed(exc)


def _install_failed(exc: Exception) -> None:
    # The standard library only: the failure may be an import of hasten's own.
    import json
    import traceback
    frame = traceback.extract_tb(exc.__traceback__)[-1:]
    where = f" (at {os.path.basename(frame[0].filename)}:{frame[0].lineno})" if frame else ""
    error = f"install: {type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}{where}"
    state = sys.modules.get("hasten.profile.inject.state")
    st = getattr(state, "current", None)
    if st is not None:
        st.finished = True  # hooks already in place do nothing
    sys.stderr.write(f"hasten profile: hasten's own {error}; process {os.getpid()} is not profiled\n")
    try:
        path = os.path.join(os.environ[ENV_DIR], f"status-{os.getpid()}.json")
        with open(f"{path}.tmp", "w") as f:
            json.dump({"pid": os.getpid(), "rank": int(os.environ.get("RANK", "0") or 0),
                       "ranked": "RANK" in os.environ, "hasten_error": error}, f)
        os.replace(f"{path}.tmp", path)
    except (OSError, ValueError):
        pass


def _install() -> None:
    import torch

    from hasten.profile.inject import ddp, fixes, loader, report, sampler, state, steps, torch_patches
    from hasten.profile.inject.settings import Settings

    st = state.current = state.State(Settings.from_environment())
    loader.patch_dataloader(st)
    fixes.install_fixes(st)
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
    register_optimizer_step_pre_hook(steps.optimizer_pre)
    register_optimizer_step_post_hook(steps.optimizer_post)
    from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
    register_module_forward_pre_hook(torch_patches.forward_pre)
    register_module_forward_hook(torch_patches.forward_post)
    torch_patches.patch_backward()
    torch_patches.patch_optimizer_init()
    torch_patches.patch_collectives()
    ddp.patch_ddp()
    if torch.cuda.is_available():
        st.device = "cuda"
    atexit.register(report.at_exit)
    sys.excepthook = report.excepthook(sys.excepthook)
    sampler.start(st)
