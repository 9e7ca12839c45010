"""Data echoing against a real source: the real-target echo experiment with its shards
served over an emulated link, every second measured (issue 33, item 6).

The experiment of ``benchmarks/echo_target.py`` (all 50,000 CIFAR-10-JPEG training
images, the speedrun network at widths 16, 32, 64, batch 256, 75% on 5,000 fixed test
images; the learning rates and budgets it tuned, read from its results JSON), with the
modelled clock replaced by a real upstream:

- the training set packed once into tar shards (``hasten.stream.pack``, shuffled,
  about ``--shard-kb`` each), served by RangeHTTPServer in a network namespace
  (``hasten.harness.netns``: veth, bridge, tc htb on the server's side);
- this process reads them over HTTP with ``RemoteShards`` (obstore), no local cache,
  through the streaming pipeline's ``ShardLoader`` (its plan, ``--prefetch`` shards read
  ahead, its decode as the shards arrive; ``hasten.recipes.echo.shard_source``); the echo stage, shuffle buffer and keyed
  augmentation after it are the modelled runs' own (``train_budget``). With ``--pipeline
  stage`` the run trains on hasten's whole pipeline instead: ``EchoStage`` after the
  ``ShardLoader`` (its own echo, shuffle buffer and augmentation), as a user's loop has it;
- before each run, a 16-step probe of the step time sets the link's rate so that a
  batch takes R step times to arrive; the run's R is then *measured*: by a read of 3
  batches through the source right after setting the rate, and, for runs without
  echoing, as (wait + step) / step over the whole run.

e = 1, 2, 4 and AutoEcho (not told R) at R = 2 and 4, ``--seeds`` seeds, each seed's
runs in a fresh shuffled order (``hasten.timing.interleaved``), every run stopped at
the target; at R <= 1 (``--ratios 1,2,4``) e = 1 and AutoEcho only, the check that AutoEcho
costs nothing where echoing cannot pay. The goals (issue 44) are printed per R as AutoEcho
over the best fixed factor (over e = 1 at R <= 1): the mean of per-seed ratios of wall
time to the target with its 95% interval. Each run goes to a journal as it finishes, keyed
by what decides it (AutoEcho's runs also by the source of its rule,
``hasten.echo.auto.rule_digest``: a changed rule reruns them and reuses the fixed factors'
runs); the same command resumes, and a command with more seeds or another R adds runs.
The results compare with the modelled ones in ``echo_target.json`` (same settings).

    python benchmarks/echo_link.py [--seeds 3|3-5] [--ratios 2,4] [--pipeline keys|stage] [--smoke]

Needs root and iproute2 (network namespaces, tc) and ``pip install -e '.[remote]'``
plus ``rangehttpserver`` (the ``test`` extra). Writes ``benchmarks/results/echo_link.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from hasten.progress import progress
from hasten.recipes.echo.config import RunSpec, SweepConfig
from hasten.recipes.echo.data import load_data
from hasten.recipes.echo.shard_source import ShardSource
from hasten.recipes.echo.sweep import (_brief, add_journal_arguments, auto_settings, current_step_time, open_journal,
                                      train_budget)
from hasten.rundir import write_json
from hasten.stream.shard_loader import ShardLoader
from hasten.stats import mean_ci, paired_ratios
from hasten.timing import interleaved

from _common import RESULTS, MeasuredConditions, add_data_argument, require_data

PREFIX = "hel"  # this benchmark's namespaces, veths and bridge (the tests and other benchmarks use others)
PORT = 8000
# The link's own subnet: the netns tests and other benchmarks use hasten.harness.netns's, and
# this process joins the bridge with an address (a route in the root namespace).
SUBNET = "10.219"
HOST_ADDRESS = f"{SUBNET}.0.250"
PROBE_BATCHES = 3
# What each --pipeline reads through (a journal key: runs of another upstream are not reused).
UPSTREAMS = {"keys": "ShardLoader", "stage": "EchoStage(ShardLoader)"}
SHUFFLE_BUFFER = 512  # the loader's shuffle buffer (examples), as ShardSource's


# ----------------------------------------------------------------------------- The shards
def shards_for(data_path: str, root: Path, shard_kb: int) -> tuple[Path, np.ndarray]:
    """The training set packed into shuffled shards under ``root`` (once), and the
    training index of each shard example (pack's order: a seeded permutation of the
    layout's order, which is also the record order ``load_data`` decodes in)."""
    from hasten.stream.pack import pack

    out = root / f"shards-{shard_kb}k"
    if not (out / "index.json").is_file():
        pack(data_path, out, shard_bytes=shard_kb * 1024, seed=0, shuffle=True)
    index = json.loads((out / "index.json").read_text())
    n = index["splits"]["train"]["examples"]
    return out, np.random.default_rng(0).permutation(n)


# ----------------------------------------------------------------------------- The link
class Link:
    """A store namespace behind a shaped veth; this process reaches it over the bridge."""

    def __init__(self, shard_dir: Path):
        from hasten.harness.netns import EmulatedCluster

        class Cluster(EmulatedCluster):
            def address(self, rank: int) -> str:
                return f"{SUBNET}.0.{rank + 1}"

        # tc's default burst (one frame), as in every committed run: set_rate below changes the
        # class without a burst, which is tc's default again; at the few Mbit/s of these runs one
        # frame is over a millisecond of the rate, so the short-burst loss at Gbit rates
        # (hasten.harness.netns) does not arise here.
        self.cluster = Cluster(1, rate_gbit=10.0, prefix=PREFIX, burst_s=None)
        self.shard_dir = shard_dir
        self.server = None

    def __enter__(self) -> "Link":
        self.cluster.__enter__()
        try:
            subprocess.run(["ip", "addr", "add", f"{HOST_ADDRESS}/16", "dev", self.cluster.bridge],
                           check=True)
            self.ns, self.dev = self.cluster.placement[0].netns, f"{PREFIX}0n"
            host = self.cluster.address(0)
            self.server = subprocess.Popen(
                ["ip", "netns", "exec", self.ns, sys.executable, "-m", "RangeHTTPServer", str(PORT), "-b", host],
                cwd=self.shard_dir.parent, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            import socket

            for _ in range(400):
                try:
                    socket.create_connection((host, PORT), timeout=1).close()
                    break
                except OSError:
                    time.sleep(0.05)
            else:
                raise RuntimeError(f"the shard server at {host}:{PORT} did not start")
            self.url = f"http://{host}:{PORT}/{self.shard_dir.name}/"
        except BaseException:
            self.close()
            raise
        return self

    def set_rate(self, bytes_per_s: float) -> None:
        """The store's uploads (our downloads) at ``bytes_per_s``: both htb classes of its veth."""
        kbit = max(8, int(bytes_per_s * 8 / 1000))
        for cls in ("1:10", "1:20"):
            subprocess.run(["ip", "netns", "exec", self.ns, "tc", "class", "change", "dev", self.dev, "parent", "1:",
                            "classid", cls, "htb", "rate", f"{kbit}kbit", "ceil", f"{kbit}kbit", "quantum", "1514"],
                           check=True)

    def close(self) -> None:
        if self.server is not None:
            self.server.kill()
            self.server.wait()
            self.server = None
        self.cluster.close()

    def __exit__(self, *exc) -> None:
        self.close()


# ----------------------------------------------------------------------------- One run
def measured_ratio(store, index_of, labels, image_size: int, batch: int, step_s: float) -> float:
    """R as read: seconds for PROBE_BATCHES batches through a fresh source, per batch, over the
    step, after its start-up (the shuffle buffer's first fill and one batch)."""
    source = ShardSource(store, index_of, labels, image_size, prefetch=4)
    keys = source.keys(seed=10_000 + int(time.time()) % 1000)  # (another order than any run's)
    for _ in range(source.buffer + batch):
        next(keys)
    t0 = time.perf_counter()
    for _ in range(PROBE_BATCHES * batch):
        next(keys)
    elapsed = time.perf_counter() - t0
    keys.close()
    return elapsed / PROBE_BATCHES / step_s


def one_run(cfg: SweepConfig, data, store, index_of, link: Link, spec: RunSpec, ratio: float, args) -> dict:
    step_s = current_step_time(cfg, data)
    wire_per_example = sum(store.sizes) / sum(store.examples)  # JPEG bytes and tar headers: what crosses the link
    link.set_rate(cfg.batch_size * wire_per_example / (ratio * step_s))
    time.sleep(0.5)  # reads of the previous run still in flight drain at the old rate
    probe_r = measured_ratio(store, index_of, data.train_labels, cfg.image_size, cfg.batch_size, step_s)
    before = (store.bytes_read, store.requests, store.retries)
    if args.pipeline == "stage":
        def stream(seed: int) -> ShardLoader:  # the run's loader; EchoStage goes after it (train_budget)
            return ShardLoader(store, batch_size=cfg.batch_size, image_size=cfg.image_size, seed=seed,
                               shuffle_buffer=SHUFFLE_BUFFER, prefetch=args.prefetch, crop="pad-crop",
                               with_keys=True, drop_last=True)
        inputs = {"stream": stream}
    else:
        inputs = {"upstream": ShardSource(store, index_of, data.train_labels, cfg.image_size,
                                          buffer=SHUFFLE_BUFFER, prefetch=args.prefetch)}
    result = train_budget(cfg, data, spec, target=cfg.target, stop_at_target=True, final_eval=False, **inputs)
    return {**result, "nominal_ratio": ratio, "calibration_step_s": step_s, "probe_ratio": probe_r,
            "link_bytes_per_s": cfg.batch_size * wire_per_example / (ratio * step_s),
            "bytes_read": store.bytes_read - before[0], "requests": store.requests - before[1],
            "retries": store.retries - before[2]}


# ----------------------------------------------------------------------------- Summary
def summarize(runs: list[dict], ratios, factors) -> list[dict]:
    rows = []
    for ratio in ratios:
        group = [r for r in runs if r["nominal_ratio"] == ratio]
        base = {r["seed"]: r["wall_time_to_target_s"] for r in group if r["echo_factor"] == 1.0 and r["reached_target"]}
        for factor in factors:
            these = sorted((r for r in group if str(r["echo_factor"]) == str(factor)), key=lambda r: r["seed"])
            if not these:
                continue
            reached = [r for r in these if r["reached_target"]]
            speedups = paired_ratios(base, {r["seed"]: r["wall_time_to_target_s"] for r in reached})
            # The same in units of each run's own probe step time: takes out the machine's speed
            # changing between runs (a rerun of some settings on another day, say).
            in_steps = paired_ratios(
                {r["seed"]: r["wall_time_to_target_s"] / r["calibration_step_s"] for r in group
                 if r["echo_factor"] == 1.0 and r["reached_target"]},
                {r["seed"]: r["wall_time_to_target_s"] / r["calibration_step_s"] for r in reached})
            rows.append({
                "ratio": ratio, "echo_factor": str(factor), "n": len(these), "reached": len(reached),
                "probe_ratio": mean_ci([r["probe_ratio"] for r in these]),
                "run_ratio": mean_ci([r["upstream_ratio"] for r in these if r["upstream_ratio"]]),
                "step_ms": mean_ci([r["step_time_s"] * 1e3 for r in these]),
                # The step time over the run's own calibration: the machine's speed taken out (issue 44:
                # AutoEcho's runs, made later, stepped at 180-190 ms against calibrations of 180-188 ms).
                "step_over_calibration": mean_ci([r["step_time_s"] / r["calibration_step_s"] for r in these]),
                "wall_time_to_target_s": mean_ci([r["wall_time_to_target_s"] for r in reached]),
                "fresh_examples_to_target": mean_ci([r["fresh_examples_to_target"] for r in reached]),
                "steps_to_target": mean_ci([r["steps_to_target"] for r in reached]),
                "idle_fraction": mean_ci([r["idle_fraction"] for r in reached]),
                "mean_echo_factor": mean_ci([r["mean_echo_factor"] for r in these]),
                # AutoEcho: what a repeat was worth at the end, measured on the run (hasten.echo.repeat_value).
                "repeat_value": mean_ci([r["repeat_value_measured"][-1] for r in these
                                         if r.get("repeat_value_measured")]),
                # AutoEcho: its gradient_dots measurements (each about 0.4 of a step's work).
                "value_measurements": mean_ci([r["repeat_value_measurements"] for r in these
                                               if r.get("repeat_value_measurements") is not None]),
                "speedup": mean_ci(speedups) if speedups and len(speedups) == len(these) else None,
                "speedup_per_seed": speedups,
                "speedup_in_step_times": mean_ci(in_steps) if in_steps and len(in_steps) == len(these) else None})
    return rows


def goals(rows: list[dict], ratios, runs: list[dict] | None = None) -> dict:
    """Per R: the best fixed factor (by mean speed-up), AutoEcho against it and, at R <= 1,
    AutoEcho against e = 1, each as the mean of per-seed ratios of wall time to the target
    (the other's over AutoEcho's: above 1, AutoEcho was faster) with its 95% interval (t, n - 1
    degrees of freedom), raw and in units of each run's probe step time. Goals (issue 44):
    AutoEcho at least 0.9 of the best fixed factor at R > 1, at least 0.97 of e = 1 at R <= 1;
    at R = 4 the best fixed factor at least 2.5x sooner than e = 1."""
    def row(ratio, factor):
        return next((r for r in rows if r["ratio"] == ratio and r["echo_factor"] == factor), None)

    def per_seed(ratio, factor, scaled):
        return {r["seed"]: r["wall_time_to_target_s"] / (r["calibration_step_s"] if scaled else 1.0)
                for r in runs or [] if r["nominal_ratio"] == ratio and str(r["echo_factor"]) == factor
                and r["reached_target"]}

    def against(ratio, other):
        """AutoEcho over ``other`` per seed: other's wall time / AutoEcho's."""
        out = {}
        for scaled, name in ((False, "raw"), (True, "in_step_times")):
            ratios_ = paired_ratios(per_seed(ratio, other, scaled), per_seed(ratio, "auto", scaled))
            out[name] = mean_ci(ratios_) if ratios_ else None
        return out
    out = {"per_ratio": []}
    for ratio in ratios:
        fixed = [r for r in rows if r["ratio"] == ratio and r["echo_factor"] not in ("auto", "1.0") and r["speedup"]]
        best = max(fixed, key=lambda r: r["speedup"]["mean"], default=None)
        auto = row(ratio, "auto")
        a = auto["speedup"]["mean"] if auto and auto["speedup"] else None
        entry = {"ratio": ratio, "best_fixed_e": best["echo_factor"] if best else None,
                 "best_fixed_speedup": best["speedup"]["mean"] if best else None, "autoecho_speedup": a}
        if ratio <= 1:
            # Echoing cannot pay: AutoEcho must cost nothing next to e = 1.
            vs = against(ratio, "1.0")
            entry["autoecho_vs_e1"] = vs
            entry["autoecho_no_harm_goal_met"] = bool(vs["raw"] and vs["raw"]["mean"] >= 0.97)
        elif best:
            vs = against(ratio, best["echo_factor"])
            entry["autoecho_vs_best"] = vs
            entry["autoecho_goal_met"] = bool(vs["raw"] and vs["raw"]["mean"] >= 0.9)
        if ratio == 4.0:
            entry["best_fixed_goal_met"] = bool(best and best["speedup"]["mean"] >= 2.5)
        out["per_ratio"].append(entry)
    return out


def goals_lines(g: dict) -> str:
    """The goals as lines: AutoEcho over the best fixed factor (R > 1) or e = 1 (R <= 1)."""
    def ci(stat):
        if not stat:
            return "-"
        half = f" ± {stat['ci95']:.2f}" if stat.get("ci95") is not None else ""
        return f"{stat['mean']:.2f}{half} (n = {stat['n']})"
    lines = []
    for e in g["per_ratio"]:
        if "autoecho_vs_e1" in e:
            vs, what, goal = e["autoecho_vs_e1"], "e = 1", 0.97
        elif "autoecho_vs_best" in e:
            vs, what, goal = e["autoecho_vs_best"], f"the best fixed factor (e = {float(e['best_fixed_e']):g})", 0.9
        else:
            continue
        lines.append(f"R = {e['ratio']:g}: AutoEcho / {what} {ci(vs['raw'])}, in step times {ci(vs['in_step_times'])}"
                     f" (goal >= {goal}; mean ± 95% interval over seeds)")
    return "\n".join(lines)


def against_model(rows: list[dict]) -> list[dict]:
    """The modelled experiment's speed-ups (echo_target.json) beside the measured ones."""
    path = RESULTS / "echo_target.json"
    if not path.is_file():
        return []
    modelled = json.loads(path.read_text())["summary"]
    out = []
    for r in rows:
        m = next((x for x in modelled if x["ratio"] == r["ratio"] and x["echo_factor"] == r["echo_factor"]), None)
        if m is None or not m.get("speedup") or not r["speedup"]:
            continue
        out.append({"ratio": r["ratio"], "echo_factor": r["echo_factor"], "modelled": m["speedup"]["mean"],
                    "measured": r["speedup"]["mean"], "measured_over_modelled": r["speedup"]["mean"] /
                    m["speedup"]["mean"], "modelled_wall_s": m["wall_time_to_target_s"]["mean"],
                    "measured_wall_s": r["wall_time_to_target_s"]["mean"]})
    return out


def table(rows: list[dict]) -> str:
    def ci(stat, digits=0, scale=1.0):
        if not stat or stat.get("mean") is None:
            return "-"
        half = f" ± {stat['ci95'] * scale:.{digits}f}" if stat.get("ci95") is not None else ""
        return f"{stat['mean'] * scale:,.{digits}f}{half}"
    lines = ["| R | e | reached | R read (probe) | R over the run (e = 1) | step ms | wall s to target | "
             "fresh examples to target (k) | speed-up over e = 1 | mean e |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        e = "AutoEcho" if r["echo_factor"] == "auto" else f"{float(r['echo_factor']):g}"
        lines.append(f"| {r['ratio']:g} | {e} | {r['reached']}/{r['n']} | {ci(r['probe_ratio'], 2)} | "
                     f"{ci(r['run_ratio'], 2)} | {ci(r['step_ms'])} | {ci(r['wall_time_to_target_s'])} | "
                     f"{ci(r['fresh_examples_to_target'], 1, 1e-3)} | {ci(r['speedup'], 2)} | "
                     f"{ci(r['mean_echo_factor'], 2)} |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- Main
def tuned_specs(cfg: SweepConfig) -> dict[str, RunSpec]:
    """e = 1 and each fixed factor at the learning rate and budget echo_target tuned on seed 0."""
    path = RESULTS / "echo_target.json"
    specs = json.loads(path.read_text())["specs"]
    return {k: RunSpec(**{f: v for f, v in s.items() if f in RunSpec.__dataclass_fields__}) for k, s in specs.items()}


def sweep_config(data: str, value_every: int | None) -> SweepConfig:
    """The experiment's settings. The runs to make are chosen by --seeds, --ratios and
    --factors, and each run's journal key names its R and seed; cfg.seeds and cfg.ratios are
    read by nothing here. They stay at the values of the first journals (echo_link*.runs.jsonl),
    so that the journal's digest of the settings, and with it every finished run, holds
    whichever seeds and R a command picks."""
    return SweepConfig.at_target(data, seeds=3, ratios=(2.0, 4.0),
                                 **({} if value_every is None else {"value_every": value_every}))


def parse_seeds(text: str) -> list[int] | None:
    """``--seeds``: a count N (seeds 0 to N - 1), or seeds and ranges ('3-5', '0,2,7-8');
    None when it is neither (or empty, or holds a negative seed)."""
    try:
        if text.strip().isdigit():
            n = int(text)
            return list(range(n)) if n >= 1 else None
        seeds: list[int] = []
        for part in text.split(","):
            first, _, last = part.strip().partition("-")
            lo, hi = int(first), int(last or first)
            if lo < 0 or hi < lo:
                return None
            seeds += [s for s in range(lo, hi + 1) if s not in seeds]
        return seeds or None
    except ValueError:
        return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_data_argument(ap)
    ap.add_argument("--seeds", default="3", help="seeds: a count N (seeds 0 to N - 1) or a list and ranges such as "
                                                 "'3-5' or '0,2' (default 3)")
    ap.add_argument("--ratios", default="2,4", help="upstream ratios R, comma-separated (default 2,4); at R <= 1 "
                                                    "only e = 1 and AutoEcho run (the no-harm check)")
    ap.add_argument("--factors", default="1,2,4,auto", help="echo factors (default 1,2,4,auto)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    ap.add_argument("--prefetch", type=int, default=4, help="shards read ahead (default 4)")
    ap.add_argument("--shard-kb", type=int, default=384, help="shard size, KiB (default 384: about 128 images)")
    ap.add_argument("--shards", default=os.path.join(os.environ.get("HASTEN_CACHE", "~/.cache/hasten"),
                                                     "echo-link"), help="where the packed shards are kept")
    ap.add_argument("--value-every", type=int, default=None,
                    help="AutoEcho measures the repeat value every this many steps (default: the recipe's, "
                         "SweepConfig.value_every; 0: the constant)")
    ap.add_argument("--pipeline", choices=sorted(UPSTREAMS), default="keys",
                    help="keys: fresh examples through ShardLoader into the sweep's echo stage on training keys "
                         "(as the modelled runs); stage: hasten's whole pipeline, EchoStage after ShardLoader "
                         "(default keys)")
    ap.add_argument("--smoke", action="store_true", help="a tiny functional run (one seed, R = 2, e = 1 and "
                                                          "AutoEcho, a few steps, a low target); writes no results")
    add_journal_arguments(ap, str(RESULTS / "echo_link.json"))
    args = ap.parse_args()
    if args.markdown:
        report = json.loads(Path(args.markdown).read_text())
        print(table(report["summary"]))
        print()
        ratios_in = sorted({r["ratio"] for r in report["summary"]})
        print(goals_lines(goals(report["summary"], ratios_in, report["runs"])))  # (older JSONs too)
        return 0
    # A stop (SIGTERM) unwinds the with-blocks: the namespaces and the server go with the run.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    seeds = parse_seeds(args.seeds)
    if seeds is None:
        ap.error(f"--seeds takes a count or a list of seeds and ranges (3, 0-2, 0,4); got {args.seeds!r}")
    if args.threads < 1 or args.prefetch < 1 or args.shard_kb < 4 or (args.value_every or 0) < 0:
        ap.error("--threads and --prefetch must be >= 1, --shard-kb >= 4, --value-every >= 0")
    if os.geteuid() != 0:
        ap.error("needs root: network namespaces and tc shape the link to the shard server")
    require_data(args.data, "echo_link")
    torch.set_num_threads(args.threads)
    try:
        ratios = [float(r) for r in args.ratios.split(",")]
        factors = [f if f == "auto" else float(f) for f in args.factors.split(",")]
    except ValueError:
        ap.error(f"--ratios takes numbers, --factors numbers or 'auto'; got {args.ratios!r}, {args.factors!r}")
    if any(r <= 0 for r in ratios) or any(f != "auto" and f < 1 for f in factors) or 1.0 not in factors:
        ap.error("ratios must be > 0 and echo factors >= 1, with 1 among them (the speed-ups are over it)")
    cfg = sweep_config(args.data, args.value_every)
    if args.smoke:
        cfg = replace(cfg, target=0.15, test_images=500, epochs=0.3, eval_points=(0.5, 1.0), seeds=1)
        ratios, factors, seeds, args.out = [2.0], [1.0, "auto"], [0], "/dev/null"
        args.journal = os.devnull
    specs = tuned_specs(cfg)
    if args.smoke:
        specs = {k: replace(s, steps=cfg.steps) for k, s in specs.items()}
    base = specs["1.0"]
    journal = open_journal(args, cfg) if not args.smoke else None
    data = load_data(cfg)
    shard_dir, index_of = shards_for(args.data, Path(args.shards).expanduser(), args.shard_kb)
    from hasten.stream.remote_store import RemoteShards

    # At R <= 1 echoing cannot pay: only e = 1 and AutoEcho, which must stay at e = 1 for free.
    jobs = [(ratio, e) for ratio in ratios for e in factors if ratio > 1 or e in (1.0, "auto")]
    bar = progress(total=len(jobs) * len(seeds), desc="echo over a link", unit="run")
    runs: list[dict] = []
    with MeasuredConditions("cpu", argv=sys.argv) as cond, Link(shard_dir) as link:
        store = RemoteShards(link.url, "train", connections=args.prefetch)
        for i, (ratio, e) in interleaved(jobs, len(seeds), seed=0):
            seed = seeds[i]
            spec = replace(base, echo="auto", seed=seed) if e == "auto" else replace(specs[str(e)], seed=seed)
            # "upstream": runs before the source read through ShardLoader (its own decode thread) do not count.
            key = json.dumps({"ratio": ratio, "spec": spec.__dict__, "prefetch": args.prefetch,
                              "upstream": UPSTREAMS[args.pipeline],
                              "shard_kb": args.shard_kb, "target": cfg.target, **auto_settings(cfg, spec)},
                             sort_keys=True)

            def go(spec=spec, ratio=ratio) -> dict:
                return one_run(cfg, data, store, index_of, link, spec, ratio, args)
            result = journal.run(key, go) if journal is not None else go()
            runs.append(result)
            bar.update(1)
            brief = _brief(result)
            print(f"R={ratio:g} e={e} seed={seed}: {brief}, probe R {result['probe_ratio']:.2f}, "
                  f"wall to target {result['wall_time_to_target_s']}", flush=True)
            if not args.smoke:
                write_report(args, cfg, cond, runs, ratios, factors)
        bar.close()
    if args.smoke:
        ok = all(r["steps"] > 0 and r["fresh_examples"] > 0 for r in runs)
        print("smoke:", "ok" if ok else "FAILED")
        return 0 if ok else 1
    rows = write_report(args, cfg, cond, runs, ratios, factors)  # again, with the conditions after the last run
    print(table(rows))
    print(cond.summary())
    print(goals_lines(goals(rows, ratios, runs)))
    return 0


def write_report(args, cfg: SweepConfig, cond, runs: list[dict], ratios, factors) -> list[dict]:
    """The results JSON, rewritten after every run (a stopped run keeps what it measured);
    returns its summary rows."""
    rows = summarize(runs, ratios, factors)
    write_json(Path(args.out), {
        "benchmark": "echo_link", "conditions": cond.as_dict(), "dataset": "CIFAR-10-JPEG", "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(), "config": {**cfg.__dict__, "data": os.path.basename(cfg.data)},
        "link": {"server": "RangeHTTPServer in a network namespace",
                 "shaping": "tc htb rate on the server's veth; no added latency (no sch_netem on this kernel)",
                 "client": "hasten RemoteShards (obstore), no cache", "prefetch_shards": args.prefetch,
                 "upstream": ("hasten.recipes.echo.shard_source over ShardLoader" if args.pipeline == "keys"
                              else "EchoStage over ShardLoader (train_budget(stream=...))"),
                 "shard_kb": args.shard_kb},
        "runs": runs, "summary": rows, "goals": goals(rows, ratios, runs), "against_model": against_model(rows)})
    return rows


if __name__ == "__main__":
    sys.exit(main())
