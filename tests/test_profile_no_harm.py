"""`hasten profile` never breaks a script that runs without it (issue 32).

Each case is a training loop of the kind that broke in the issue, in tests/profile_scripts/:
an LSTM whose oneDNN has no bf16 (the autocast probe), a GAN with two optimizers and a
retained graph (the step replay), LBFGS's closure and a gradient scaler (optimizer steps
that are not a plain ``opt.step()``), a replayed step that raises inside the loop. Each must
end with a report of its measured steps; a probe that failed is dropped with its reason,
and one that runs in isolation leaves the run as it found it (weights, gradients, buffers,
optimizer state and random state hashed after every step, with and without profiling).
Nothing here reads a clock: what is checked is whether the report came and what it says.
"""

import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from hasten.cli import main
from hasten.profile.launcher import ProfileConfig, ProfileFailed, profile
from hasten.profile.outcome import HASTEN_FAILED
from profile_helpers import measured_steps

SCRIPTS = Path(__file__).parent / "profile_scripts"
WARMUP, STEPS = 2, 5


def run_profile(*args, **kw):
    # exactly STEPS measured (no stopping rule): these cases are about what runs, not about the shares
    kw = {"warmup": WARMUP, "steps": STEPS, "probe_steps": 2, "capture": True, "timeout_s": 120, "decide_s": 0, **kw}
    return profile(ProfileConfig((sys.executable, *(str(a) for a in args)), **kw), log=lambda m: None)


def dropped(a, probe):
    return [x["why"] for x in a.dropped if x["probe"] == probe]


def test_an_lstm_that_refuses_bf16_gets_its_report_and_the_autocast_probe_is_dropped():
    a = run_profile(SCRIPTS / "lstm.py", "--no-bf16-lstm")
    assert measured_steps(a) == STEPS and a.step_alone_s > 0  # the measured steps and the plain replay are reported
    (why,) = dropped(a, "autocast")
    assert "could not create a primitive descriptor for the LSTM" in why and "isolated" in why
    assert not any("autocast" in r.fix for r in a.recommendations)


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="ONEDNN_MAX_CPU_ISA caps x86 oneDNN only")
def test_an_lstm_on_a_cpu_whose_onednn_has_no_bf16(monkeypatch):
    # The issue's own failure: oneDNN capped at AVX2 has no bf16 LSTM (nor fast bf16 matmuls).
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    a = run_profile(SCRIPTS / "lstm.py")
    assert 0 < a.steps <= STEPS and dropped(a, "autocast")  # (a step stalled beside other jobs is left out)


@pytest.mark.parametrize("raises", [True, False], ids=["trial-raises", "trial-runs"])
def test_the_autocast_trial_leaves_weights_gradients_buffers_optimizer_and_rng_as_they_were(tmp_path, raises):
    # The trial runs after the last measured step's optimizer step, before the script hashes its
    # state; the first step, before any hook sees a step begin, is not one of the counted steps.
    flags = ["--no-bf16-lstm"] if raises else []
    n = 1 + WARMUP + STEPS
    plain, profiled = tmp_path / "plain.txt", tmp_path / "profiled.txt"
    subprocess.run([sys.executable, SCRIPTS / "lstm.py", *flags, "--steps", str(n + 1), "--digest", plain],
                   check=True)
    a = run_profile(SCRIPTS / "lstm.py", *flags, "--digest", profiled)
    assert bool(dropped(a, "autocast")) == raises
    hashes, truth = profiled.read_text().splitlines(), plain.read_text().splitlines()
    assert hashes[:n] == truth[:n]
    assert hashes[n] != truth[n]  # the first replayed step trains on the kept batch: the hash sees it


@pytest.mark.parametrize("args", [(), ("--retain-graph",), ("--no-loader",), ("--no-loader", "--retain-graph")],
                         ids=["loader", "loader-retain-graph", "no-loader", "no-loader-retain-graph"])
def test_a_gan_with_two_optimizers_is_replayed_without_touching_its_graph(args):
    # The discriminator steps first (its optimizer sets the pace); its first measured call takes the
    # generator's output, attached to the generator's graph: never kept, never replayed. Its 20 ms
    # of slept "device" time per discriminator forward (60 ms a step, against a millisecond or two of
    # CPU) keep it from input-bound, so that autocast is weighed.
    a = run_profile(SCRIPTS / "gan.py", "--device-sleep", 0.02, *args)
    assert a.dropped == [] and a.step_alone_s > 0 and a.verdict in ("compute-bound", "balanced")
    assert any("bf16 autocast" in f for f in [r.fix for r in a.recommendations] + [r["fix"] for r in a.rejected])
    if "--no-loader" not in args:
        assert a.micro_batches == 1  # one batch of the loader per step, though three discriminator forwards


@pytest.mark.parametrize("optimizer", ["lbfgs", "scaler"])
def test_a_closure_or_a_gradient_scaler_is_profiled_as_any_step(optimizer):
    a = run_profile(SCRIPTS / "closure_step.py", "--optimizer", optimizer)
    assert a.dropped == [] and a.step_alone_s > 0 and a.micro_batches == 1
    assert not any("no module with parameters" in n for n in a.notes)  # LBFGS's model runs in its closure


def test_a_replayed_step_that_raises_in_the_loop_fails_the_profile_naming_the_probe(capsys):
    # The script failed under the profile (issue 43: timm died in 4 runs of 4 and hasten exited 0 with
    # numbers): no report as if all was well, the probe named and how to turn it off.
    code = main(["profile", "--quiet", "--warmup", str(WARMUP), "--steps", str(STEPS), "--probe-steps", "2",
                 "--decide-within", "0", "--",
                 sys.executable, str(SCRIPTS / "lstm.py"), "--reject-repeated-batch"])
    out, err = capsys.readouterr()
    assert code == HASTEN_FAILED
    assert "replay probe failed" in err and "--no-probe replay" in err
    assert "ValueError: this batch was seen before (at lstm.py:" in err
    assert "fixes, best first" not in out and "steps after" not in out


def test_a_probe_turned_off_by_the_flag_does_not_run(tmp_path, capsys):
    out = tmp_path / "p.json"
    code = main(["profile", "--quiet", "--warmup", str(WARMUP), "--steps", str(STEPS), "--probe-steps", "2",
                 "--no-probe", "autocast", "--json", str(out), "--", sys.executable, str(SCRIPTS / "lstm.py"),
                 "--no-bf16-lstm"])
    assert code == 0 and "probes off (--no-probe): autocast" in capsys.readouterr().out
    d = json.loads(out.read_text())
    assert d["probes_off"] == ["autocast"] and d["dropped"] == []  # never tried, so never failed
    assert d["step_alone_s"] > 0  # the other probes ran


def test_turning_the_replay_off_turns_off_what_is_compared_with_it():
    a = run_profile(SCRIPTS / "lstm.py", "--no-bf16-lstm", skip_probes=("replay",))
    assert a.probes_off == ["replay", "autocast", "comm"] and a.dropped == []
    assert measured_steps(a) == STEPS


def test_an_unknown_probe_name_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["profile", "--no-probe", "autocats", "--", sys.executable, "train.py"])
    assert exc.value.code == 2 and "argument --no-probe: unknown probe 'autocats'" in capsys.readouterr().err


def test_hastens_own_failure_is_reported_as_hastens_not_as_the_commands(tmp_path):
    # A script that breaks hasten's bookkeeping (each batch's timing raises inside hasten), then
    # iterates a loader forever: hasten stops it and says whose failure it was.
    script = tmp_path / "breaks_hasten.py"
    script.write_text(
        "import torch\n"
        "from hasten.profile.inject import loader\n"
        "def broken(st, lid):\n"
        "    raise KeyError('a loader hasten lost track of')\n"
        "loader.is_training_loader = broken\n"
        "batches = torch.utils.data.DataLoader(list(range(8)), batch_size=2)\n"
        "while True:\n"
        "    for x in batches:\n"
        "        pass\n")
    with pytest.raises(ProfileFailed) as exc:
        run_profile(script, timeout_s=60)
    msg = str(exc.value)
    assert exc.value.exit_code == HASTEN_FAILED and "hasten profile failed in its own code" in msg
    assert "KeyError" in msg and "failed with exit code" not in msg
