"""A worker SIGKILLed mid-training: does the job come back, and to the same weights?

Runs `hasten train` under torchrun three times on the same settings (`--deterministic`):

1. straight:   uninterrupted, the reference;
2. restarted:  `--max-restarts 1`; once the run has logged --kill-after-step steps (past a
               checkpoint), one worker gets SIGKILL; torchrun restarts the workers, which
               resume from the newest checkpoint (`--resume auto` is implied on a restart);
3. no restart: the same kill without `--max-restarts`; the survivors' last stderr lines.

Prints a short table and writes benchmarks/results/lost_worker.json: exit codes, the step
killed at and resumed from, whether the final weights equal the reference bit for bit (and
the largest difference), seconds from the kill to the end, the survivors' last lines.
Not a speed benchmark: the times are there to show nothing waits for a timeout.

    python benchmarks/lost_worker.py                 # 3 ranks, CIFAR-10-JPEG subset
    python benchmarks/lost_worker.py --nproc 2 --data DIR
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from hasten.harness.launch import torchrun_worker_pids
from hasten.rundir import write_json

from _common import RESULTS, MeasuredConditions, add_data_argument, require_data


def logged_step(run_dir: Path) -> int:
    import json

    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return 0
    return max((json.loads(line).get("step", 0) for line in path.read_text().splitlines() if line.endswith("}")),
               default=0)


def launch(args, run_dir: Path, log_dir: Path, *, restarts: int, kill_rank: int | None) -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(args.nproc),
           "--max-restarts", str(restarts), "--log-dir", str(log_dir), "--redirects", "2",
           "-m", "hasten", "train", "--data", args.data, "--train-subset", str(args.train_subset),
           "--model", "resnet10", "--width", "8", "--batch-size", str(args.batch_size), "--epochs", str(args.epochs),
           "--checkpoint-every", str(args.checkpoint_every), "--deterministic", "--run-dir", str(run_dir)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    start = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    record = {"command": " ".join(cmd[1:]), "killed_rank": kill_rank}
    if kill_rank is not None:
        while logged_step(run_dir) < args.kill_after_step:
            if proc.poll() is not None:
                raise SystemExit(f"training ended (rc {proc.returncode}) before step {args.kill_after_step}")
            time.sleep(0.01)
        os.kill(torchrun_worker_pids(proc.pid)[kill_rank], signal.SIGKILL)
        killed = time.monotonic()
    record["exit_code"] = proc.wait()
    record["s_total"] = time.monotonic() - start
    if kill_rank is not None:
        record["s_from_kill_to_end"] = time.monotonic() - killed
    record["last_stderr_line"] = {}
    for rank in range(args.nproc):
        for attempt in sorted(log_dir.glob(f"*/attempt_*/{rank}/stderr.log")):
            lines = [line for line in attempt.read_text().splitlines() if line.strip()]
            record["last_stderr_line"][f"{attempt.parent.parent.name} rank {rank}"] = lines[-1] if lines else ""
    return record


def scrub(obj, tmp: str):
    """The record without this machine's paths: the temporary directory becomes $TMP,
    the repository root becomes '.'."""
    import json

    text = json.dumps(obj).replace(tmp, "$TMP").replace(str(Path(__file__).resolve().parent.parent) + "/", "")
    return json.loads(text)


def compare(a: Path, b: Path) -> dict:
    x = torch.load(a / "checkpoint.pt", weights_only=True)
    y = torch.load(b / "checkpoint.pt", weights_only=True)
    diff = max(float((x["model"][k].double() - y["model"][k].double()).abs().max()) for k in y["model"]
               if y["model"][k].is_floating_point())
    equal = all(torch.equal(x["model"][k], y["model"][k]) for k in y["model"])
    return {"steps": [x["step"], y["step"]], "bitwise_equal": equal, "max_abs_diff": diff}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_data_argument(p)
    p.add_argument("--nproc", type=int, default=3)
    p.add_argument("--train-subset", type=int, default=3072)
    p.add_argument("--batch-size", type=int, default=96)
    p.add_argument("--epochs", type=float, default=4)
    p.add_argument("--checkpoint-every", type=int, default=20)
    p.add_argument("--kill-after-step", type=int, default=64, help="kill once metrics.jsonl logs this step")
    p.add_argument("--kill-rank", type=int, default=1)
    p.add_argument("--json", default=str(RESULTS / "lost_worker.json"))
    args = p.parse_args()
    require_data(args.data, "lost_worker")
    with MeasuredConditions() as cond, tempfile.TemporaryDirectory(prefix="lost-worker-") as tmpdir:
        tmp = Path(tmpdir)
        straight = launch(args, tmp / "straight", tmp / "logs-straight", restarts=0, kill_rank=None)
        restarted = launch(args, tmp / "restarted", tmp / "logs-restarted", restarts=1, kill_rank=args.kill_rank)
        restarted.update(compare(tmp / "restarted", tmp / "straight"))
        lost = launch(args, tmp / "lost", tmp / "logs-lost", restarts=0, kill_rank=args.kill_rank)
    report = scrub({"settings": vars(args), "straight": straight, "restarted": restarted, "no_restart": lost,
                    "conditions": cond.as_dict()}, tmpdir)
    write_json(args.json, report)
    print(f"{'run':<12} {'exit':>4} {'kill->end s':>11}  result")
    print(f"{'straight':<12} {straight['exit_code']:>4} {'':>11}  reference, {straight['s_total']:.0f} s")
    restarted, lost = report["restarted"], report["no_restart"]
    print(f"{'restarted':<12} {restarted['exit_code']:>4} {restarted['s_from_kill_to_end']:>11.1f}  "
          f"weights bitwise equal: {restarted['bitwise_equal']} (max |diff| {restarted['max_abs_diff']:.3g})")
    print(f"{'no restart':<12} {lost['exit_code']:>4} {lost['s_from_kill_to_end']:>11.1f}  survivors' last lines:")
    for who, line in lost["last_stderr_line"].items():
        print(f"  {who}{' (the killed one)' if who.endswith(f'rank {args.kill_rank}') else ''}: {line}")
    print(cond.summary())
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
