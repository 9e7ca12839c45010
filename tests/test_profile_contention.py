"""The workers' CPU on the step's cores, from the measured window's totals (issue 32, items 2 and 4).

chargpt and makemore with 4 workers read `balanced` in one run of three: the cost was decided by the
replayed step's CPU over its wall time in its least disturbed step, 1.79 cores in one run, 1.99 in the
next. The window's totals do not depend on the replay."""

import pytest

from hasten.profile.contention import workers_delay
from hasten.profile.report import format_report
from hasten.profile.verdict import analyse


def _window_rank(replay_cores: float, worker_cpu=0.002, n=48, own=0.040, work=0.020, wait=0.0012, spread=0.0):
    """A step of two threads keeping both cores busy (``own`` CPU in ``work``, each step +-``spread``), 4 workers
    taking ``worker_cpu`` a batch, a replayed step that kept ``replay_cores`` busy; the window was read."""
    from test_profile_verdict import _rank
    rank = _rank(wait=wait, work=work, alone=0.018, workers=4, n=n)
    for i, r in enumerate(rank["records"]["measure"]):
        d = spread * (1 if i % 2 else -1)
        r.update(cpu_s=own + d + wait, data_cpu_s=wait, compute_s=work)  # the wait: receiving batches
    for r in rank["records"]["step_alone"]:
        r["cpu_s"] = replay_cores * r["work_s"]
    rank["worker_cpu"] = {"cpu_s": worker_cpu * n, "batches": n, "in_flight": 8}
    rank["cpu_window"] = {"cores": 2, "wall_s": n * (work + wait), "free": 2.0}
    rank["threads"] = {"intra_op": 2}
    return rank


def test_the_cost_does_not_move_with_the_replayed_steps_cores():
    runs = [analyse([_window_rank(k, worker_cpu=0.004)], cpus={"available": 2.0}) for k in (1.79, 1.99)]
    assert runs[0].cpu["data_cpu_delay_s"] == pytest.approx(runs[1].cpu["data_cpu_delay_s"])
    assert {a.verdict for a in runs} == {"input-bound"}
    # the step keeps both cores busy: all 4 ms of the workers' CPU run on its cores, costing it between
    # 2 ms (work that divides over both cores) and 4 ms (threads held at a barrier); the estimate the middle
    a = runs[0]
    assert a.cpu["estimate"] == "window totals" and a.cpu["data_cpu_delay_s"] == pytest.approx(0.003)
    lo, hi = a.cpu["data_cpu_share_interval"]
    step = a.step_time_s
    assert lo == pytest.approx(0.002 * 48 / 56 / step, rel=0.05) and hi == pytest.approx(0.004 * 48 / 40 / step)
    # the verdict's interval lower end holds the lower end of the cost, on top of the wait's
    assert a.data_interval[0] > a.data_wait_fraction


def test_a_step_that_leaves_a_core_idle_is_not_slowed_by_the_workers():
    # one thread: 20 ms CPU in 20 ms of work leaves the other core idle for 20 ms, ten times the workers' 2 ms
    a = analyse([_window_rank(1.0, own=0.020)], cpus={"available": 2.0})
    assert not a.cpu["contended"] and a.cpu["data_cpu_delay_s"] == 0.0 and a.verdict != "input-bound"


def test_the_interval_widens_with_the_steps_spread_and_holds_the_estimate():
    c = (0.002, 0.0018, 0.0023)
    steady = workers_delay(c, [0.037] * 40, [0.020] * 40, [0.036] * 40, [0.019] * 40, 2.0, 2)
    cpu = [0.037 + (0.006 if i % 2 else -0.006) for i in range(40)]
    noisy = workers_delay(c, cpu, [0.020] * 40, [u - 0.001 for u in cpu], [0.019] * 40, 2.0, 2)
    for d in (steady, noisy):
        lo, hi = d["delay_interval_s"]
        assert lo <= d["delay_s"] <= hi
    assert (noisy["delay_interval_s"][1] - noisy["delay_interval_s"][0]
            > steady["delay_interval_s"][1] - steady["delay_interval_s"][0])
    # 2 x 20 ms of core time, 37 ms of it the step's and 2 ms the workers': 1 ms idle, the other 1 ms of
    # the workers' CPU found no idle core
    assert steady["idle_core_s"] == pytest.approx(0.001) and steady["lost_s"] == pytest.approx(0.001)
    assert steady["delay_s"] == pytest.approx((0.001 / (0.036 / 0.019) + 0.001) / 2)


def test_on_one_core_the_step_and_the_workers_take_turns():
    # tests/profile_scripts/pinned_workers.py's arithmetic: 48 ms of the step's CPU and 24 ms of the workers'
    # in a 72 ms step: no idle core time, and every second of theirs is one of the step's, at both ends
    d = workers_delay((0.024, 0.024, 0.024), [0.048] * 20, [0.072] * 20, [0.048] * 20, [0.071] * 20, 1.0, 1)
    assert d["delay_s"] == pytest.approx(0.024) and d["delay_interval_s"] == pytest.approx((0.024, 0.024))


def test_where_other_jobs_leave_fewer_cores_than_threads_a_second_taken_costs_more():
    # one thread on 0.4 of a core, busy all along: a second of worker CPU on it is 2.5 s of the step's, at both
    # ends (the thread is all the step has)
    d = workers_delay((0.010, 0.010, 0.010), [0.040] * 10, [0.100] * 10, [0.040] * 10, [0.100] * 10, 0.4, 1)
    assert d["thread_rate"] == pytest.approx(0.4)
    assert d["delay_interval_s"] == pytest.approx((0.010 / 0.4, 0.010 / 0.4))
    # two threads on 0.8 of the two cores: from a second over the 0.8 cores the step keeps busy to 2.5 s
    two = workers_delay((0.010, 0.010, 0.010), [0.080] * 10, [0.100] * 10, [0.080] * 10, [0.100] * 10, 0.8, 2)
    assert two["delay_interval_s"] == pytest.approx((0.010 / 0.8, 0.010 / 0.4))


def test_no_steps_no_estimate():
    assert workers_delay((0.002, 0.002, 0.002), [], [], [], [], 2.0, 2) == {}


def test_the_wait_and_the_cpu_share_add_their_uncertainties_in_quadrature():
    from hasten.profile.shares import sum_interval
    # chargpt with 4 workers, one run: wait 4.8% (4.1%-5.5%), the workers' CPU 3.7% (0.8%-7.8%)
    point, lo, hi = sum_interval((0.048, 0.041, 0.055), (0.037, 0.008, 0.078))
    assert point == pytest.approx(0.085)
    assert lo == pytest.approx(0.085 - (0.007 ** 2 + 0.029 ** 2) ** 0.5)
    assert 0.049 < lo < 0.085 - 0.029  # narrower than the ends added, wider than either alone
    assert hi == pytest.approx(0.085 + (0.007 ** 2 + 0.041 ** 2) ** 0.5)
    assert sum_interval((0.01, 0.0, 0.02), (0.0, 0.0, 0.0)) == pytest.approx((0.01, 0.0, 0.02))


def test_idle_time_is_never_more_than_proc_saw():
    # pinned_workers.py on a core another job took half of, with the probe's 1 core as the cores available:
    # 152 ms a step, 50 ms of the step's CPU and 26 ms of the workers': its own numbers leave 76 ms "idle",
    # which the other job had. /proc/stat counted none idle: all of the workers' CPU was on the step's core.
    c = (0.026, 0.026, 0.026)
    mine = workers_delay(c, [0.050] * 20, [0.152] * 20, [0.050] * 20, [0.150] * 20, 1.0, 1)
    seen = workers_delay(c, [0.050] * 20, [0.152] * 20, [0.050] * 20, [0.150] * 20, 1.0, 1, idle_seen=0.0)
    assert mine["delay_s"] == 0.0 and seen["lost_s"] == pytest.approx(0.026)
    # where /proc saw more idle than the step's numbers allow, they stand
    more = workers_delay(c, [0.050] * 20, [0.152] * 20, [0.050] * 20, [0.150] * 20, 1.0, 1, idle_seen=0.5)
    assert more["idle_core_s"] == pytest.approx(mine["idle_core_s"])


def test_the_window_idle_per_step_comes_from_its_proc_totals():
    from hasten.profile.attribution import idle_seen_per_step
    assert idle_seen_per_step({"cores": 2, "wall_s": 1.0, "busy_s": 1.9}, 50) == pytest.approx(0.1 / 50)
    assert idle_seen_per_step({"cores": 2, "wall_s": 1.0, "busy_s": 2.1}, 50) == 0.0
    assert idle_seen_per_step({}, 50) is None and idle_seen_per_step({"cores": 2, "wall_s": 1, "busy_s": 1}, 0) is None


def _held_rank(queued: float, others_s: float = 0.0, n: int = 20, c: float = 0.300, step: float = 1.0):
    """Issue 43, item 8's shape: 4 workers taking ``c`` of CPU a step on 2 cores, beside a step of one busy core
    (1 s of CPU in 1 s of work) that waits for no batch; the loop thread sat ``queued`` of each step in the run
    queue; other processes took ``others_s`` over the window."""
    from test_profile_verdict import _rank
    rank = _rank(wait=0.0, work=step, alone=step, workers=4, n=n)
    for r in rank["records"]["measure"]:
        r.update(cpu_s=step, data_cpu_s=0.0, compute_s=step, own_s=step - queued)
    rank["worker_cpu"] = {"cpu_s": c * n, "batches": n, "in_flight": 0}
    rank["cpu_window"] = {"cores": 2, "wall_s": n * step, "free": 2.0, "others_s": others_s}
    rank["threads"] = {"intra_op": 2}
    return rank


def test_idle_cores_do_not_hide_workers_that_held_the_loop_thread_off_its_core():
    # 2 x 1 s of core time a step, 1 s of it the step's and 0.3 s the workers': 0.7 s "idle", more than the
    # workers' CPU, so the idle-time model alone says the workers cost nothing. The loop thread sat 0.25 s a
    # step in the run queue with no other process competing: the workers held it off its core that long.
    free = analyse([_held_rank(queued=0.0)], cpus={"available": 2.0})
    assert not free.cpu["contended"] and free.data_free_step_s == pytest.approx(1.0)
    a = analyse([_held_rank(queued=0.25)], cpus={"available": 2.0})
    assert a.cpu["idle_core_s"] > a.cpu["data_cpu_per_step_s"]  # the idle-time model's blind spot
    assert a.cpu["contended"] and a.cpu["data_cpu_held_s"] == pytest.approx(0.25)
    assert a.cpu["data_cpu_delay_s"] >= 0.25 and a.data_share >= 0.25 and a.verdict == "input-bound"
    # the step with its data made free: less what the workers held the loop thread; never below the floor (its
    # own work less all of its run-queue wait), nor more than the Amdahl bound allows
    assert a.data_free_step_s == pytest.approx(0.75)
    assert a.data_free_step_s >= a.cpu["fastest_step_s"] - 1e-9
    assert a.data_gain[1] == pytest.approx(1.0 / 0.75)
    lo, hi = a.cpu["data_cpu_share_interval"]
    assert lo >= 0.25 - 1e-9 and hi >= lo
    assert "300 ms of CPU held its loop thread off its core 250 ms" in format_report(a)


def test_the_run_queue_wait_other_jobs_caused_is_not_the_workers():
    # as above, but other processes took 0.9 s of CPU a step beside the workers' 0.3 s: a quarter of the wait
    d = analyse([_held_rank(queued=0.25, others_s=0.9 * 20)], cpus={"available": 2.0})
    assert d.cpu["data_cpu_held_s"] == pytest.approx(0.25 * 0.3 / 1.2)
    assert d.data_free_step_s == pytest.approx(1.0 - 0.25 * 0.3 / 1.2)
    assert d.cpu["fastest_step_s"] == pytest.approx(0.75)  # the floor stays all of the wait


def test_the_held_time_is_a_lower_end_only():
    # a saturated window (no idle core time): the idle-time model's estimate stands where it is the larger
    c = (0.004, 0.004, 0.004)
    base = workers_delay(c, [0.040] * 20, [0.020] * 20, [0.040] * 20, [0.020] * 20, 2.0, 2)
    small = workers_delay(c, [0.040] * 20, [0.020] * 20, [0.040] * 20, [0.020] * 20, 2.0, 2, queued=[0.001] * 20)
    big = workers_delay(c, [0.040] * 20, [0.020] * 20, [0.040] * 20, [0.020] * 20, 2.0, 2, queued=[0.006] * 20)
    assert small["delay_s"] == base["delay_s"] and small["delay_interval_s"] == base["delay_interval_s"]
    assert big["delay_s"] == pytest.approx(0.006) and big["delay_interval_s"][0] == pytest.approx(0.006)
