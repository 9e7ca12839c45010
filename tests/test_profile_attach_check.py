"""A Python that cannot be attached is named with its cause in one line, within seconds (issue 35)."""

import os
import platform
import struct
import sys
import time
import venv

import pytest

from hasten.profile.attach_check import interpreter_flags, is_static_elf
from hasten.profile.launcher import ProfileConfig, ProfileFailed, profile, run_instrumented

SLEEPER = ("-c", "import time; time.sleep(60)")


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory):
    """A virtualenv's python without hasten (nor torch)."""
    root = tmp_path_factory.mktemp("bare-venv")
    venv.EnvBuilder(with_pip=False).create(root)
    return str(root / "bin" / "python")


def _elf(interp: bool) -> bytes:
    """A minimal x86-64 ELF executable that waits for a signal (pause(2)); with ``interp``, a PT_INTERP header."""
    code = bytes.fromhex("b822000000" "0f05" "b83c000000" "31ff" "0f05")  # pause(); exit(0)
    phnum = 2 if interp else 1
    start = 64 + 56 * phnum
    size = start + len(code)
    header = (b"\x7fELF\x02\x01\x01" + bytes(9)
              + struct.pack("<HHIQQQIHHHHHH", 2, 0x3E, 1, 0x400000 + start, 64, 0, 0, 64, 56, phnum, 0, 0, 0))
    load = struct.pack("<IIQQQQQQ", 1, 5, 0, 0x400000, 0x400000, size, size, 0x1000)
    interp_header = struct.pack("<IIQQQQQQ", 3, 4, 0, 0, 0, 0, 0, 1) if interp else b""
    return header + load + interp_header + code


def _fails_within_seconds(cmd):
    t0 = time.perf_counter()
    with pytest.raises(ProfileFailed) as exc:
        profile(ProfileConfig(tuple(cmd), capture=True, timeout_s=60), log=lambda m: None)
    took = time.perf_counter() - t0
    msg = str(exc.value)
    assert exc.value.exit_code == 2 and "\n" not in msg and msg.startswith("cannot attach to process")
    assert took < 10, f"took {took:.1f} s"
    return msg


def test_python_dash_S_is_named():
    msg = _fails_within_seconds((sys.executable, "-S", *SLEEPER))
    assert "-S skips site-packages" in msg and "without -S" in msg


def test_a_cleared_environment_is_named():
    msg = _fails_within_seconds(("env", "-i", sys.executable, *SLEEPER))
    assert "HASTEN_PROFILE_DIR is not in its environment" in msg


@pytest.mark.parametrize("prefix, flag, words", [
    ((), "-I", "-I makes it ignore PYTHONPATH"),
    ((), "-E", "-E makes it ignore PYTHONPATH"),
    (("env", "PYTHONPATH=/nowhere"), None, "the command replaced PYTHONPATH (now `/nowhere`)"),
], ids=["-I", "-E", "PYTHONPATH-replaced"])
def test_a_python_without_hasten_is_named_with_the_install_command(bare_python, prefix, flag, words):
    msg = _fails_within_seconds((*prefix, bare_python, *([flag] if flag else []), *SLEEPER))
    assert f"{bare_python} has no hasten installed" in msg and words in msg
    assert f"`{bare_python} -m pip install" in msg


@pytest.mark.skipif(sys.platform != "linux" or platform.machine() != "x86_64", reason="an x86-64 Linux executable")
def test_a_statically_linked_python_is_named_and_not_run(tmp_path):
    # A stand-in: a static executable named python3 that never reports in (a real static CPython
    # that cannot load hasten looks the same from outside).
    fake = tmp_path / "python3"
    fake.write_bytes(_elf(interp=False))
    fake.chmod(0o755)
    msg = _fails_within_seconds((str(fake),))
    assert "is a statically linked Python" in msg


def test_a_silent_helper_beside_an_attached_trainer_is_named_but_stops_nothing(tmp_path):
    trainer = tmp_path / "trainer.py"
    trainer.write_text(f"""\
import subprocess, sys, time
import torch
helper = subprocess.Popen([sys.executable, "-S", "-c", "import time; time.sleep(30)"])
time.sleep(6)  # the helper is judged (3 s after it shows) while this process is attached
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
helper.kill()
""")
    said = []
    out = run_instrumented(ProfileConfig((sys.executable, str(trainer)), capture=True, timeout_s=60), probes=False,
                           log=said.append)
    assert out.returncode == 0 and [s["steps"] for s in out.statuses] == [3]
    assert any("-S skips site-packages" in m and "profiling the processes that did attach" in m for m in said)


def test_a_command_with_no_python_says_so_at_the_timeout():
    with pytest.raises(ProfileFailed) as exc:
        profile(ProfileConfig(("sh", "-c", "sleep 30"), capture=True, timeout_s=2), log=lambda m: None)
    assert exc.value.exit_code == 124 and "no Python process has run in the command" in str(exc.value)


@pytest.mark.parametrize("argv, flags", [
    (["python", "-I", "train.py"], {"I"}),
    (["python", "-uE", "train.py", "-S"], {"u", "E"}),
    (["python", "-W", "ignore", "-S", "train.py"], {"S"}),
    (["python", "-Xdev", "-s", "-m", "torch.distributed.run", "-I"], {"s"}),
    (["python", "-c", "print(1)", "-S"], set()),
    (["python", "-Sc", "print(1)"], {"S"}),
    (["python", "--check-hash-based-pycs", "never", "-E", "x.py"], {"E"}),
])
def test_interpreter_flags_stop_at_the_script(argv, flags):
    assert interpreter_flags(argv) == flags


def test_static_elf_is_told_by_its_program_headers(tmp_path):
    static, dynamic, text = tmp_path / "static", tmp_path / "dynamic", tmp_path / "text"
    static.write_bytes(_elf(interp=False))
    dynamic.write_bytes(_elf(interp=True))
    text.write_text("#!/bin/sh\n")
    assert is_static_elf(str(static))
    assert not is_static_elf(str(dynamic)) and not is_static_elf(str(text))
    assert not is_static_elf(os.path.realpath(sys.executable))
