import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import hasten
from hasten import environment
from hasten.environment import command_line, describe_environment, source_revision

PACKAGE_DIR = Path(hasten.__file__).resolve().parent
needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def _git(cwd, *args):
    return subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, check=True).stdout


def _checkout_head():
    """HEAD of the checkout hasten was imported from, or None when it is not one."""
    try:
        _git(PACKAGE_DIR, "ls-files", "--error-unmatch", "__init__.py")
        return _git(PACKAGE_DIR, "rev-parse", "HEAD").strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def test_records_the_hasten_version_and_software():
    env = describe_environment("cpu")
    assert env["hasten"] == hasten.__version__
    assert env["torch"] == torch.__version__
    assert env["python"] == sys.version.split()[0]
    json.dumps(env)  # JSON-able as it is


@needs_git
def test_commit_is_the_checkouts_head():
    head = _checkout_head()
    if head is None:
        pytest.skip("hasten is not imported from a git checkout")
    env = describe_environment("cpu")
    assert env["git_commit"] == head
    assert len(env["git_commit"]) == 40
    dirty = bool(_git(PACKAGE_DIR, "status", "--porcelain").strip())
    assert source_revision.__wrapped__(PACKAGE_DIR) == (head, dirty)


def test_not_a_checkout_gives_none(tmp_path):
    (tmp_path / "__init__.py").write_text("")
    assert source_revision.__wrapped__(tmp_path) == (None, None)


@needs_git
def test_an_untracked_package_inside_another_repository_gives_none(tmp_path):
    # An installed copy inside a user's project must not take the project's commit.
    _git(tmp_path, "init", "-q")
    (tmp_path / "README").write_text("a project\n")
    _git(tmp_path, "add", "README")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "a")
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    assert source_revision.__wrapped__(pkg) == (None, None)

    _git(tmp_path, "add", "pkg/__init__.py")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "b")
    head = _git(tmp_path, "rev-parse", "HEAD").strip()
    assert source_revision.__wrapped__(pkg) == (head, False)
    (pkg / "__init__.py").write_text("x = 1\n")
    assert source_revision.__wrapped__(pkg) == (head, True)


@pytest.mark.parametrize("failure", [FileNotFoundError("git"), subprocess.TimeoutExpired("git", 5.0)])
def test_missing_or_hanging_git_gives_none(tmp_path, monkeypatch, failure):
    def broken(*args, **kwargs):
        raise failure

    monkeypatch.setattr(environment.subprocess, "run", broken)
    assert source_revision.__wrapped__(PACKAGE_DIR) == (None, None)


@pytest.mark.parametrize("argv", [
    ["hasten", "speedrun", "--data", "../shared/data/cifar10-jpeg.tar.xz", "--runs", "3"],
    ["hasten", "echo", "--data", "my data/with spaces.tar", "--note", "it's"],
    ["benchmarks/speedrun.py", "--json", "out.json", ""],
])
def test_command_is_the_argv_given_shell_quoted(argv):
    command = describe_environment("cpu", argv=argv)["command"]
    assert shlex.split(command) == argv
    assert command == " ".join(shlex.quote(a) for a in argv)


def test_command_defaults_to_sys_argv(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["hasten", "train", "--batch-size", "1024"])
    assert describe_environment("cpu")["command"] == "hasten train --batch-size 1024"


def test_command_drops_the_local_install_path_of_the_program(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "benchmarks" / "speedrun.py"
    assert command_line(["/opt/venv/bin/hasten", "speedrun", "--data", "/data/x.tar"]) == \
        "hasten speedrun --data /data/x.tar"
    assert command_line([str(PACKAGE_DIR / "__main__.py"), "echo"]) == "python -m hasten echo"
    assert command_line([str(script), "--runs", "2"]) == "benchmarks/speedrun.py --runs 2"
    assert command_line(["/elsewhere/run.py"]) == "/elsewhere/run.py"


def test_autogroup_line_parsing():
    """The nice value is read from a real autogroup line; an empty or odd file gives None."""
    from hasten.environment import autogroup_nice
    assert autogroup_nice("/autogroup-1175 nice 0\n") == 0
    assert autogroup_nice("/autogroup-7 nice -20\n") == -20
    assert autogroup_nice("/autogroup-7 nice 19") == 19
    assert autogroup_nice("") is None
    assert autogroup_nice("/autogroup-7 nice") is None
    assert autogroup_nice("/autogroup-7 nice x") is None


def test_measured_conditions_record_the_scheduling_priority():
    """A job given a raised CPU share feels other jobs' load less: the share is recorded."""
    from hasten.environment import MeasuredConditions, scheduling_priority
    prio = scheduling_priority()
    assert prio["nice"] == os.nice(0)
    if Path("/proc/self/autogroup").exists():
        words = Path("/proc/self/autogroup").read_text().split()
        expected = int(words[-1]) if "nice" in words else None
        assert prio["autogroup_nice"] == expected
    else:
        assert prio["autogroup_nice"] is None
    with MeasuredConditions("cpu") as cond:
        pass
    assert cond.as_dict()["cpu_priority"] == prio
