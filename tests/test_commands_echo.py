"""``hasten echo`` end to end on a tiny image folder: real training to a target."""

import json

import numpy as np
import pytest
import torch
from PIL import Image

from hasten.cli import main
from hasten.commands.echo import format_table, summarize
from hasten.recipes.echo import EchoRunConfig, EvalSet, train_to_target
from hasten.stream.records import open_records


@pytest.fixture(scope="module")
def colours(tmp_path_factory):
    """Two classes a small network separates in a few steps: reddish and bluish noise."""
    root = tmp_path_factory.mktemp("colours")
    rng = np.random.default_rng(0)
    for split, n in (("train", 96), ("test", 24)):
        for label, name in enumerate(("red", "blue")):
            (root / split / name).mkdir(parents=True)
            for i in range(n):
                img = rng.integers(0, 120, (16, 16, 3), dtype=np.uint8)
                img[..., 0 if label == 0 else 2] += 120
                Image.fromarray(img).save(root / split / name / f"{i:03d}.png")
    return root


@pytest.fixture
def one_thread():
    """As ``hasten echo --threads 1``: on 2 shared cores a second torch thread slows small steps down."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_echo_run_reaches_target_and_counts(colours, one_thread):
    eval_set = EvalSet(open_records(colours, "test"), 16, "cpu")
    base = train_to_target(EchoRunConfig(data=str(colours), echo=1.0, target=0.9), eval_set=eval_set)
    echoed = train_to_target(EchoRunConfig(data=str(colours), echo=3.0, target=0.9), eval_set=eval_set)
    for r in (base, echoed):
        assert r["reached_target"] and r["final_accuracy"] >= 0.85
        assert r["steps_to_target"] % 10 == 0  # evaluated every 10 steps
    # Echoing: ~3 items per fresh example (floor/ceil of 3 is exactly 3).
    assert echoed["steps_to_target"] * 64 >= 2.5 * echoed["fresh_examples_to_target"] - 64 * 5
    assert base["fresh_examples_to_target"] >= base["steps_to_target"] * 64 - 64


def test_cli_single_run_writes_json(colours, tmp_path, capsys, one_thread):
    out = tmp_path / "echo.json"
    rc = main(["echo", "--data", str(colours), "--echo", "2", "--variant", "batch", "--upstream-delay", "0.0002",
               "--target", "0.9", "--json", str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    assert data["baseline"] and len(data["results"]) == 2
    for entry in data["results"]:
        for key in ("variant", "echo_factor", "upstream_ratio", "fresh_examples_to_target", "steps_to_target",
                    "wall_time_to_target_s", "final_accuracy", "idle_fraction"):
            assert key in entry
    assert {e["echo_factor"] for e in data["results"]} == {1.0, 2.0}
    assert data["results"][0]["upstream_ratio"] >= 1 and data["results"][0]["storage_ratio"] > 0
    assert data["results"][1]["upstream_ratio"] == data["results"][0]["upstream_ratio"]
    assert "speedup" in capsys.readouterr().out


@pytest.mark.parametrize("argv,match", [
    (["--echo", "0.5"], ">= 1"), (["--echo", "fast"], "'auto' or a number"),
    (["--variant", "sideways"], "example-before, example-after, batch"), (["--target", "1.5"], "target"),
])
def test_cli_bad_options_one_line_exit_2(colours, argv, match, capsys):
    assert main(["echo", "--data", str(colours), *argv]) == 2
    err = capsys.readouterr().err
    assert match in err and "Traceback" not in err


def test_summary_speedup_is_relative_to_same_group():
    def entry(group, echo, wall, fresh):
        return {"group": group, "variant": "batch", "echo_factor": echo, "reached_target": True, "storage_ratio": 1,
                "fresh_examples_to_target": fresh, "steps_to_target": 10, "wall_time_to_target_s": wall,
                "final_accuracy": 0.5, "idle_fraction": 0.1, "upstream_ratio": 4.0, "mean_echo_factor": echo}

    rows = summarize([entry("R=4", 1.0, 8.0, 100), entry("R=4", 4.0, 2.0, 50), entry("R=2", 1.0, 4.0, 100),
                      entry("R=2", 4.0, 4.0, 50)])
    speed = {(r["group"], r["echo_factor"]): r["speedup"] for r in rows}
    assert speed[("R=4", "4.0")] == pytest.approx(4.0) and speed[("R=2", "4.0")] == pytest.approx(1.0)
    assert "4.00x" in format_table(rows)


def test_sweep_plan_covers_the_papers_two_findings():
    from hasten.commands.echo import _sweep_a_jobs, _sweep_b_jobs

    base = EchoRunConfig(data="x")
    a = _sweep_a_jobs(base)
    assert {(c.variant, c.echo) for _, c in a[1:]} == {(v, e) for v in ("example-before", "example-after", "batch")
                                                       for e in (2.0, 4.0, 6.0)}
    assert all(c.upstream_delay_s == 0 for _, c in a)
    b = _sweep_b_jobs(base, step_s=0.064, batch=64)  # 1 ms per example = R 1
    delays = {g: c.upstream_delay_s for g, c in b}
    assert delays == pytest.approx({"R=2": 0.002, "R=4": 0.004, "R=6": 0.006, "R<1": 0.0})
    assert {c.echo for g, c in b if g == "R=6"} == {1.0, 2.0, 4.0, 6.0, "auto"}
