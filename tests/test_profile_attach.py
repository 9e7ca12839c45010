"""`hasten profile` attaches to every Python a command starts, whatever launches it (issue 35).

Each case runs ``profile_scripts/three_steps.py`` (three optimizer steps, then exit) the way
people start training, and checks that the instrumentation saw its steps: through hasten's
``.pth`` where hasten is installed, through the ``sitecustomize`` fallback in a Python of
another environment. The command's own ``PYTHONPATH=/nowhere`` replaces the one hasten
sets, as in the issue. Not testable here: a conda env and a Python inside a container
(docs/profile.md says what happens there).
"""

import importlib.util
import os
import shutil
import site
import subprocess
import sys
import venv
from pathlib import Path

import pytest
import torch

from hasten.profile.attach import PTH_NAME
from hasten.profile.launcher import ProfileConfig, profile, run_instrumented
from profile_helpers import measured_steps

SCRIPTS = Path(__file__).parent / "profile_scripts"
THREE = str(SCRIPTS / "three_steps.py")
ELSEWHERE = "PYTHONPATH=/nowhere"  # the command's own PYTHONPATH, replacing hasten's


@pytest.fixture(autouse=True)
def _this_venv_first_on_path(monkeypatch):
    """`python`, `torchrun`, `accelerate` in a command are this environment's, as in an activated venv."""
    monkeypatch.setenv("PATH", os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))


@pytest.fixture(scope="module")
def other_python(tmp_path_factory):
    """A virtualenv's python with torch but without hasten: the torch of this one, on a plain path line."""
    root = tmp_path_factory.mktemp("other-venv")
    venv.EnvBuilder(with_pip=False).create(root)
    torch_site = Path(torch.__file__).parent.parent
    assert not (torch_site / "hasten").exists(), "hasten must be installed editable (pip install -e .) here"
    python = root / "bin" / "python"
    site_dir = subprocess.run([python, "-c", "import site; print(site.getsitepackages()[0])"], capture_output=True,
                              text=True, check=True).stdout.strip()
    # A plain path line: torch importable, the .pth files beside it (hasten's) not read.
    Path(site_dir, "torch_from_elsewhere.pth").write_text(f"{torch_site}\n")
    return str(python)


def _run(*cmd, timeout_s=60):
    return run_instrumented(ProfileConfig(tuple(cmd), capture=True, timeout_s=timeout_s), probes=False,
                            log=lambda m: None)


def _steppers(outcome):
    assert outcome.returncode == 0, outcome.output[-2000:]
    return [s for s in outcome.statuses if s["steps"] == 3]


def test_installing_hasten_puts_its_pth_in_site_packages():
    found = [Path(d, PTH_NAME) for d in site.getsitepackages() if Path(d, PTH_NAME).exists()]
    assert found, f"no {PTH_NAME} in {site.getsitepackages()}: reinstall hasten (pip install -e .)"
    assert "hasten.profile.attach" in found[0].read_text()


def test_the_issue_a_command_that_sets_pythonpath_is_profiled(tmp_path):
    # `env PYTHONPATH=/path/to/mingpt python chargpt.py` ran to the timeout, seeing nothing.
    a = profile(ProfileConfig(("env", f"PYTHONPATH={tmp_path}", "python", str(SCRIPTS / "input_bound.py"),
                               "--item-sleep", "0", "--step-sleep", "0.002"),
                              warmup=1, steps=4, probe_steps=2, capture=True, timeout_s=60, decide_s=0),
                log=lambda m: None)
    # Exactly the steps asked for (no stopping rule: attaching is the point); CI saw 3 kept and 1 stalled.
    assert a.ranks == 1 and measured_steps(a) == 4, a.excluded


@pytest.mark.parametrize("cmd", [
    ("python", THREE),
    (sys.executable, THREE),  # a virtualenv's python by its path, not activated
    ("env", ELSEWHERE, "python", THREE),
    ("env", "PYTHONPATH=", "python", THREE),
    ("env", f"PYTHONSTARTUP={THREE}", "python", THREE),
    ("python", "-E", THREE),
    ("python", "-I", THREE),
    ("python", "-s", "-u", THREE),
    ("env", f"PYTHONPATH={SCRIPTS}", "python", "-m", "three_steps"),
], ids=["python", "venv-python-by-path", "PYTHONPATH-replaced", "PYTHONPATH-emptied", "PYTHONSTARTUP", "-E", "-I",
        "-s-u", "python-m"])
def test_attaches_through_the_pth_whatever_the_environment(cmd):
    out = _run(*cmd)
    assert len(_steppers(out)) == 1
    assert [d["via"] for d in out.attached] == ["pth"]


def test_attaches_through_a_shell_script_that_sets_pythonpath(tmp_path):
    script = tmp_path / "train.sh"
    script.write_text(f'#!/bin/sh\nexport {ELSEWHERE}\nexec python "{THREE}" "$@"\n')
    script.chmod(0o755)
    assert len(_steppers(_run(str(script)))) == 1


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_attaches_through_make_and_a_python_that_does_not_train_is_no_failure(tmp_path):
    (tmp_path / "Makefile").write_text(f"train:\n\tpython -c 'print(1)'\n\t{ELSEWHERE} python {THREE}\n")
    out = _run("make", "-s", "-C", str(tmp_path), "train")
    assert len(_steppers(out)) == 1
    assert len(out.attached) == 2  # print(1) reported in, and never imported torch
    assert len(out.statuses) == 1


@pytest.mark.multiproc
def test_attaches_to_torchrun_and_each_worker():
    out = _run("env", ELSEWHERE, "torchrun", "--standalone", "--nproc-per-node", "2", THREE)
    assert len(_steppers(out)) == 2
    assert len(out.attached) == 3  # torchrun's own process too: it never steps, and that is fine
    assert sorted(s["rank"] for s in _steppers(out)) == [0, 1]


@pytest.mark.skipif(importlib.util.find_spec("accelerate") is None, reason="accelerate is not installed")
def test_attaches_through_accelerate_launch():
    out = _run("env", ELSEWHERE, "accelerate", "launch", "--num_processes", "1", "--num_machines", "1",
               "--mixed_precision", "no", "--dynamo_backend", "no", THREE)
    assert len(_steppers(out)) == 1


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="deepspeed is not installed")
def test_attaches_through_the_deepspeed_launcher():
    out = _run("env", ELSEWHERE, "deepspeed", THREE)
    assert len(_steppers(out)) == 1


def test_a_python_of_another_environment_attaches_through_the_sitecustomize(other_python):
    out = _run(other_python, THREE)
    assert len(_steppers(out)) == 1
    assert [d["via"] for d in out.attached] == ["sitecustomize"]


def test_a_python_that_never_imports_torch_reports_in_and_stays_torch_free(tmp_path):
    env = {**os.environ, "HASTEN_PROFILE_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", "import sys; print('torch' in sys.modules)"], env=env,
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    assert len(list(tmp_path.glob("attached-*.json"))) == 1
