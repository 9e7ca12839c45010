"""`hasten profile` never hands a loop more batches than ``len(loader)`` (issue 43).

tests/profile_scripts/short_epochs.py trusts ``len(loader)`` three ways (timm's accumulation
arithmetic, which divides by zero one batch past the end; ``assert batch_idx < len(loader)``;
``OneCycleLR(total_steps=epochs * len(loader))``) and runs epochs shorter than the warm-up, the
window and the replayed steps together (2 + 5 + 2 of each kind). Any batch too many ends the
script with an exception, and the profile with exit code 70
(tests/test_profile_no_harm.py). The planning of the replayed
steps against a pass's length is also checked on its own (:func:`epoch_fit.plan`).
"""

import sys
from pathlib import Path

import pytest

from hasten.profile.inject import epoch_fit
from hasten.profile.inject.phases import replay_kinds
from hasten.profile.inject.settings import PROBES
from hasten.profile.launcher import ProfileConfig, profile

SCRIPTS = Path(__file__).parent / "profile_scripts"
WARMUP, STEPS = 2, 5


def run_profile(*args, **kw):
    kw = {"warmup": WARMUP, "steps": STEPS, "probe_steps": 2, "capture": True, "timeout_s": 600, "decide_s": 0, **kw}
    return profile(ProfileConfig((sys.executable, str(SCRIPTS / "short_epochs.py"), *map(str, args)), **kw),
                   log=lambda m: None)


@pytest.mark.parametrize("args", [("--items", 128), ("--items", 120, "--accum", 3),
                                  ("--items", 128, "--workers", 2, "--persistent")],
                         ids=["8-batch-epochs", "accumulation", "persistent-workers"])
def test_epochs_shorter_than_warmup_window_and_probes_never_get_a_batch_too_many(args):
    # 7 steps warm-up and window leave 1 batch of an 8-batch epoch (0 of 3 accumulated steps'):
    # the replayed steps wait for the next pass, and the script runs through them unharmed
    a = run_profile(*args, "--epochs", 50)
    assert a.step_alone_s > 0
    assert not [x for x in a.dropped if x["probe"] == "replay"]


def test_the_loader_probe_times_the_pass_the_replayed_steps_waited_for():
    # 7 steps of an 8-batch epoch leave 1 batch: the replayed steps take the next pass whole, each of its
    # batches a replayed one, its workers' iterator a new one. The loader probe timed the last pass's,
    # ended, iterator: no batch, nothing said (kuangliu/pytorch-cifar's 20-batch epochs, 2 workers), and
    # the num_workers=0 fix was predicted from the loop's CPU receiving batches, not the workers' making them
    a = run_profile("--items", 128, "--workers", 2, "--epochs", 50)
    assert a.step_alone_s > 0
    assert not a.dropped
    assert a.loader_batch_s is not None and a.loader_batch_s > 0


def test_a_pass_too_short_for_the_replayed_steps_skips_them_and_says_so():
    # one batch an epoch: no pass holds the two replayed steps the least replay takes
    a = run_profile("--items", 16, "--epochs", 100)
    (why,) = [x["why"] for x in a.dropped if x["probe"] == "replay"]
    assert why.startswith("skipped:") and "len(loader)" in why and "1 batch" in why


def test_a_command_that_ends_while_the_replay_waits_for_a_pass_is_reported_not_failed():
    # two 8-batch epochs: the replay waits past the first, and may start in the second or find it ends
    a = run_profile("--items", 128, "--epochs", 1)
    assert [x["probe"] for x in a.dropped][:1] == ["replay"]
    assert a.steps >= 3


# ---- the plan, on its own: a pass's length against the replayed steps' batches

class _Iter:
    def __init__(self, n, handed):
        self.n, self.__dict__["_hasten_handed"] = n, handed

    def __len__(self):
        return self.n


class _State:
    """What epoch_fit reads of a process's state: a training loader, its iterator, the measured steps."""

    def __init__(self, n, handed, probe_steps=8, micro=1, ddp=False):
        self.train_iter = (_Iter(n, handed), None)
        self.loaders = {1: {"train_votes": 1, "eval_votes": 0}}
        self.records = {"measure": [{"micro": micro, "via_loader": True}] * 3}
        self.probe_steps, self.probes = probe_steps, set(PROBES)
        self.ddp, self.world_size, self.rank, self.device = [object()] if ddp else [], 2 if ddp else 1, 0, "cpu"
        self.dropped, self.step_kind, self.comm_mode = [], "measure", "real"
        self.loader_probe = {}
        self.records.update({k: [] for k in ("step_alone", "comm_off", "comm_bf16", "autocast")})


@pytest.mark.parametrize("n,handed,micro,fits", [(37, 21, 1, True), (37, 22, 1, False), (37, 37, 1, True),
                                                 (37, 29, 2, False), (40, 8, 2, True)])
def test_the_replay_fits_in_the_batches_left_or_in_the_next_pass(n, handed, micro, fits):
    st = _State(n, handed, micro=micro)  # 8 steps of 2 kinds: 16 batches a micro-batch
    assert epoch_fit.fits(st, 2) == fits


def test_a_short_pass_takes_fewer_replayed_steps_then_fewer_kinds_then_none(capsys):
    st = _State(12, 0)  # 2 kinds x 8 steps = 16 batches > 12: 6 steps of each kind
    epoch_fit.plan(st, replay_kinds)
    assert st.probe_steps == 6 and not st.dropped
    st = _State(3, 0)  # 2 kinds x 2 steps = 4 > 3: autocast skipped, 2 steps of the replay alone fit
    epoch_fit.plan(st, replay_kinds)
    assert [x["probe"] for x in st.dropped] == ["autocast"] and replay_kinds(st) == ("step_alone",)
    st = _State(1, 0)
    epoch_fit.plan(st, replay_kinds)
    assert "replay" not in st.probes and all(x["why"].startswith("skipped:") for x in st.dropped)
    assert "skipped: a pass of the training loader is 1 batch" in capsys.readouterr().err


def test_ddp_keeps_its_comm_probe_before_autocast():
    st = _State(7, 0, ddp=True)  # 4 kinds x 2 = 8 > 7: autocast goes first, then 3 kinds x 2 = 6 fit
    st.probe_steps = 2
    epoch_fit.plan(st, replay_kinds)
    assert [x["probe"] for x in st.dropped] == ["autocast"] and "comm" in st.probes

