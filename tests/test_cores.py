import os
import subprocess
import sys

import pytest

from hasten import cores


def _ticks(monkeypatch, samples):
    """Make /proc/stat read as ``samples`` ((busy, total) seconds of all cores, None for no
    /proc/stat), one per call."""
    it = iter(samples)
    times = lambda: next(it)  # noqa: E731
    monkeypatch.setattr(cores, "core_times",
                        lambda: None if (t := times()) is None else {"busy_s": t[0], "niced_s": 0, "idle_s": t[1] - t[0]})


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


def test_niced_time_counts_as_free(monkeypatch):
    # 1,000 s over the cores: 600 s busy, of which 400 s by processes at a positive nice value
    it = iter([{"busy_s": 0, "niced_s": 0, "idle_s": 0}, {"busy_s": 600, "niced_s": 400, "idle_s": 400}])
    monkeypatch.setattr(cores, "core_times", lambda: next(it))
    assert cores.free_cores(0.0, cores=2, passive=False).busy == pytest.approx(0.4)


def _cgroup(tmp_path, v2=None, v1=None):
    """A cgroup folder with a v2 ``cpu.max`` holding ``v2``, or v1 quota and period files ``v1``."""
    if v2 is not None:
        (tmp_path / "cpu.max").write_text(v2 + "\n")
    if v1 is not None:
        (tmp_path / "cpu").mkdir()
        (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text(f"{v1[0]}\n")
        (tmp_path / "cpu" / "cpu.cfs_period_us").write_text(f"{v1[1]}\n")
    return tmp_path


@pytest.mark.parametrize("v2, v1, quota", [
    ("150000 100000", None, 1.5), ("max 100000", None, None), (None, (50000, 100000), 0.5), (None, (-1, 100000), None),
    (None, None, None), ("garbage", None, None), ("150000 0", None, None), ("150000 100000", (50000, 100000), 1.5)])
def test_the_cgroup_quota_is_read_from_v2_then_v1(tmp_path, v2, v1, quota):
    assert cores.cgroup_quota(_cgroup(tmp_path, v2, v1)) == quota


@pytest.mark.parametrize("affinity, v2, usable", [(8, "150000 100000", 2), (8, "100000 100000", 1), (8, "20000 100000", 1),
                                                  (2, "400000 100000", 2), (8, "max 100000", 8), (8, None, 8)])
def test_usable_cores_are_the_affinity_capped_by_the_quota_rounded_up(monkeypatch, tmp_path, affinity, v2, usable):
    # a container limited to 1.5 CPUs on an 8-core host has 2 cores to keep busy, not 8
    monkeypatch.setattr(cores, "affinity_cores", lambda: affinity)
    assert cores.usable_cores(_cgroup(tmp_path, v2)) == usable


@pytest.mark.parametrize("n, quota, whole", [(8, 1.5, 2), (8, 0.2, 1), (2, 3.0, 2), (4, None, 4), (0, None, 1)])
def test_a_quota_caps_whole_cores_rounded_up(n, quota, whole):
    assert cores.quota_capped(n, quota) == whole


def test_the_profilers_cores_are_capped_by_the_quota(monkeypatch, tmp_path):
    monkeypatch.setattr(cores, "affinity_cores", lambda: 4)
    assert cores.cpu_available(probe_s=0, cgroup=_cgroup(tmp_path, "150000 100000")) == {"affinity": 4, "quota": 1.5, "probe": None, "available": 1.5}


def test_the_busy_probe_counts_the_cpu_its_processes_got():
    if not hasattr(os, "fork"):
        pytest.skip("the probe forks")
    got = cores.cpu_available(probe_s=0.2)
    # one spinning process per allowed core gets at most those cores, and some CPU on a loaded machine
    assert 0 < got["probe"] <= got["affinity"] * 1.1
    # the least of the three, and never below 0.05 (at nice 19 beside 16 busy processes the probe got 0.005)
    least = min(got["probe"], got["affinity"], got["quota"] or got["affinity"])
    assert got["available"] == pytest.approx(max(0.05, least))


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
