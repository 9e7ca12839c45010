"""hasten.recipes.echo.run behind slow storage read by decode worker processes (the CUDA preset
runs with workers): the storage they read is the one the run measures and pauses, and its
delay is a rate that the number of workers and the prefetch depth cannot multiply."""

import pytest

from hasten.recipes.echo import EchoRunConfig, EvalSet, train_to_target


@pytest.mark.multiproc
def test_forked_decode_workers_read_through_the_runs_storage(colours, one_thread):
    delay = 0.004
    cfg = EchoRunConfig(data=str(colours), echo=1.0, upstream_delay_s=delay, workers=2, target=0.999,
                        max_fresh=256, eval_every=2, eval_images=48)
    r = train_to_target(cfg, eval_set=EvalSet.of(str(colours), 16, "cpu"))
    # The storage's time per batch over the step time: measured 0.000 when the workers read
    # through copies of the storage that the parent never saw.
    assert r["storage_ratio"] == pytest.approx(delay * cfg.batch_size / r["step_time_s"], rel=0.05)
    # One example per `delay` seconds for both workers together (a prefetch of 4 chunks let
    # two workers read at twice the rate before): the loop waited for at least that.
    assert r["wall_time_s"] >= 0.9 * r["fresh_examples"] * delay, r
