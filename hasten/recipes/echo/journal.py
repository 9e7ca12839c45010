"""The echo sweeps' journals (``hasten.rundir.RunJournal``): what their finished runs
depend on (``journal_settings``, ``auto_settings``), and the flags and opening of a
journal for the sweep benchmarks (``add_journal_arguments``, ``open_journal``): a
stopped sweep resumes where it stopped.

Used by ``hasten.recipes.echo.sweep``, ``hasten.recipes.echo.target`` and the sweep
benchmarks. Changes the training math: no.
"""

from __future__ import annotations

import os
from dataclasses import asdict

import torch

from hasten.echo.auto import rule_digest
from hasten.recipes.echo.config import RunSpec, SweepConfig
from hasten.rundir import RunJournal


def journal_settings(cfg: SweepConfig) -> dict:
    """What a journal's finished runs depend on besides the code: the sweep's settings (the
    data as an absolute path), the hardware and torch's threads (the wall times)."""
    from hasten.environment import cpu_name

    settings = asdict(cfg)
    # Only AutoEcho's runs read it: it goes in their keys (auto_settings), so that the runs
    # without AutoEcho of a journal stay valid when it changes.
    del settings["value_every"]
    if cfg.net_widths is None and cfg.target is None and cfg.lead_batches == 2:
        # The paper-regime sweep, which reads none of these fields: its journals from before
        # they existed keep their digest (and `hasten echo --sweep` its run directory).
        for name in ("net_widths", "target", "lead_batches"):
            del settings[name]
    return {**settings, "data": os.path.abspath(cfg.data), "cpu": cpu_name(), "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads()}


def auto_settings(cfg: SweepConfig, spec: RunSpec) -> dict:
    """What an AutoEcho run's result depends on beyond its spec, for its journal key (the
    journal's digest leaves it out, see journal_settings): how often it measures a repeat's
    value and the source of its rule (``hasten.echo.auto.rule_digest``: a changed rule reruns
    AutoEcho's runs, not the others); nothing for other runs."""
    return {"value_every": cfg.value_every, "autoecho_rule": rule_digest()} if spec.echo == "auto" else {}


def add_journal_arguments(parser, out_default: str) -> None:
    """The sweep benchmarks' output and resume flags: --out, --journal, --fresh, --markdown."""
    parser.add_argument("--out", default=out_default, help="results JSON (default %(default)s)")
    parser.add_argument("--journal", help="finished runs, for resuming (default: the JSON's name with .runs.jsonl)")
    parser.add_argument("--fresh", action="store_true", help="start over: ignore (and replace) the journal")
    parser.add_argument("--markdown", metavar="JSON", help="print the results page's tables from a results JSON "
                                                           "and stop")


def open_journal(args, cfg: SweepConfig) -> RunJournal:
    """The journal the flags of :func:`add_journal_arguments` name, for ``cfg``: emptied with
    --fresh; when it holds finished runs, a line saying so, and a warning if other code
    (another commit) made some of them."""
    from pathlib import Path

    from hasten.environment import describe_environment

    path = Path(args.journal or Path(args.out).with_suffix(".runs.jsonl"))
    if args.fresh:
        path.unlink(missing_ok=True)
    commit = describe_environment()["git_commit"]
    journal = RunJournal(path, journal_settings(cfg), meta={"git_commit": commit})
    if len(journal):
        print(f"resuming: {len(journal)} finished runs in {path}", flush=True)
        older = sorted({str(m.get("git_commit")) for m in journal.replayed_meta} - {str(commit)})
        if older:
            print(f"warning: some finished runs were made by other code (commits {', '.join(older)}); "
                  "--fresh starts over", flush=True)
    return journal
