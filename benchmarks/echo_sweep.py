"""Data echoing (Choi et al., 2019) in the paper's regime, on CIFAR-10-JPEG, training for real on the CPU.

Runs ``hasten.recipes.echo.sweep.run`` (its module docstring has the design): a
fixed class-balanced subset of 10,000 training images decoded once at 16x16, a
small CNN trained for a fixed budget (3 epochs) with a warm-up + linear-decay
learning rate; the target is the baseline's mean minus one std (over seeds) of
its accuracy on 5,000 fixed test images at the end of the budget; learning
rates (and, when needed, the budget) tuned per setting; a slow source with
per-request latency, concurrent requests and a shared link whose bandwidth sets
R; the best loader without echoing found per R; then

- fresh examples to the target against e for example-before, example-after and
  batch echoing, with final accuracy (all 10,000 test images) at the full budget;
- the shuffle-buffer study (duplicate share against buffer size, cost in steps);
- wall time to the target at R about 2, 4, 6, 8: e = 1, fixed factors, AutoEcho,
  and e = 1 against AutoEcho at R = 0.5 (not input-bound); interleaved over seeds.

Writes benchmarks/results/echo_sweep.json, echo_fresh_examples.png, echo_speedup.png.
Each run is written to a journal (``echo_sweep.runs.jsonl`` beside the JSON) as it
finishes; run the same command again after a stop and it resumes, taking the
finished runs from the journal (``--fresh`` starts over).

    python benchmarks/echo_sweep.py [--data PATH] [--seeds 3]

Defaults: ``--data`` is ``$HASTEN_DATA`` if set, else ``../shared/data/cifar10-jpeg.tar.xz``
beside the checkout; 3 seeds; CPU, one torch thread (on a shared
CPU a second thread made steps 5x slower). Run under the shared benchmark lock.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from hasten.recipes.echo.config import SweepConfig
from hasten.recipes.echo.report import format_table, markdown_tables, write_plots
from hasten.recipes.echo.sweep import add_journal_arguments, open_journal, run
from hasten.rundir import write_json

from _common import RESULTS, MeasuredConditions, add_data_argument, require_data


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_data_argument(ap)
    ap.add_argument("--seeds", type=int, default=3, help="seeds per configuration (default 3)")
    ap.add_argument("--train-images", type=int, default=10_000, help="training subset (default 10000)")
    ap.add_argument("--epochs", type=float, default=3.0, help="the baseline's budget in epochs (default 3)")
    add_journal_arguments(ap, str(RESULTS / "echo_sweep.json"))
    args = ap.parse_args()
    if args.seeds < 1 or args.train_images < 1 or args.epochs <= 0:
        ap.error("--seeds and --train-images must be >= 1 and --epochs > 0")
    if args.markdown:
        import json

        print(markdown_tables(json.loads(Path(args.markdown).read_text())))
        return 0
    require_data(args.data, "echo_sweep")
    torch.set_num_threads(1)
    cfg = SweepConfig(data=args.data, seeds=args.seeds, train_images=args.train_images, epochs=args.epochs)
    journal = open_journal(args, cfg)

    def log(**record) -> None:
        if record.get("event") == "target":
            print(f"target {record['target']:.4f} (baseline mean - std), step {record['step_time_s'] * 1e3:.1f} ms, "
                  f"baseline lr {record['baseline_lr']:g}", flush=True)
        elif record.get("event") == "loader":
            print(f"R={record['ratio']:g}: loader {record['chosen']}", flush=True)

    with MeasuredConditions("cpu", argv=sys.argv) as cond:
        report = run(cfg, log=log, journal=journal)
    results = {"benchmark": "echo_sweep", "conditions": cond.as_dict(), **report}
    out = Path(args.out)
    write_json(out, results)
    print(format_table(report["summary"]))
    print(cond.summary())
    for g in report["goals"]["per_ratio"]:
        print(g)
    print("not input-bound, AutoEcho slowdown:", report["goals"].get("not_input_bound_autoecho_slowdown"))
    for path in write_plots(report["summary"], out.parent):
        print(f"plot: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
