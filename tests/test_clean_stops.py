"""Stopping a command: SIGINT (Ctrl-C) and SIGTERM (timeout, Slurm, docker stop) end ``hasten train``
and ``hasten speedrun`` with one line naming the newest checkpoint or run directory and
``--resume auto``, exit status 130 / 143, no traceback from the process or its decode workers; a
failed command leaves no bare run directory, no empty ``runs/`` and no output directory behind."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hasten.cli import main


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _signal_once(argv, env, sig, root: Path, pattern: str, settle_s: float = 0.0):
    """Start ``argv`` in a session of its own (so that its decode workers get the signal too,
    as from a terminal, ``timeout`` or Slurm), wait until ``root.glob(pattern)`` finds a file,
    then ``settle_s`` more, and send ``sig`` to the whole group; (process, stderr).

    SIGINT at its default in the child: a test run started in the background of a shell (as
    CI may be) has it ignored, and hasten rightly leaves an ignored signal ignored."""
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=_default_sigint)
    try:
        deadline = time.monotonic() + 120
        while not list(root.glob(pattern)):
            assert proc.poll() is None, f"hasten {argv[3]} ended (rc {proc.returncode}) before {pattern} appeared"
            assert time.monotonic() < deadline, f"no {root / pattern} within 120 s"
            time.sleep(0.05)
        time.sleep(settle_s)
        os.killpg(proc.pid, sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc, err


def _group_gone(pgid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.multiproc
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_stops_train_with_one_line_naming_the_checkpoint(sig, code, colours, tmp_path):
    run = tmp_path / "run"
    argv = [sys.executable, "-m", "hasten", "train", "--data", str(colours), "--loader", "stream", "--workers", "2",
            "--model", "resnet10", "--width", "4", "--batch-size", "32", "--epochs", "500",
            "--checkpoint-every", "3", "--device", "cpu", "--run-dir", str(run)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HASTEN_CACHE": str(tmp_path / "cache"),
           "HASTEN_RUNS": str(tmp_path / "runs"), "HASTEN_PROGRESS": "0"}
    # 0.3 s into the steps after the checkpoint: the decode workers are busy
    proc, err = _signal_once(argv, env, sig, run, "checkpoint.pt", settle_s=0.3)
    assert proc.returncode == code, err
    assert "Traceback" not in err and "Error" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert re.fullmatch(rf"hasten train: stopped by {sig.name} at step \d+; newest checkpoint: "
                        rf"{re.escape(str(run))}/checkpoint(-previous)?\.pt \(step \d+\); rerun with --resume auto",
                        lines[0]), lines[0]
    assert _group_gone(proc.pid), "decode workers outlived the command"


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_stops_speedrun_with_one_line_naming_its_run_directory(sig, code, colours, tmp_path):
    """Signalled between epochs of its first run, after the warm-up: the line names the run
    directory that holds the checkpoint, and --resume auto (tests/test_commands_speedrun.py)."""
    argv = [sys.executable, "-m", "hasten", "speedrun", "--data", str(colours), "--preset", "tiny",
            "--batch-size", "32", "--epochs", "500", "--device", "cpu"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HASTEN_CACHE": str(tmp_path / "cache"),
           "HASTEN_RUNS": str(tmp_path / "runs"), "HASTEN_PROGRESS": "0"}
    proc, err = _signal_once(argv, env, sig, tmp_path / "runs", "speedrun-*/checkpoint.pt")
    assert proc.returncode == code, err
    (run,) = (tmp_path / "runs").iterdir()
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert re.fullmatch(rf"hasten speedrun: stopped by {sig.name}; run directory runs/{run.name} \(0 of 1 runs "
                        r"finished, run 0 to epoch \d+ of 500\); resume with: hasten speedrun <same options> "
                        r"--resume auto\n", err.replace(str(tmp_path) + "/", "")), err


@pytest.mark.parametrize("command", [
    ["speedrun", "--preset", "tiny", "--device", "cpu", "--no-warmup"],
    ["echo", "--device", "cpu"],
    ["train", "--model", "resnet10", "--width", "4", "--batch-size", "16", "--device", "cpu"],
])
def test_a_failed_command_leaves_no_bare_run_directory(command, tmp_path, capsys):
    """Data that cannot be read: the command fails after making its run directory, which goes, and
    so does the ``runs/`` folder it made for it (a failed offline run used to leave it empty)."""
    bad = tmp_path / "bad"
    (bad / "train" / "cat").mkdir(parents=True)
    (bad / "test" / "cat").mkdir(parents=True)
    (bad / "train" / "cat" / "x.jpg").write_bytes(b"not an image")
    (bad / "test" / "cat" / "y.jpg").write_bytes(b"not an image")
    assert main([command[0], "--data", str(bad), *command[1:]]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    runs = tmp_path / "runs"
    assert not runs.exists(), list(runs.iterdir())


def test_run_directory_kept_once_it_holds_anything(tmp_path):
    from hasten.rundir import RunDir

    with pytest.raises(KeyError):
        with RunDir("x", root=tmp_path) as rd:
            rd.log(step=1)
            raise KeyError
    assert json.loads((rd.path / "metrics.jsonl").read_text()) == {"step": 1}
    with pytest.raises(KeyError):
        with RunDir("x", root=tmp_path) as rd2:
            (rd2.path / "checkpoint.pt").write_bytes(b"state")
            raise KeyError
    assert rd2.path.exists()
    existing = tmp_path / "mine"
    existing.mkdir()
    RunDir("x", path=existing).close(failed=True)
    assert existing.exists()  # not made by this RunDir: not its to remove
    with pytest.raises(KeyError):
        with RunDir("x", root=tmp_path) as rd3:
            raise KeyError
    assert not rd3.path.exists()


def test_a_failed_pack_leaves_no_output_directory(tmp_path, capsys):
    empty = tmp_path / "empty.tar.xz"
    empty.write_bytes(b"")
    out = tmp_path / "new" / "shards"
    assert main(["data", "pack", str(empty), str(out)]) == 2
    err = capsys.readouterr().err
    assert err == f"hasten data: error: cannot extract archive '{empty}': the file is empty (0 bytes)\n"
    assert not (tmp_path / "new").exists()  # nor the parent it made
    given = tmp_path / "given"
    given.mkdir()
    nothing = tmp_path / "nothing"
    (nothing / "train").mkdir(parents=True)
    assert main(["data", "pack", str(nothing), str(given)]) == 2
    capsys.readouterr()
    assert given.is_dir() and not any(given.iterdir())  # the user's empty directory stays, empty


@pytest.mark.parametrize("sig, expected", [(signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, BaseException)])
def test_a_signal_landing_where_python_ignores_exceptions_still_stops(sig, expected):
    """A signal whose handler runs inside a finalizer (or an at-fork hook, such as logging's
    each time decode workers start) raises where Python only prints "Exception ignored";
    it is raised again in ordinary code, not lost (CI saw hasten train run on after Ctrl-C)."""
    from hasten.cli import Terminated, _signals_raise

    class SignalledWhileCollected:
        def __del__(self):
            os.kill(os.getpid(), sig)  # the handler runs here, inside the finalizer

    # Python's own SIGINT handler, as in a foreground run (a background shell job starts
    # with SIGINT ignored, which hasten leaves alone).
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(expected) as caught:
            with _signals_raise():
                obj = SignalledWhileCollected()
                del obj
                deadline = time.monotonic() + 5
                while time.monotonic() < deadline:  # ordinary code: the re-sent signal lands here
                    time.sleep(0.01)
    finally:
        signal.signal(signal.SIGINT, before)
    assert isinstance(caught.value, KeyboardInterrupt if sig == signal.SIGINT else Terminated)


def test_after_a_stop_a_broken_connection_of_a_dying_worker_prints_no_traceback(capsys):
    """The stop signal kills the decode workers too; multiprocessing's resource sharer, in
    the middle of handing one a descriptor, reports the reset through sys.excepthook. After
    a stop that is expected and silent; before one, and any other error, is reported."""
    from hasten.cli import Terminated, _signals_raise

    before_hook, before_term = sys.excepthook, signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        with _signals_raise():
            sys.excepthook(ConnectionResetError, ConnectionResetError(104, "reset"), None)
            assert "reset" in capsys.readouterr().err  # no stop yet: reported
            with pytest.raises(Terminated):
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)  # (the handler raises here)
            for kind in (ConnectionResetError, BrokenPipeError, EOFError):
                sys.excepthook(kind, kind("gone"), None)
            assert capsys.readouterr().err == ""
            sys.excepthook(ValueError, ValueError("a real bug"), None)
            assert "a real bug" in capsys.readouterr().err
        assert sys.excepthook is before_hook  # put back when the command ends
    finally:
        sys.excepthook = before_hook
        signal.signal(signal.SIGTERM, before_term)
