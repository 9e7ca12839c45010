import os
import subprocess
import sys

import pytest

from hasten import cores


def _ticks(monkeypatch, samples):
    """Make /proc/stat read as ``samples`` ((busy, total) jiffies), one per call."""
    it = iter(samples)
    monkeypatch.setattr(cores, "_cpu_ticks", lambda: next(it))


@pytest.mark.parametrize("busy_share, threads", [(0.0, 2), (0.2, 2), (0.3, 1), (0.5, 1), (0.9, 1), (1.0, 1)])
def test_spinning_threads_are_the_cores_others_leave_free(monkeypatch, busy_share, threads):
    # 1,000 jiffies over both cores, busy_share of them used by other processes.
    _ticks(monkeypatch, [(0, 0), (int(1000 * busy_share), 1000)])
    share = cores.free_cores(0.0, cores=2, passive=False)
    assert share.threads == threads
    assert share.busy == pytest.approx(2 * busy_share)
    assert share.free == pytest.approx(2 - 2 * busy_share)


def test_four_cores_half_busy_gives_two_spinning_threads(monkeypatch):
    _ticks(monkeypatch, [(100, 1000), (600, 2000)])
    assert cores.free_cores(0.0, cores=4, passive=False).threads == 2


def test_sleeping_threads_use_every_core_and_say_why(monkeypatch):
    _ticks(monkeypatch, [(0, 0), (900, 1000)])
    share = cores.free_cores(0.0, cores=2, passive=True)
    assert share.threads == 2 and share.busy == pytest.approx(1.8)
    assert "although other processes keep 1.8 busy: the threads sleep while they wait" in share.line()
    # the process's own policy decides by default
    monkeypatch.setenv("OMP_WAIT_POLICY", "active")
    _ticks(monkeypatch, [(0, 0), (900, 1000)])
    assert cores.free_cores(0.0, cores=2).threads == 1
    monkeypatch.setenv("OMP_WAIT_POLICY", "passive")
    _ticks(monkeypatch, [(0, 0), (900, 1000)])
    assert cores.free_cores(0.0, cores=2).threads == 2


def test_no_proc_stat_means_all_cores(monkeypatch):
    _ticks(monkeypatch, [None, None])
    share = cores.free_cores(0.0, cores=3)
    assert share.threads == 3 and share.busy == 0


def test_the_line_says_why_fewer_threads():
    assert "other processes keep 1.5 of them busy, and these threads spin" in cores.CoreShare(2, 1.5, 1, False).line()
    assert cores.CoreShare(2, 0.1, 2).line() == "threads: 2 (2 cores, 1.9 free; waiting threads sleep)"
    assert cores.CoreShare(2, 0.1, 2, passive=False).line().endswith("waiting threads spin)")


def test_proc_stat_counts_niced_time_as_free():
    if not os.path.exists("/proc/stat"):
        pytest.skip("no /proc/stat on this system")
    fields = [int(v) for v in open("/proc/stat").readline().split()[1:]]
    busy, total = cores._cpu_ticks()
    # busy = user + system + irq + softirq + steal: nice, idle and iowait excluded
    assert busy <= total - fields[1] - fields[3]


def _env_policy(code: str, **env) -> str:
    full = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    full.update(env)
    out = subprocess.run([sys.executable, "-c", code + "; import os; print(os.environ.get('OMP_WAIT_POLICY'))"],
                         capture_output=True, text=True, env=full, check=True)
    return out.stdout.split()[-1]


def test_passive_wait_is_asked_for_on_a_busy_machine_only(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.setitem(sys.modules, "torch", None)  # restored after the test
    del sys.modules["torch"]
    _ticks(monkeypatch, [(0, 0), (100, 1000)])  # others keep 0.2 of 2 cores busy
    monkeypatch.setattr(cores, "usable_cores", lambda: 2)
    assert not cores.prefer_passive_wait(0.0) and "OMP_WAIT_POLICY" not in os.environ
    _ticks(monkeypatch, [(0, 0), (600, 1000)])  # 1.2 of 2
    assert cores.prefer_passive_wait(0.0) and os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")  # the user's policy stays
    _ticks(monkeypatch, [(0, 0), (600, 1000)])
    assert not cores.prefer_passive_wait(0.0) and os.environ["OMP_WAIT_POLICY"] == "ACTIVE"


def test_speedrun_command_keeps_the_users_policy_and_asks_before_torch_loads():
    # a policy the user set is theirs
    assert _env_policy("import hasten.commands.speedrun", OMP_WAIT_POLICY="ACTIVE") == "ACTIVE"
    # too late once torch is loaded: OpenMP read its settings then, so nothing is set
    assert _env_policy("import torch; from hasten.cores import prefer_passive_wait as p; print(p())") == "None"
    # beside a process that keeps a core busy, the command asks for sleeping threads
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        assert _env_policy("import hasten.commands.speedrun") == "PASSIVE"
    finally:
        spinner.kill()
        spinner.wait()


def test_one_sample_decides_the_wait_and_the_threads(monkeypatch):
    # Seen once (issue 34's benchmark): the wait policy's sample saw an idle machine, the thread
    # count's, moments later, a passing spike of 1.2 cores; the run spun on one thread for 9 minutes.
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.setitem(sys.modules, "torch", None)
    del sys.modules["torch"]
    monkeypatch.setattr(cores, "usable_cores", lambda: 2)
    monkeypatch.setattr(cores, "_first_look", None)
    _ticks(monkeypatch, [(0, 0), (100, 1000), (0, 0), (600, 1000)])  # 0.2 busy, then a spike of 1.2
    assert not cores.prefer_passive_wait(0.0)
    share = cores.core_share(0.0)
    assert (share.threads, share.passive, share.busy) == (2, False, pytest.approx(0.2))
    # busy at start: sleeping threads on every core, from the same sample
    monkeypatch.setattr(cores, "_first_look", None)
    _ticks(monkeypatch, [(0, 0), (800, 1000)])
    assert cores.prefer_passive_wait(0.0)
    assert cores.core_share(0.0) == cores.CoreShare(2, 1.6, 2, True)
    # a policy set after the sample (by the user's code) is not the one it chose for: measured anew
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    _ticks(monkeypatch, [(0, 0), (800, 1000)])
    assert cores.core_share(0.0).threads == 1


def test_without_a_first_look_the_share_is_measured_now(monkeypatch):
    monkeypatch.setattr(cores, "_first_look", None)
    monkeypatch.setattr(cores, "usable_cores", lambda: 2)
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    _ticks(monkeypatch, [(0, 0), (500, 1000)])
    assert cores.core_share(0.0) == cores.CoreShare(2, 1.0, 2, True)
