"""The terminal report, the JSON and the PNG from one analysis."""

from hasten.profile.report import format_report, plot_timeline, results_json
from hasten.profile.verdict import analyse

REQUIRED = {"verdict", "step_time_s", "data_wait_fraction", "compute_fraction", "comm_fraction", "upstream_ratio",
            "ranks", "device", "recommendations"}


def _analysis():
    recs = [{"wait_s": 0.030, "work_s": 0.010, "cpu_s": 0.001} for _ in range(6)]
    rank = {"rank": 0, "world_size": 1, "device": "cpu", "num_workers": 0, "batch_size": 16, "dataset_len": 64,
            "batch_bytes": 1024, "cpu_count": 2, "warmup": 2,
            "records": {"measure": recs, "step_alone": [{**r, "wait_s": 0.0} for r in recs]},
            "loader_probe": {"batch_s": 0.030, "main_cpu_s": 0.0, "worker_cpu_s": None},
            "ddp": False, "grad_bytes": 0, "allreduce_times": []}
    return analyse([rank])


def test_report_reads_verdict_first_then_bar_then_fixes():
    lines = format_report(_analysis()).splitlines()
    assert lines[0].startswith("hasten profile: INPUT-BOUND (high)")
    assert "[" + "#" * 30 + "=" * 10 + "]" in lines[1]  # 75% data wait of a 40-char bar
    assert "R = 3.00" in lines[2]
    assert any(line.lstrip().startswith("1. ") for line in lines)


def test_json_has_the_documented_fields():
    d = results_json(_analysis(), ["python", "train.py"], {"torch": "x"})
    assert REQUIRED <= d.keys()
    for rec in d["recommendations"]:
        assert {"fix", "how", "predicted_speedup", "verified_speedup"} <= rec.keys()
        assert rec["verified_speedup"] is None


def test_timeline_png_is_written(tmp_path):
    path = plot_timeline(_analysis(), tmp_path / "t.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
