"""The speedrun (with the peer) and the ablation ladder on the GPU, through the recipe's
own run function ``hasten.recipes.speedrun.train_run`` (what ``hasten speedrun`` times
for each run: the same code path and timing rules), with what the data gives
computed once for the whole suite (channel statistics, FLOPs per recipe: ``Context``).

speedrun: the jobs are hasten's presets (``preset+compile``: the same with
``torch.compile``, as airbench94_compiled is to airbench94) and the peer (airbench
0.1.8's ``train94`` in a process of its own, ``gpu.peer``). Each job gets one untimed
full run first (it covers every graph the timed runs use: all epochs, the whitening
bias freezing, the TTA evaluation, the compiled model where the preset compiles), then
the jobs run in rounds, one run of each per round in a freshly shuffled order, so that
drift on the machine spreads over all of them. Every run is written to the section's
JSON as it ends; a job that fails (the compile variant, the peer) is recorded with
its error and the others go on; the time left is checked before every warm-up (a
compiling job is charged ``compile_s`` more) and before every round. Means come with
95% intervals (Student t); hasten against the peer also per round (paired).

ablation: the ladder of the first preset, each repeat one run of every rung in a
shuffled order (seed = repeat), to the peer's mean accuracy on this copy of the data;
the time left is checked before the warm-up and before every run.
"""

from __future__ import annotations

import dataclasses
import random
import time

from _common import mean_ci, paired_differences, paired_ratios
from gpu.peer import PeerProcess, prepare_peer
from gpu.plan import pm
from hasten.errors import ConfigError
from hasten.recipes import speedrun as recipe
from hasten.timing import interleaved

TIMED = ("timed (hasten.recipes.speedrun.train_run): loader set-up (normalisation and padding on the device), "
         "whitening set-up, every training step, the final TTA evaluation; untimed: decoding, copying the uint8 "
         "data to the device, building the network, the warm-up, validation")
WARMUP_SEED = 10_000  # the warm-up run's seed: the timed runs keep seeds 0..n-1, as `hasten speedrun --runs n`
PEER_NAME = "peer"


def build(ctx, name: str) -> tuple[str, recipe.Recipe]:
    """``preset`` or ``preset+compile`` (the preset with ``torch.compile``, as
    airbench94_compiled is to airbench94): the preset's name and its recipe."""
    preset, _, extra = name.partition("+")
    if extra not in ("", "compile"):
        raise ConfigError(f"unknown speedrun variant {name!r}: a preset, or a preset followed by +compile")
    changes = {**ctx.sizes.recipe_changes, **({"compile": True} if extra else {})}
    return preset, recipe.build_recipe(preset, **changes)


def _result(r: recipe.RunResult, seed: int) -> dict:
    return {"seed": seed, "tta_accuracy": r.tta_accuracy, "accuracy": r.accuracy, "time_s": r.time_s,
            "cpu_time_s": r.cpu_time_s}


class HastenJob:
    """One of hasten's presets: ``warm`` (untimed), then ``run(i)`` with seed i."""

    def __init__(self, ctx, name: str):
        self.ctx, self.name = ctx, name
        self.preset, self.recipe = build(ctx, name)
        self.compiles = self.recipe.compile

    def warm(self) -> dict:
        ctx = self.ctx
        recipe.warm_up([self.recipe], ctx.dataset(), ctx.device, ctx.mean_std(), seed=WARMUP_SEED)
        t0 = time.perf_counter()  # the full run alone: what a timed run will take (compiling is done)
        result = _result(self._train(WARMUP_SEED), WARMUP_SEED)
        return {**result, "wall_s": time.perf_counter() - t0}

    def run(self, i: int) -> dict:
        return _result(self._train(i), i)

    def _train(self, seed: int) -> recipe.RunResult:
        ctx = self.ctx
        return recipe.train_run(self.recipe, ctx.dataset(), ctx.device, mean_std=ctx.mean_std(), seed=seed)


class PeerJob:
    """airbench's ``train94`` served by ``PeerProcess``: run 0 is the warm-up, run i + 1 the i-th."""

    name, compiles = PEER_NAME, False

    def __init__(self, ctx, process: PeerProcess):
        self.ctx, self.process = ctx, process

    def warm(self) -> dict:
        return self.process.run(0, timeout_s=self._timeout())

    def run(self, i: int) -> dict:
        return self.process.run(i + 1, timeout_s=self._timeout())

    def _timeout(self) -> float | None:
        return max(self.ctx.time_left(), 30.0) if self.ctx.enforce_budgets else None


def run_jobs(ctx, jobs: list, runs: int, rec: dict) -> None:
    """Warm every job up, then ``runs`` rounds of one run of each, interleaved; ``rec["jobs"]``
    and ``rec["order"]`` grow as runs end, each written at once (``ctx.checkpoint``)."""
    longest_warmup, estimate, live = 0.0, {}, []
    for job in jobs:
        row = rec["jobs"][job.name]
        need = longest_warmup + (ctx.sizes.compile_s if job.compiles else 0.0)
        if not ctx.can_start(need):
            row.update(status="skipped", skipped=f"budget: {ctx.time_left():.0f} s left, its warm-up needs about "
                                                 f"{need:.0f} s")
            ctx.say(f"  {job.name}: skipped ({row['skipped']})")
            continue
        t0 = time.perf_counter()
        try:
            row["warmup_run"] = job.warm()
        except Exception as exc:  # noqa: BLE001 - this job's failure; the others keep their runs
            row.update(status="error", error=f"warm-up: {type(exc).__name__}: {exc}")
            ctx.say(f"  {job.name}: error in the warm-up: {type(exc).__name__}: {exc}")
            ctx.checkpoint(rec)
            continue
        wall = time.perf_counter() - t0
        row["warmup_wall_s"] = wall
        longest_warmup = max(longest_warmup, wall)
        estimate[job.name] = row["warmup_run"].get("wall_s", wall)
        row["status"] = "ok"
        live.append(job)
        ctx.say(f"  {job.name}: warmed up in {wall:.1f} s")
        ctx.checkpoint(rec)
    rng = random.Random(0)
    for rnd in range(runs):
        if not live:
            break
        need = sum(estimate[j.name] for j in live)
        if not ctx.can_start(need):
            rec["cut_short"] = True
            ctx.say(f"  budget: {ctx.time_left():.0f} s left, a round needs about {need:.0f} s: stopping after "
                    f"{rnd} rounds")
            break
        order = live[:]
        rng.shuffle(order)
        for job in order:
            row = rec["jobs"][job.name]
            t0 = time.perf_counter()
            try:
                result = job.run(rnd)
            except Exception as exc:  # noqa: BLE001 - recorded; its finished runs and the other jobs stay
                row.update(status="error", error=f"run {rnd}: {type(exc).__name__}: {exc}")
                live.remove(job)
                ctx.say(f"  {job.name}: error in run {rnd}: {type(exc).__name__}: {exc}")
                ctx.checkpoint(rec)
                continue
            wall = time.perf_counter() - t0
            estimate[job.name] = wall
            row["runs"].append({**result, "round": rnd, "wall_s": wall})
            rec["order"].append([rnd, job.name])
            ctx.say(f"  round {rnd} {job.name:<20} {result['tta_accuracy']:.4f} in {result['time_s']:.2f} s "
                    f"(wall {wall:.1f} s)")
            ctx.checkpoint(rec)


def _summary(row: dict) -> None:
    runs = row["runs"]
    row["n_runs"] = len(runs)
    row["accuracy"] = mean_ci([r["tta_accuracy"] for r in runs])
    row["time_s"] = mean_ci([r["time_s"] for r in runs])
    if runs and "accuracy" in runs[0]:
        row["accuracy_no_tta"] = mean_ci([r["accuracy"] for r in runs])


def comparison(hasten_runs: list[dict], peer_runs: list[dict]) -> dict:
    """hasten against the peer over the rounds both ran, paired by round: accuracy
    difference in points and time ratio, each a mean with its 95% interval."""
    def by_round(runs, key, scale=1.0):
        return {r["round"]: scale * r[key] for r in runs}

    return {"accuracy_delta_pt": mean_ci(paired_differences(by_round(hasten_runs, "tta_accuracy", 100),
                                                            by_round(peer_runs, "tta_accuracy", 100))),
            "time_ratio": mean_ci(paired_ratios(by_round(hasten_runs, "time_s"), by_round(peer_runs, "time_s")))}


def speedrun(ctx) -> dict:
    import speedrun as speedrun_benchmark  # benchmarks/speedrun.py: the same matmul-rate measurement

    s = ctx.sizes
    data = ctx.dataset()
    ctx.mean_std()
    recipe.configure_device(ctx.device)
    jobs = [HastenJob(ctx, name) for name in s.speedrun_presets]
    if s.peer:
        peer_rec, where = prepare_peer(ctx)
    else:
        peer_rec, where = {"status": "skipped", "skipped": "not in this plan"}, None
    rec = {"data": data.name, "timed": TIMED, "n_planned": s.speedrun_runs, "cut_short": False,
           "warmup": "one untimed full run of each job (hasten: after the recipe's own short warm-up) before the "
                     "rounds; then one run of each job per round, in a shuffled order",
           "jobs": {j.name: {"kind": "hasten", "preset": j.preset, "status": "waiting", "runs": [],
                             "recipe": dataclasses.asdict(j.recipe)} for j in jobs},
           "order": []}
    rec["jobs"][PEER_NAME] = {"kind": "peer", "runs": [], **peer_rec}
    process = None
    try:
        if where is not None:
            try:
                process = PeerProcess(*where, ctx.say)
                rec["jobs"][PEER_NAME].update(process.info, status="waiting")
                jobs.append(PeerJob(ctx, process))
            except Exception as exc:  # noqa: BLE001 - the peer's failure; hasten's runs go on
                rec["jobs"][PEER_NAME].update(status="error", error=f"start: {type(exc).__name__}: {exc}")
        ctx.checkpoint(rec)
        run_jobs(ctx, jobs, s.speedrun_runs, rec)
    finally:
        if process is not None:
            process.close()
    rate, dtype = speedrun_benchmark.matmul_tflops(ctx.device, seconds=s.matmul_seconds)
    rec.update(device_matmul_tflops=rate, device_matmul_dtype=dtype)
    for job in jobs:
        row = rec["jobs"][job.name]
        _summary(row)
        if isinstance(job, HastenJob) and row["runs"]:
            flops = ctx.flops(job.recipe)
            row.update(flops_per_run=flops, achieved_tflops=flops / row["time_s"]["mean"] / 1e12)
            row["fraction_of_matmul_rate"] = row["achieved_tflops"] / rate
    first = rec["jobs"][jobs[0].name] if jobs else None
    peer = rec["jobs"][PEER_NAME]
    if peer.get("runs") and first and first["runs"]:
        rec["comparison"] = {
            "hasten": jobs[0].name, **comparison(first["runs"], peer["runs"]),
            "note": "per round: hasten minus peer (accuracy, points) and hasten / peer (time); mean and 95% interval"}
    errors = [f"{name}: {row['error']}" for name, row in rec["jobs"].items() if row.get("status") == "error"]
    if errors:
        rec.update(status="error", error="; ".join(errors))
    rec["headline"] = _headline(rec, jobs, dtype)
    return rec


def _headline(rec: dict, jobs: list, dtype: str) -> dict:
    parts = []
    for job in jobs:
        row = rec["jobs"][job.name]
        if row["runs"]:
            text = f"{job.name}: {pm(row['accuracy'], 100, '.2f')} % in {pm(row['time_s'], 1, '.2f')} s"
            if "fraction_of_matmul_rate" in row:
                text += f", {row['fraction_of_matmul_rate']:.0%} of {dtype} matmul"
            parts.append(text)
    peer = rec["jobs"][PEER_NAME]
    if not peer.get("runs"):
        parts.append(f"peer {peer.get('status')}: {peer.get('skipped') or peer.get('error') or 'no runs'}")
    if "comparison" in rec:
        c = rec["comparison"]
        parts.append(f"vs peer: time x{pm(c['time_ratio'], 1, '.3f')}, accuracy {pm(c['accuracy_delta_pt'], 1, '+.2f')} pt")
    n = min((rec["jobs"][j.name]["n_runs"] for j in jobs), default=0)
    return {"key": "; ".join(parts) or "no runs", "n": n, "spread": "± = 95% interval of the mean (Student t)"}


def ablation_target(ctx) -> tuple[float, str]:
    """The peer's mean accuracy on this copy; else hasten's own speedrun mean; else the default."""
    run = ctx.previous("speedrun")
    jobs = (run or {}).get("jobs", {})
    peer = jobs.get(PEER_NAME, {})
    if (peer.get("accuracy") or {}).get("mean") is not None:
        return peer["accuracy"]["mean"], "the peer's mean accuracy (speedrun section)"
    first = ctx.sizes.speedrun_presets[0]
    mine = jobs.get(first, {})
    if (mine.get("accuracy") or {}).get("mean") is not None:
        return mine["accuracy"]["mean"], f"hasten's {first} mean accuracy (speedrun section; no peer result)"
    return recipe.default_target(ctx.device), "hasten.recipes.speedrun.default_target (no peer or speedrun result)"


def ablation_run_estimate(ctx) -> float:
    """Seconds one rung's run may take, before any has run: the speedrun's longest run of the
    first preset (most rungs train faster, rung 0's host loader slower), else 0 (unknown)."""
    run = ctx.previous("speedrun")
    row = ((run or {}).get("jobs") or {}).get(ctx.sizes.speedrun_presets[0], {})
    walls = [r.get("wall_s", 0.0) for r in row.get("runs", [])]
    return max(walls, default=0.0)


def ablation(ctx) -> dict:
    data = ctx.dataset()
    mean_std = ctx.mean_std()
    preset, top = build(ctx, ctx.sizes.speedrun_presets[0])
    rungs = recipe.ladder_recipes(top)
    target, source = ablation_target(ctx)
    ctx.say(f"  ablation of {preset} to {target:.4f} ({source})")
    recipe.configure_device(ctx.device)
    repeats = ctx.sizes.ablation_repeats
    per_run = ablation_run_estimate(ctx)
    rec = {"preset": preset, "data": data.name, "target": target, "target_source": source,
           "epochs_budget": top.epochs, "n_planned": repeats, "cut_short": False, "orders": [],
           "runs": {name: [] for name, _ in rungs},
           "timed": TIMED + "; epochs and seconds to the target are read at the end of each epoch"}
    if not ctx.can_start(per_run):
        rec["cut_short"] = True
        rec["skipped_reason"] = f"budget: {ctx.time_left():.0f} s left, one rung's run takes about {per_run:.0f} s"
    else:
        t0 = time.perf_counter()
        recipe.warm_up([r for _, r in rungs], data, ctx.device, mean_std, seed=WARMUP_SEED)
        rec["warmup_s"] = time.perf_counter() - t0
        for rep in range(repeats):
            order = [name for _, (name, _) in interleaved(rungs, 1, seed=rep)]
            rec["orders"].append(order)
            by_name = dict(rungs)
            for name in order:
                if not ctx.can_start(per_run):
                    rec["cut_short"] = True
                    break
                t0 = time.perf_counter()
                r = recipe.train_run(by_name[name], data, ctx.device, mean_std=mean_std, seed=rep, target=target)
                per_run = max(per_run, time.perf_counter() - t0)
                rec["runs"][name].append({**_result(r, rep), "epochs_to_target": r.epochs_to_target,
                                          "time_to_target_s": r.time_to_target_s})
                ctx.checkpoint(rec)
            if rec["cut_short"]:
                break
    rows = []
    for name, _ in rungs:
        runs = rec["runs"][name]
        reached = [r for r in runs if r["epochs_to_target"] is not None]
        rows.append({"rung": name, "n_runs": len(runs), "reached": len(reached),
                     "epochs_to_target": mean_ci([r["epochs_to_target"] for r in reached]),
                     "time_to_target_s": mean_ci([r["time_to_target_s"] for r in reached]),
                     "final_accuracy": mean_ci([r["tta_accuracy"] for r in runs]),
                     "time_s": mean_ci([r["time_s"] for r in runs])})
    rec["rungs"] = rows
    top_row = rows[-1]
    n = min(r["n_runs"] for r in rows)
    rec["n_runs"] = n
    reached_rungs = sum(1 for r in rows if r["n_runs"] and r["reached"] == r["n_runs"])
    if not top_row["n_runs"]:
        key = f"no run of the top rung ({rec.get('skipped_reason', 'budget')})"
    elif top_row["reached"]:
        key = (f"{reached_rungs}/{len(rows)} rungs reach {target:.2%}; all tricks: "
               f"{pm(top_row['epochs_to_target'], 1, '.1f')} epochs, {pm(top_row['time_to_target_s'], 1, '.2f')} s")
    else:
        key = (f"{reached_rungs}/{len(rows)} rungs reach {target:.2%}; all tricks: not reached "
               f"({pm(top_row['final_accuracy'], 100, '.2f')} %)")
    rec["headline"] = {"key": key, "n": n, "spread": "± = 95% interval of the mean (Student t)"}
    return rec
