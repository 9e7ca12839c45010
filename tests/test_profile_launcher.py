"""Zero-code mode on constructed plain-PyTorch scripts whose bottleneck is known by construction."""

import os
import platform
import signal
import sys
import time
from pathlib import Path

import pytest

from hasten.profile.launcher import ProfileConfig, ProfileFailed, profile, run_instrumented
from hasten.profile.input_fixes import worker_cap
from hasten.profile.verify import RERUNS
from profile_helpers import verify_only

SCRIPTS = Path(__file__).parent / "profile_scripts"


def _config(script, *args, **kw):
    kw = {"warmup": 3, "steps": 12, "probe_steps": 6, "capture": True, "timeout_s": 60, **kw}
    return ProfileConfig((sys.executable, str(SCRIPTS / script), *args), **kw)


@pytest.fixture(scope="module")
def input_bound_verified():
    """16 items x 5 ms of storage latency against a 20 ms step: R = 4 by construction (sleeps long
    enough that a loaded machine's late wake-ups are a few percent of them). Profiled once, with its
    workers and echo fixes verified (the device-resident loader's: test_profile_verify): the verdict's
    test reads the profile, the workers-fix test its verification."""
    with pytest.MonkeyPatch.context() as mp:
        verify_only(mp, "workers=", "echo=")
        return profile(_config("input_bound.py", "--item-sleep", "0.005", "--batch", "16", "--step-sleep", "0.02",
                               verify=True), log=lambda m: None)


@pytest.mark.slow  # the first to use `input_bound_verified`: 10 runs of the command
def test_input_bound_sleep_loader_verdict_and_r(input_bound_verified):
    a = input_bound_verified
    assert a.verdict == "input-bound" and a.severity == "high"
    assert a.upstream_ratio == pytest.approx(4.0, rel=0.2)
    assert a.data_wait_fraction == pytest.approx(4 / 5, abs=0.1)  # synchronous loader: R / (R + 1)
    fixes = [r.fix for r in a.recommendations]
    assert fixes and all(("workers" in f) or ("echo" in f) or ("device-resident" in f) for f in fixes)


def test_input_bound_cpu_decode_verdict_and_r():
    # 8 items x 2 ms of CPU decoding against 8 ms of CPU work per step: R = 2, on a loaded machine too.
    a = profile(_config("input_bound.py", "--item-sleep", "0", "--item-work", "0.002", "--batch", "8",
                        "--step-sleep", "0", "--step-work", "0.008"), log=lambda m: None)
    assert a.verdict == "input-bound"
    assert a.upstream_ratio == pytest.approx(2.0, rel=0.2)


def test_compute_bound_gets_no_input_fix():
    a = profile(_config("compute_bound.py"), log=lambda m: None)
    assert a.verdict == "compute-bound"
    assert a.data_wait_fraction < 0.05
    assert not any(r.apply and r.apply.startswith(("workers", "echo")) for r in a.recommendations)


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="ONEDNN_MAX_CPU_ISA caps x86 oneDNN only")
def test_on_a_cpu_without_bf16_the_autocast_probe_is_dropped_before_it_runs(monkeypatch):
    # oneDNN capped at AVX2 emulates bf16: this MLP's step took 13 s under autocast against 0.1 s
    # without, and its autocast probe ran six of them (the "about 1 s a step" of issue 32 on CI's
    # CPU). A paired bf16/float32 matmul, 9-17x apart, now drops the probe first.
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    a = profile(_config("compute_bound.py"), log=lambda m: None)
    (x,) = a.dropped
    assert x["probe"] == "autocast" and "no native bf16" in x["why"] and "_is_mkldnn_bf16_supported() is False" in x["why"]
    # The plain replay ran and the report was made; the verdict's own accuracy on this script is
    # test_profile_loops' (here, on a loaded CI machine, its interval once reached the line: BALANCED).
    assert a.verdict in ("compute-bound", "balanced") and a.step_alone_s > 0


def test_verify_measures_the_workers_fix_close_to_its_prediction(input_bound_verified):
    a = input_bound_verified
    workers = next(r for r in a.recommendations if r.apply and r.apply.startswith("workers"))
    assert int(workers.apply.split("=")[1].split(",")[0]) <= worker_cap(a.cpu)  # never more than the cores
    # x2.5 by construction on 2 cores (80 ms of batch making a step over 2 workers against a 20 ms step);
    # beside a load of 8-12 the workers wait for a core, and it read x1.80: the line is x1.5, far from the
    # x1.0 of a fix that was not applied; how close it comes to its prediction is the next lines'
    assert workers.verified_speedup is not None and workers.verified_speedup > 1.5
    assert workers.verification["n"] == RERUNS and workers.verification["interval"][0] > 1
    assert workers.verified_speedup == pytest.approx(workers.predicted_speedup, rel=0.35)
    # batch echoing, applied from outside: fewer waits per step, discounted by echo's data efficiency. Its
    # verification is what is tested, wherever the ranking put it: in a fresh-clone run beside load it was not
    # among the recommendations (a StopIteration here; a fix verified below x1.05 goes to the rejected ones).
    echo = [(r.predicted_speedup, r.verified_speedup) for r in a.recommendations if (r.apply or "").startswith("echo")]
    echo += [(r.get("predicted_speedup"), r.get("verified_speedup")) for r in a.rejected
             if (r.get("apply") or "").startswith("echo")]
    assert len(echo) == 1
    predicted, verified = echo[0]
    assert verified == pytest.approx(predicted, rel=0.35)


@pytest.mark.multiproc
def test_communication_bound_ddp_under_torchrun():
    cmd = (sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(SCRIPTS / "ddp_comm.py"))
    a = profile(ProfileConfig(cmd, warmup=3, steps=8, probe_steps=5, capture=True, timeout_s=90),
                log=lambda m: None)
    assert a.verdict == "communication-bound" and a.ranks == 2
    assert a.comm_fraction > 0.2
    assert not any(r.apply and r.apply.startswith(("workers", "echo")) for r in a.recommendations)
    # bf16 compression is weighed either way (on gloo/CPU, bf16 sums can cost more than the bytes saved)
    weighed = [r.fix for r in a.recommendations] + [r["fix"] for r in a.rejected]
    assert "bf16 gradient compression" in weighed


@pytest.mark.parametrize("args, code, words", [
    (("--crash-after", "2"), 1, "failed with exit code 1"),
    (("--exit-after", "5"), 3, "exit code 3 after 5 optimizer steps"),
])
def test_a_command_that_fails_early_gets_its_exit_code(args, code, words):
    with pytest.raises(ProfileFailed) as exc:
        profile(_config("input_bound.py", *args), log=lambda m: None)
    assert exc.value.exit_code == code and words in str(exc.value)


def test_a_command_without_an_optimizer_has_its_steps_counted_at_backward():
    logs = []
    with pytest.raises(ProfileFailed) as exc:
        profile(_config("no_loader.py"), log=logs.append)
    assert any("no torch.optim optimizer was built: a step is counted at each backward()" in m for m in logs)
    msg = str(exc.value)  # three backward() calls are three steps, fewer than the window
    assert exc.value.exit_code == 2 and "ended after 3 steps (counted at backward()" in msg


def test_a_command_that_never_steps_nor_calls_backward_says_what_it_saw(tmp_path):
    script = tmp_path / "inference.py"
    script.write_text("import torch\nmodel = torch.nn.Linear(4, 1)\nfor _ in range(3):\n    model(torch.randn(8, 4))\n")
    with pytest.raises(ProfileFailed) as exc:
        profile(ProfileConfig((sys.executable, str(script)), capture=True), log=lambda m: None)
    msg = str(exc.value)
    assert exc.value.exit_code == 2 and "without calling optimizer.step() or backward()" in msg
    assert "3 training forwards of 3, 0 backward calls" in msg and "no DataLoader" in msg


def test_a_missing_script_is_named_not_blamed_on_the_loop():
    with pytest.raises(ProfileFailed) as exc:
        profile(ProfileConfig((sys.executable, "missing_train.py"), capture=True), log=lambda m: None)
    assert exc.value.exit_code == 2 and "'missing_train.py' does not exist" in str(exc.value)
    assert "DataLoader" not in str(exc.value) and "optimizer" not in str(exc.value)


def test_a_script_that_fails_before_any_step_gets_its_error_line(tmp_path):
    script = tmp_path / "bad.py"
    script.write_text("import torch\nraise FileNotFoundError('data/train.bin')\n")
    with pytest.raises(ProfileFailed) as exc:
        profile(ProfileConfig((sys.executable, str(script)), capture=True), log=lambda m: None)
    msg = str(exc.value)
    assert exc.value.exit_code == 1 and "before any optimizer step" in msg
    assert "FileNotFoundError: data/train.bin (at bad.py:2)" in msg


def test_a_command_that_ends_before_the_probes_says_so():
    # 8 steps (one epoch of 4096 items in batches of 512), all of them warm-up: nothing measured to report
    # (a command that ends inside the measured window is reported: tests/test_profile_short_runs.py)
    with pytest.raises(ProfileFailed) as exc:
        profile(_config("input_bound.py", "--epochs", "1", "--batch", "512", "--item-sleep", "0", warmup=10),
                log=lambda m: None)
    assert exc.value.exit_code == 2 and "lower --warmup/--steps" in str(exc.value)


def test_a_hanging_command_is_stopped_at_the_timeout():
    cfg = ProfileConfig((sys.executable, "-c", "import time; time.sleep(60)"), timeout_s=2, capture=True)
    with pytest.raises(ProfileFailed) as exc:
        profile(cfg, log=lambda m: None)
    assert exc.value.exit_code == 124 and "--timeout" in str(exc.value)
    assert "0 optimizer steps seen" in str(exc.value)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process's state in /proc")
def test_what_the_command_leaves_running_in_its_session_ends_with_it(tmp_path):
    # As DataLoader workers of a rank that left with os._exit: they saw their parent gone only at their next
    # 5 s check, holding the command's output open meanwhile (each such verification re-run took 5 s more).
    pid_file = tmp_path / "left.pid"
    code = ("import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            "open(sys.argv[1], 'w').write(str(p.pid))")
    run_instrumented(ProfileConfig((sys.executable, "-c", code, str(pid_file)), capture=True, timeout_s=60),
                     probes=False)
    left = int(pid_file.read_text())
    try:
        for _ in range(100):  # a killed process is gone, or a zombie, within moments
            if not _running(left):
                break
            time.sleep(0.1)
        assert not _running(left)
    finally:
        if _running(left):
            os.kill(left, signal.SIGKILL)


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_bad_config_is_rejected_before_running():
    with pytest.raises(ValueError, match="after `--`"):
        ProfileConfig(())
    with pytest.raises(ValueError, match="--steps >= 3"):
        ProfileConfig(("python",), steps=1)
