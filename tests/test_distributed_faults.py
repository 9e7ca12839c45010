"""A rank that dies or hangs mid-collective: the others stop with a clear error in time; under
`hasten train`, one line naming the step and the checkpoint, or a torchrun restart that resumes."""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from hasten.distributed import CollectiveError, naive_allreduce, ring_allreduce, torus_allreduce
from hasten.distributed.faults import Terminated, peer_failure, stop_on_sigterm, terminated
from hasten.harness.launch import free_port, spawn, torchrun_worker_pids

TIMEOUT_S = 3.0


def _worker(rank, world, fault, algo):
    fn = {"ring": ring_allreduce, "naive": naive_allreduce, "torus": torus_allreduce}[algo]
    x = torch.ones(1000)
    fn(x, timeout_s=TIMEOUT_S)  # a healthy round first: the links are up
    dist.barrier()
    if rank == world - 1:
        if fault == "kill":
            os._exit(1)
        time.sleep(TIMEOUT_S + 1.5)  # hung: alive, but never joins the collective
        return "slept"
    start = time.monotonic()
    try:
        fn(x, timeout_s=TIMEOUT_S, check_sizes=False)
    except CollectiveError as exc:
        return ("error", str(exc), time.monotonic() - start)
    return ("no error", time.monotonic() - start)


@pytest.mark.multiproc
@pytest.mark.parametrize("fault, algo", [("kill", "ring"), ("kill", "torus"), ("hang", "ring"),
                                         ("hang", "naive")])
def test_dead_or_hung_rank_gives_clear_error_within_timeout(fault, algo):
    world = 4
    results = spawn(_worker, world, (fault, algo), timeout_s=TIMEOUT_S, check=False,
                    join_timeout_s=40)
    if fault == "kill":
        assert results[-1] == ("died", 1)
    for rank, res in enumerate(results[:-1]):
        assert res[0] == "error", f"rank {rank}: {res}"
        assert "did not complete" in res[1] and f"rank {rank}" in res[1]
        # 1 s slack for 4 processes on 2 shared cores
        assert res[2] < TIMEOUT_S + 1.0, f"rank {rank} took {res[2]:.1f} s"


def _ddp_worker(rank, world):
    from hasten.distributed import wrap_ddp

    model = wrap_ddp(torch.nn.Linear(10, 10), hook="ring", timeout_s=TIMEOUT_S)
    for _ in range(3):  # past DDP's bucket rebuild: later steps all-reduce through the hook only
        model(torch.randn(4, 10)).sum().backward()
    dist.barrier()
    if rank == world - 1:
        os._exit(1)
    start = time.monotonic()
    try:
        model(torch.randn(4, 10)).sum().backward()
    except RuntimeError as exc:
        return ("error", str(exc), time.monotonic() - start)
    return ("no error", time.monotonic() - start)


@pytest.mark.multiproc
def test_rank_killed_during_ddp_backward_fails_the_others():
    results = spawn(_ddp_worker, 3, timeout_s=TIMEOUT_S, check=False, join_timeout_s=40)
    assert results[-1] == ("died", 1)
    for rank, res in enumerate(results[:-1]):
        assert res[0] == "error" and "did not complete" in res[1], f"rank {rank}: {res}"
        assert res[2] < TIMEOUT_S + 1.0


# --- hasten.distributed.faults: what counts as a lost peer, SIGTERM as an exception --------

GLOO_RESET = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
              "[127.0.0.1]:55021: Connection reset by peer. This is typically caused by a remote worker "
              "hanging or bugs in the application. Check the logs of the remote worker before reporting "
              "an error. GLHF!")
GLOO_TIMEOUT = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out "
                "waiting 5000ms for recv operation to complete")


@pytest.mark.parametrize("exc, expected", [
    (RuntimeError(GLOO_RESET), "torch.distributed: Connection reset by peer"),
    (RuntimeError(GLOO_TIMEOUT), "torch.distributed: Timed out waiting 5000ms for recv operation to complete"),
    (dist.DistBackendError("NCCL communicator was aborted on rank 1"),
     "torch.distributed: NCCL communicator was aborted on rank 1"),
    (CollectiveError("ring all-reduce step 2 (recv from rank 3) did not complete within 3.0 s"),
     "hasten all-reduce: ring all-reduce step 2 (recv from rank 3) did not complete within 3.0 s"),
])
def test_peer_failure_names_the_transport_error_in_a_few_words(exc, expected):
    assert peer_failure(exc) == expected


def test_peer_failure_looks_through_the_exception_chain():
    try:
        try:
            raise RuntimeError(GLOO_RESET)
        except RuntimeError:
            raise Terminated()  # torchrun's SIGTERM landing while the gloo error unwinds
    except Terminated as exc:
        chained = exc
    assert peer_failure(chained) == "torch.distributed: Connection reset by peer"
    assert terminated(chained) is chained and terminated(RuntimeError(GLOO_RESET)) is None


@pytest.mark.parametrize("exc", [
    RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x10 and 5x10)"),
    ValueError("Timed out"),  # not a RuntimeError: a transport never raises it
    KeyError("gloo"),
    Terminated(),
])
def test_ordinary_errors_are_not_peer_failures(exc):
    assert peer_failure(exc) is None


def test_sigterm_raises_once_then_is_ignored_once_stopping(monkeypatch):
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Terminated, match="SIGTERM"):
        with stop_on_sigterm():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # interrupted by the handler long before this ends
    with stop_on_sigterm() as guard:
        guard.stopping = True
        os.kill(os.getpid(), signal.SIGTERM)  # ignored: the process is already reporting
        time.sleep(0.05)
    # After a failure the process is on its way out: SIGTERM stays ignored.
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    signal.signal(signal.SIGTERM, before)
    with stop_on_sigterm():
        pass
    assert signal.getsignal(signal.SIGTERM) is before  # a clean exit restores the handler


# --- `hasten train` with a lost worker: torchrun restarts and resumes; without restarts, one line -----

def _train_args(data, run_dir, epochs, *extra, batch=32):
    return ["-m", "hasten", "train", "--data", str(data), "--model", "resnet10", "--width", "4",
            "--batch-size", str(batch), "--warmup-epochs", "1", "--epochs", str(epochs), "--optimizer", "lars",
            "--deterministic", "--checkpoint-every", "10", "--device", "cpu", "--run-dir", str(run_dir), *extra]


def _env(tmp_path):
    return {**os.environ, "OMP_NUM_THREADS": "1", "HASTEN_CACHE": str(tmp_path / "cache"), "HASTEN_PROGRESS": "0"}


def _torchrun(nproc, *args):
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc), *args]


def _wait_for_step(run_dir: Path, step: int, procs, timeout_s=90.0):
    """Until metrics.jsonl logs ``step`` (after the checkpoint at step 10, so some work is lost)."""
    deadline = time.monotonic() + timeout_s
    metrics = run_dir / "metrics.jsonl"
    while time.monotonic() < deadline:
        if metrics.exists() and any(json.loads(line).get("step", 0) >= step
                                    for line in metrics.read_text().splitlines() if line.endswith("}")):
            return
        for p in procs:
            assert p.poll() is None, f"training ended (rc {p.returncode}) before step {step}"
        time.sleep(0.01)
    raise AssertionError(f"no step {step} within {timeout_s} s")


needs_proc = pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds ranks through /proc")


@pytest.mark.multiproc
@pytest.mark.slow
@needs_proc
def test_rank_sigkilled_under_torchrun_restart_resumes_to_the_same_weights(colours, tmp_path):
    epochs = 8  # 4 steps each: killed at step 12, after the checkpoint at 10, with 20 steps still to go
    env = _env(tmp_path)
    killed, straight = tmp_path / "killed", tmp_path / "straight"
    err = (tmp_path / "killed.err").open("w")
    # 3 ranks: with 2, a restart also worked before hasten kept each attempt's store keys apart.
    proc = subprocess.Popen(_torchrun(3, "--max-restarts", "1", *_train_args(colours, killed, epochs, batch=48)), env=env,
                            stdout=subprocess.DEVNULL, stderr=err)
    try:
        _wait_for_step(killed, 12, [proc])
        os.kill(torchrun_worker_pids(proc.pid)[1], signal.SIGKILL)
        assert proc.wait(timeout=120) == 0  # the job finished, after one restart
    finally:
        if proc.poll() is None:
            proc.kill()
    log = (tmp_path / "killed.err").read_text()
    lost = re.search(r"hasten train: lost contact with a peer rank at step (\d+) \(gloo: [^)]*\); newest "
                     r"checkpoint: \S+checkpoint.pt \(step (\d+)\); torchrun restarts the workers", log)
    assert lost, log
    resumed = re.search(r"hasten train: resuming from \S+checkpoint.pt \(step (\d+)\)", log)
    # The checkpoint may be the lost step's own when the kill lands just after it was written.
    assert resumed and int(resumed[1]) == int(lost[2]) and 10 <= int(resumed[1]) <= int(lost[1]) <= 4 * epochs, log
    subprocess.run(_torchrun(3, *_train_args(colours, straight, epochs, batch=48)), env=env, check=True,
                   capture_output=True, timeout=120)
    a = torch.load(killed / "checkpoint.pt", weights_only=True)
    b = torch.load(straight / "checkpoint.pt", weights_only=True)
    assert a["step"] == b["step"] == 4 * epochs
    for k in b["model"]:  # bit for bit: --deterministic keeps gloo's summation order fixed (see the recipe)
        assert torch.equal(a["model"][k], b["model"][k]), k
    steps = [json.loads(line).get("step") for line in (killed / "metrics.jsonl").read_text().splitlines()]
    assert steps[:-1] == list(range(4, 4 * epochs + 1, 4))  # each epoch logged once, the redone ones too


@pytest.mark.multiproc
@needs_proc
def test_without_restarts_every_survivor_ends_with_one_line(colours, tmp_path):
    run, logs, timeout_s = tmp_path / "run", tmp_path / "logs", 20
    proc = subprocess.Popen(_torchrun(3, "--log-dir", str(logs), "--redirects", "2",
                                      *_train_args(colours, run, 40, "--collective-timeout", str(timeout_s), batch=48)),
                            env=_env(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for_step(run, 12, [proc])
        os.kill(torchrun_worker_pids(proc.pid)[2], signal.SIGKILL)
        killed_at = time.monotonic()
        assert proc.wait(timeout=120) != 0
        took = time.monotonic() - killed_at
    finally:
        if proc.poll() is None:
            proc.kill()
    assert took < timeout_s, f"the survivors took {took:.1f} s to stop"
    for rank in (0, 1):
        (stderr,) = logs.glob(f"*/attempt_0/{rank}/stderr.log")
        lines = [line for line in stderr.read_text().splitlines() if line.strip()]
        # Either the survivor saw the peer go first, or torchrun's SIGTERM reached it first: one line each,
        # naming the checkpoint (a fresh-clone CI run saw the second).
        assert lines and re.fullmatch(
            r"hasten train: (lost contact with a peer rank at step \d+ \(gloo: Connection (reset|closed) by "
            r"peer\)|stopped by SIGTERM at step \d+ \(torchrun sends it when another rank fails\)); "
            r"newest checkpoint: \S+/checkpoint.pt \(step \d+0\); rerun with --resume auto", lines[-1]), lines
        assert not any("Traceback" in line or "GLHF" in line for line in lines), lines


@pytest.mark.multiproc
def test_hung_rank_is_caught_by_the_collective_timeout(colours, tmp_path):
    """A rank stopped (SIGSTOP) is alive but silent: only the timeout can tell. Started the way
    torchrun starts ranks, without its agent, which would not notice a stopped worker either."""
    run, timeout_s = tmp_path / "run", 4
    port = free_port()
    procs, lines = [], {0: [], 1: []}
    for rank in (0, 1):
        env = {**_env(tmp_path), "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
               "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        procs.append(subprocess.Popen(
            [sys.executable, *_train_args(colours, run, 40, "--collective-timeout", str(timeout_s))],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))

    def read(rank):
        for line in procs[rank].stderr:
            lines[rank].append((time.monotonic(), line.rstrip()))

    reader = threading.Thread(target=read, args=(0,), daemon=True)
    reader.start()
    try:
        _wait_for_step(run, 12, procs)
        procs[1].send_signal(signal.SIGSTOP)
        stopped_at = time.monotonic()
        assert procs[0].wait(timeout=60) == 1
        reader.join(10)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    when, last = lines[0][-1]
    # gloo words the same timeout two ways, depending on which side notices first.
    assert re.fullmatch(r"hasten train: lost contact with a peer rank at step \d+ \(gloo: (Timed out waiting "
                        rf"{timeout_s * 1000}ms for (recv|send) operation to complete|Application timeout caused "
                        r"pair closure)\); newest checkpoint: "
                        r"\S+/checkpoint.pt \(step \d+0\); rerun with --resume auto", last), lines[0]
    # The timeout, not an accident: not before it, and within it plus slack for 2 busy shared cores.
    assert timeout_s - 0.5 < when - stopped_at < timeout_s + 5, when - stopped_at
    assert len(lines[0]) == 1, lines[0]
