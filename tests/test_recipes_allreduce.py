"""hasten.recipes.allreduce: configuration, cost-model fit and statistics on known timings, the report."""

import pytest

from hasten.distributed.cost_model import Network, predict
from hasten.errors import ConfigError
from hasten.harness.collectives import BenchConfig, RankTimings
from hasten.recipes.allreduce import AllreduceConfig, fit_links, format_table, human, run, summarize


def test_config_resolves_the_grid_at_construction():
    assert AllreduceConfig(world=6).grid == (2, 3)
    assert AllreduceConfig(world=8, network="emulated", inter_gbit=0.25, local_size=4).grid == (2, 4)
    assert AllreduceConfig(world=6, grid="3x2").grid == (3, 2)
    with pytest.raises(ConfigError, match="grid 3x3 holds 9 ranks but the group has 4"):
        AllreduceConfig(grid="3x3")


@pytest.mark.parametrize("changes, message", [
    ({"sizes": ()}, "at least one"), ({"sizes": (6,)}, "multiples of 4"), ({"algos": ("tree",)}, "among native"),
    ({"world": 0}, "world must be >= 1"), ({"iters": 0}, "iters"), ({"network": "wifi"}, "network"),
    ({"inter_gbit": 0.25}, "go together"), ({"inter_gbit": 0.25, "local_size": 2}, "emulated"),
    ({"link_gbit": 0.0}, "positive"), ({"timeout_s": 0}, "timeout"),
])
def test_config_rejects_bad_values(changes, message):
    with pytest.raises(ConfigError, match=message):
        AllreduceConfig(**changes)


def test_harness_accepts_exactly_the_hook_algorithms():
    assert BenchConfig(("native", "ring", "torus", "naive"), (4,)).algos == ("native", "ring", "torus", "naive")
    with pytest.raises(ValueError, match="tree"):
        BenchConfig(("tree",), (4,))


def _timings(world_alpha=1e-4, beta=8e-9, gamma=1e-10):
    sizes = (4, 1 << 16, 1 << 20)
    # Exact ping-pong times t = alpha + k beta: the fit must give beta back.
    pingpong = {"link": [2e-5 + k * beta for k in sizes]}
    times = {("ring", 4096): [0.001, 0.003], ("native", 4096): [0.002]}
    return RankTimings(sizes, pingpong, world_alpha, gamma, times)


def test_fit_links_recovers_a_known_link():
    links, calibration = fit_links(_timings())
    link = links["link"]
    assert link.beta == pytest.approx(8e-9) and link.alpha == 1e-4 and link.gamma == 1e-10
    assert calibration["link"]["gbit_per_s"] == pytest.approx(1.0)  # 8e-9 s per byte = 1 Gbit/s
    assert calibration["link"]["pingpong_alpha_s"] == pytest.approx(2e-5)
    assert calibration["gamma_s_per_byte"] == 1e-10


def test_summary_statistics_and_predictions_on_known_times():
    cfg = AllreduceConfig(world=4, sizes=(4096,), algos=("ring", "native"))
    links, _ = fit_links(_timings())
    rows = {r["algo"]: r for r in summarize(_timings(), cfg, links)}
    ring = rows["ring"]
    assert ring["n"] == 2 and ring["time_s"] == pytest.approx(0.002) and ring["time_std_s"] == pytest.approx(0.001 * 2 ** 0.5)
    assert ring["algbw_gbps"] == pytest.approx(4096 / 0.002 / 1e9)
    assert ring["busbw_gbps"] == pytest.approx(ring["algbw_gbps"] * 2 * 3 / 4)
    assert ring["predicted_time_s"] == pytest.approx(predict("ring", 4096, 4, Network(links["link"]), (2, 2)))
    assert rows["native"]["time_std_s"] == 0.0  # one time: no spread
    table = format_table(list(rows.values()))
    assert "4K" in table and "2.000" in table


def test_human_sizes():
    assert [human(n) for n in (4096, 3 << 20, 1 << 30, 100, 1536)] == ["4K", "3M", "1G", "100B", "1536B"]


@pytest.mark.multiproc
def test_run_on_one_rank_reports_without_a_link_model():
    report = run(AllreduceConfig(world=1, sizes=(4096,), algos=("ring", "native"), iters=2, warmup=0))
    assert report["world_size"] == 1 and report["network"] == {"kind": "loopback"} and report["grid"] == [1, 1]
    assert set(report["calibration"]) == {"gamma_s_per_byte"}  # no peer to ping-pong with
    for r in report["results"]:
        assert r["n"] == 2 and r["time_s"] > 0 and r["busbw_gbps"] == 0.0 and r["predicted_time_s"] is None
