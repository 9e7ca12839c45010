"""hasten.cpu_time: the one reader of CPU time, /proc/<pid>/stat and /proc/stat."""

import os
import subprocess
import sys
import time

import pytest

from hasten import cpu_time

linux = pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="no /proc on this system")
TICK = 1 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01


def _spin(cpu_s: float) -> None:
    """Keep this thread busy until it has used ``cpu_s`` more CPU seconds."""
    end = time.thread_time() + cpu_s
    while time.thread_time() < end:
        pass


@linux
def test_a_processs_cpu_grows_by_its_busy_work():
    before = cpu_time.pid_cpu_s(os.getpid())
    _spin(0.3)
    after = cpu_time.pid_cpu_s(os.getpid())
    # /proc counts in clock ticks: 0.3 s of spinning is 0.3 s, give or take a tick at each end
    assert after - before >= 0.3 - 2 * TICK
    # and it is the process's CPU, as the process itself counts it
    assert after == pytest.approx(time.process_time(), abs=0.05 + 2 * TICK)


@linux
def test_the_stat_fields_name_the_parent_and_session():
    fields = cpu_time.pid_stat(os.getpid())
    assert int(fields[cpu_time.PPID]) == os.getppid()
    assert int(fields[cpu_time.SESSION]) == os.getsid(0)


def test_a_process_that_is_not_there_reads_as_none():
    pid = 2 ** 22 + 12345  # above the kernel's largest pid
    assert cpu_time.pid_stat(pid) is None and cpu_time.pid_cpu_s(pid) is None


@linux
def test_a_command_name_with_parentheses_spaces_and_bytes_that_are_not_utf8(tmp_path):
    # The name sits between the parentheses of /proc/<pid>/stat; a reader that splits at the
    # first ")" or decodes it as UTF-8 reads the wrong fields or fails.
    link = os.path.join(os.fsencode(tmp_path), b"a) (b \xff")
    os.symlink(os.fsencode(sys.executable), link)
    child = subprocess.Popen([link, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        for _ in range(200):  # until the exec has replaced the command name
            if open(f"/proc/{child.pid}/comm", "rb").read().startswith(b"a) (b"):
                break
            time.sleep(0.01)
        fields = cpu_time.pid_stat(child.pid)
        assert int(fields[cpu_time.PPID]) == os.getpid()
        assert cpu_time.pid_cpu_s(child.pid) >= 0
    finally:
        child.communicate(b"")


def test_own_cpu_counts_children_once_they_are_waited_for():
    before = cpu_time.own_cpu_s()
    subprocess.run([sys.executable, "-c", "import time\nend = time.process_time() + 0.3\n"
                    "while time.process_time() < end: pass"], check=True)
    assert cpu_time.own_cpu_s() - before >= 0.3 - 2 * TICK


@linux
def test_tree_cpu_counts_live_workers_that_own_cpu_does_not():
    own0, tree0 = cpu_time.own_cpu_s(), cpu_time.tree_cpu_s()
    child = subprocess.Popen([sys.executable, "-c", "import sys, time\nend = time.process_time() + 0.3\n"
                              "while time.process_time() < end: pass\nprint(flush=True)\nsys.stdin.read()"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        child.stdout.readline()  # the child has spun its 0.3 s and waits
        own, tree = cpu_time.own_cpu_s() - own0, cpu_time.tree_cpu_s() - tree0
        assert tree - own >= 0.3 - 2 * TICK  # the child's 0.3 s, beside this process's own
    finally:
        child.communicate(b"")


@linux
def test_core_times_grow_and_a_set_of_cores_is_part_of_all():
    all_before, one_before = cpu_time.core_times(), cpu_time.core_times({min(os.sched_getaffinity(0))})
    _spin(0.2)
    all_after, one_after = cpu_time.core_times(), cpu_time.core_times({min(os.sched_getaffinity(0))})
    for t in (all_before, one_before):
        assert 0 <= t["niced_s"] <= t["busy_s"] and t["idle_s"] >= 0
    # 0.2 s of this process's spinning is busy time of the machine's cores
    assert all_after["busy_s"] - all_before["busy_s"] >= 0.2 - 2 * TICK
    one, every = (sum(t.values()) - t["niced_s"] for t in (one_after, all_after))
    if (os.cpu_count() or 1) > 1:
        assert one < every  # one core's seconds are fewer than all cores'
    assert cpu_time.core_times(set()) == {"busy_s": 0.0, "niced_s": 0.0, "idle_s": 0.0}


@linux
@pytest.mark.parametrize("children_files", [True, False])
def test_descendants_are_children_and_grandchildren(monkeypatch, children_files):
    if not children_files:  # the kernel without CONFIG_PROC_CHILDREN: every process's parent is read
        monkeypatch.setattr(cpu_time.os.path, "exists", lambda path: False)
    child = subprocess.Popen([sys.executable, "-c", "import subprocess, sys\n"
                              "g = subprocess.Popen([sys.executable, '-c', 'import sys; sys.stdin.read()'], "
                              "stdin=subprocess.PIPE)\nprint(g.pid, flush=True)\nsys.stdin.read()\n"
                              "g.communicate(b'')"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        grandchild = int(child.stdout.readline())
        assert {child.pid, grandchild} <= set(cpu_time.descendants(os.getpid()))
        assert cpu_time.descendants(child.pid) == [grandchild]
        assert os.getpid() not in cpu_time.descendants(os.getpid())
    finally:
        child.communicate(b"")
