"""``hasten profile`` stopped by SIGTERM or Ctrl-C takes the command it runs with it (issue 43: a
``--verify`` re-run was left training on as an orphan, in the session of its own hasten starts it in).

A real ``hasten profile --verify`` of an endless loop, signalled once a verification re-run is
running; the processes are told apart by a tag in their environment, so that the test looks at its
own and nothing else on the machine."""

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).parent / "profile_scripts"


def _tagged(tag: str) -> dict[int, int]:
    """``{pid: parent pid}`` of the live (not zombie) processes whose environment holds ``tag``."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if tag.encode() not in (d / "environ").read_bytes():
                continue
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone, or not ours to read
            continue
        if fields[0] != "Z":
            out[int(d.name)] = int(fields[1])
    return out


def _wait_for(predicate, timeout_s: float, what: str):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        got = predicate()
        if got:
            return got
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}")


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads processes from Linux's /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_verification_leaves_no_command_running(tmp_path, sig):
    tag = f"HASTEN_TEST_TAG=stop-{uuid.uuid4().hex}"
    env = {**os.environ, tag.split("=")[0]: tag.split("=")[1]}
    cmd = [sys.executable, "-m", "hasten", "profile", "--verify", "--warmup", "2", "--steps", "10",
           "--probe-steps", "2", "--decide-within", "0", "--quiet", "--timeout", "600", "--",
           sys.executable, str(SCRIPTS / "short_run.py"), "--steps", "100000000", "--batch-sleep", "0.005"]
    # SIGINT at its default, as a terminal's Ctrl-C finds it (a background job inherits it ignored)
    hasten = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        first: set[int] = set()

        def rerun_running():
            # hasten's own children running the script: the profile run's, then none of those (a re-run's)
            kids = {pid for pid, parent in _tagged(tag).items() if parent == hasten.pid}
            if not first:
                first.update(kids)
            return bool(first) and kids and not kids & first
        _wait_for(lambda: rerun_running() or hasten.poll() is not None, 400, "a verification re-run")
        assert hasten.poll() is None, hasten.communicate()[1].decode()[-2000:]
        os.kill(hasten.pid, sig)
        _, err = hasten.communicate(timeout=120)
        assert hasten.returncode == 128 + sig
        assert "Traceback" not in err.decode()
        # nothing of the command is left: not the re-run, not a worker of it
        _wait_for(lambda: not _tagged(tag), 30, "the command's processes to end")
    finally:
        if hasten.poll() is None:
            hasten.kill()
            hasten.communicate()
        for pid in _tagged(tag):  # a failed test leaves nothing running either
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
