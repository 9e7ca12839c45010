"""benchmarks/echo_link.py's choice of runs and its goals (issue 44), without the link: the
seeds flag, the journal's digest that holds whichever seeds and R a command picks, and
AutoEcho over the best fixed factor (over e = 1 at R <= 1) with its interval over seeds."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import echo_link  # noqa: E402

from hasten.stats import mean_ci  # noqa: E402


@pytest.mark.parametrize("text, seeds", [("3", [0, 1, 2]), ("1", [0]), ("3-5", [3, 4, 5]), ("0,2", [0, 2]),
                                         ("0-1,5", [0, 1, 5]), ("4-4", [4]), ("1,1", [1])])
def test_seeds_are_a_count_or_a_list_of_seeds_and_ranges(text, seeds):
    assert echo_link.parse_seeds(text) == seeds


@pytest.mark.parametrize("text", ["0", "", "a", "5-3", "-1", "1,,2", "2.5"])
def test_bad_seeds_are_refused(text):
    assert echo_link.parse_seeds(text) is None


def _run(ratio, e, seed, wall, step=0.16):
    return {"nominal_ratio": ratio, "echo_factor": e, "seed": seed, "reached_target": True,
            "wall_time_to_target_s": wall, "calibration_step_s": step, "probe_ratio": ratio, "upstream_ratio": None,
            "step_time_s": step, "fresh_examples_to_target": 1, "steps_to_target": 1, "idle_fraction": 0.1,
            "mean_echo_factor": 1.0, "repeat_value_measured": None}


def test_goals_are_autoecho_over_the_best_fixed_factor_per_seed_and_over_e1_where_echo_cannot_pay():
    walls = {  # R -> e -> wall seconds per seed 0, 1, 2
        2.0: {1.0: [200, 220, 210], 2.0: [100, 120, 110], 4.0: [110, 118, 100], "auto": [105, 125, 115]},
        4.0: {1.0: [400, 420, 410], 2.0: [220, 240, 230], 4.0: [120, 130, 125], "auto": [150, 140, 125]},
        1.0: {1.0: [100, 110, 105], "auto": [101, 110, 104]},
    }
    runs = [_run(r, e, s, w) for r, by_e in walls.items() for e, ws in by_e.items() for s, w in enumerate(ws)]
    ratios = [1.0, 2.0, 4.0]
    rows = echo_link.summarize(runs, ratios, [1.0, 2.0, 4.0, "auto"])
    g = {e["ratio"]: e for e in echo_link.goals(rows, ratios, runs)["per_ratio"]}
    # R = 4: e = 4 is the best; AutoEcho over it per seed, e = 4's wall over AutoEcho's.
    assert g[4.0]["best_fixed_e"] == "4.0"
    expect = mean_ci([120 / 150, 130 / 140, 125 / 125])
    assert g[4.0]["autoecho_vs_best"]["raw"]["mean"] == pytest.approx(expect["mean"])
    assert g[4.0]["autoecho_vs_best"]["raw"]["ci95"] == pytest.approx(expect["ci95"])
    assert g[4.0]["autoecho_goal_met"] == (expect["mean"] >= 0.9) and g[4.0]["best_fixed_goal_met"]
    # R = 2: the best by mean speed-up is e = 4 (1.93x) over e = 2 (1.91x).
    assert g[2.0]["best_fixed_e"] == "4.0"
    # R = 1: no fixed factor is run or compared; AutoEcho over e = 1.
    assert "autoecho_vs_best" not in g[1.0]
    assert g[1.0]["autoecho_vs_e1"]["raw"]["mean"] == pytest.approx(mean_ci([100 / 101, 1.0, 105 / 104])["mean"])
    assert g[1.0]["autoecho_no_harm_goal_met"]
    text = echo_link.goals_lines(echo_link.goals(rows, ratios, runs))
    assert "R = 1: AutoEcho / e = 1" in text and "R = 4: AutoEcho / the best fixed factor (e = 4)" in text


def test_the_journal_keys_fixed_runs_as_before_and_autoecho_runs_by_its_rule():
    # The committed journal (echo_link_stage.runs.jsonl) was written with --seeds 3 --ratios 2,4;
    # a command that adds R = 1 or seeds 3-5 must reuse its fixed-factor runs: the digest is of
    # the settings, which hold seeds 3 and ratios (2, 4) whatever the flags.
    import json

    from hasten.echo.auto import rule_digest
    from hasten.recipes.echo.config import RunSpec
    from hasten.recipes.echo.sweep import auto_settings

    cfg = echo_link.sweep_config("x", None)
    assert (cfg.seeds, cfg.ratios, cfg.value_every) == (3, (2.0, 4.0), 8)
    assert echo_link.sweep_config("x", 32).value_every == 32
    assert auto_settings(cfg, RunSpec(echo=4.0)) == {}  # fixed factors: keyed as before
    assert auto_settings(cfg, RunSpec(echo="auto")) == {"value_every": 8, "autoecho_rule": rule_digest()}
    # The committed journal's AutoEcho runs have no rule digest in their keys: rerun, not reused.
    journal = Path(echo_link.__file__).parent / "results" / "echo_link_stage.runs.jsonl"
    if journal.is_file():
        keys = [json.loads(json.loads(line)["key"]) for line in journal.read_text().splitlines()]
        assert all("autoecho_rule" not in k for k in keys)


def test_the_rule_digest_follows_the_rules_source(monkeypatch, tmp_path):
    import hasten.echo.auto as auto_module

    before = auto_module.rule_digest()
    assert len(before) == 16 and before == auto_module.rule_digest()
    assert "factor_rule.py" in auto_module.RULE_FILES
    for name in auto_module.RULE_FILES:
        (tmp_path / name).write_bytes((Path(auto_module.__file__).parent / name).read_bytes())
    monkeypatch.setattr(auto_module, "__file__", str(tmp_path / "auto.py"))
    assert auto_module.rule_digest() == before
    (tmp_path / "repeat_value.py").write_text((tmp_path / "repeat_value.py").read_text() + "\n# changed\n")
    assert auto_module.rule_digest() != before


def test_the_summary_gives_each_runs_step_over_its_calibration_and_autoechos_measurements():
    """Issue 44: AutoEcho's runs stepped 20% slower than the fixed factors' because the machine
    was (their calibrations too); the summary shows the step in calibrations, and how many
    repeat-value measurements AutoEcho made."""
    runs = [_run(2.0, 1.0, 0, 200, step=0.15),
            {**_run(2.0, "auto", 0, 120, step=0.15), "step_time_s": 0.18, "repeat_value_measurements": 20}]
    rows = {r["echo_factor"]: r for r in echo_link.summarize(runs, [2.0], [1.0, "auto"])}
    assert rows["auto"]["step_over_calibration"]["mean"] == pytest.approx(1.2)
    assert rows["1.0"]["step_over_calibration"]["mean"] == pytest.approx(1.0)
    assert rows["auto"]["value_measurements"]["values"] == [20]
    assert rows["1.0"]["value_measurements"]["n"] == 0  # a fixed factor measures nothing
