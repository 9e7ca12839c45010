"""The fixes ``hasten profile`` prints and verifies (hasten.profile.inject.fixes), and the
warning for DataLoader workers that all yield the same items (hasten.profile.inject.loader)."""

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from hasten.profile.inject.batches import fingerprint
from hasten.profile.fix_code import echo_apply, echo_arguments, echo_code
from hasten.profile.input_fixes import worker_cap
from hasten.profile.launcher import ProfileConfig, profile
from hasten.profile.report import format_report
from profile_helpers import verify_only, verify_rounds

SCRIPTS = Path(__file__).parent / "profile_scripts"


def _config(script, *args, **kw):
    kw = {"warmup": 3, "steps": 12, "probe_steps": 6, "capture": True, "timeout_s": 90, **kw}
    return ProfileConfig((sys.executable, str(SCRIPTS / script), *args), **kw)


def _run_printed(how: str, loader) -> list:
    """The report's code run as printed (its lines dedented), ``...`` standing for the loop's body:
    the batches the loop would get, in order."""
    seen = []
    lines = [line.strip() for line in how.splitlines()]
    code = "\n".join(lines).replace(": ...", ": seen.append(batch)")
    exec(code, {"loader": loader, "seen": seen})
    return seen


@pytest.mark.slow
def test_the_echo_fix_under_accumulation_is_the_code_its_verification_ran(tmp_path, monkeypatch):
    # Issue 34: under 2 micro-batches per step the report printed echo_batches(loader, 2), which
    # makes each step's two micro-batches one batch twice, while --verify had put the copies in
    # different steps. Now both echo whole steps, and are one call.
    monkeypatch.setenv("ACCUM_LOG", str(tmp_path / "steps"))
    # One round: the fix's re-run (and the baseline's) is what this test reads, not the verification's
    # statistics (too few runs for an interval: unverified, wherever its prediction put it)
    verify_rounds(monkeypatch, 1)
    verify_only(monkeypatch, "echo=")  # this test is about echo's re-runs
    a = profile(_config("accum_echo.py", verify=True), log=lambda m: None)
    assert a.micro_batches == 2
    # Its gain is small (x1.1 to x1.15 here): it may be recommended or rejected; this test is about its code
    fixes = [*(vars(r) for r in a.recommendations), *a.rejected]
    echo = SimpleNamespace(**next(f for f in fixes if (f.get("apply") or "").startswith("echo=")))
    factor, group = echo_arguments(echo.apply)
    assert group == 2 and f"group={group}" in echo.how
    assert any(n.startswith(f"verification of {echo.fix}: 1 pair(s) of runs") for n in a.notes), a.notes  # it ran

    # The printed code applied to the script's loader (one pass), two batches per step.
    monkeypatch.syspath_prepend(str(SCRIPTS))
    from accum_echo import Numbered
    loader = torch.utils.data.DataLoader(Numbered(4096, 0.0), batch_size=16)
    ids = [int(x[0, 0]) // 16 for x, _ in _run_printed(echo.how, loader)]
    printed = [ids[i:i + 2] for i in range(0, len(ids) - 1, 2)]
    assert all(a != b for a, b in printed)  # a step's micro-batches are distinct
    assert printed[1] == printed[0] and printed[2] != printed[0]  # and whole steps repeat

    # The verification's re-run logged what each of its steps trained on: the same steps.
    logs = list(tmp_path.glob(f"steps.{echo.apply}.*"))
    assert len(logs) == 1
    for log in logs:
        verified = [json.loads(line) for line in log.read_text().splitlines()]
        assert len(verified) >= a.steps and verified == printed[:len(verified)]


def test_echo_fix_arguments_round_trip_into_the_printed_call():
    assert echo_apply(2.0, 1) == "echo=2" and echo_arguments("echo=2") == (2.0, 1)
    assert echo_apply(3.5, 4) == "echo=3.5,group=4" and echo_arguments("echo=3.5,group=4") == (3.5, 4)
    assert echo_arguments("workers=4") is None
    assert "echo_batches(loader, 3.5, group=4)" in echo_code("echo=3.5,group=4")
    ids = [x for x in _run_printed(echo_code("echo=2"), range(3))]
    assert ids == [0, 0, 1, 1, 2, 2]
    assert _run_printed(echo_code("echo=2,group=3"), range(6)) == [0, 1, 2, 0, 1, 2, 3, 4, 5, 3, 4, 5]


def test_a_fingerprint_tells_equal_batches_from_different_ones():
    x = torch.arange(200_000, dtype=torch.float32).reshape(1000, 200)
    batch = {"x": x, "y": torch.arange(1000), "name": ["a", "b"]}
    same = {"x": x.clone(), "y": torch.arange(1000), "name": ["a", "b"]}
    assert fingerprint(batch) == fingerprint(same)
    for change in [{"x": x + 1}, {"y": torch.arange(1, 1001)}, {"name": ["a", "c"]}, {"x": x.reshape(200, 1000)}]:
        assert fingerprint({**batch, **change}) != fingerprint(batch), change
    assert fingerprint((x.bfloat16(), torch.tensor([True]))) == fingerprint((x.bfloat16(), torch.tensor([True])))
    assert fingerprint([x]) != fingerprint((x, x))


@pytest.mark.parametrize("shard", [False, True])
def test_workers_that_all_yield_the_same_items_are_named_in_the_report(shard):
    a = profile(_config("iterable_workers.py", "--workers", "2", *(["--shard"] if shard else [])),
                log=lambda m: None)
    notes = [n for n in a.notes if "get_worker_info" in n]
    hints = [r.fix for r in a.recommendations if "an IterableDataset: split its items by worker" in r.how]
    if shard:
        # no IterableDataset hint: its workers' batches showed it splits them; more workers are advised
        # only where the job has more cores than its 2 workers (never more workers than cores: issue 43)
        assert notes == [] and hints == []
        if worker_cap(a.cpu) > 2:
            assert any(r.fix.endswith("DataLoader workers") for r in a.recommendations)
    else:
        (note,) = notes
        assert "DataLoader(Stream, batch_size=16): its 2 workers' first batches are the same" in note
        assert f"  note: {note}" in format_report(a).splitlines()


@pytest.mark.slow
def test_the_workers_fix_re_run_says_when_its_workers_repeat_each_other(monkeypatch):
    verify_rounds(monkeypatch, 1)  # the note comes from the fix's first re-run (one: unverified, not ranked)
    verify_only(monkeypatch, "workers=")  # this test is about the workers fix's re-run
    # Issue 34: without workers the loop is fine; the workers fix's re-run trained on each batch
    # once per worker (an IterableDataset that ignores get_worker_info()) and nothing said so.
    a = profile(_config("iterable_workers.py", verify=True), log=lambda m: None)
    fixes = {r.apply: r.changes_math for r in a.recommendations if r.apply}
    fixes.update({r["apply"]: r["changes_math"] for r in a.rejected if r.get("apply")})
    apply = next(x for x in fixes if x.startswith("workers="))
    (note,) = [n for n in a.notes if "get_worker_info" in n]
    assert note.startswith(f"in the re-run with {apply}, DataLoader(Stream, batch_size=16)")
    assert "counts repeated batches" in note
    assert fixes[apply]  # as applied it repeats every item: [changes the math]
    # and the printed fix says, before any re-run, what an IterableDataset needs under workers (wherever its
    # verification put it: on a loaded machine the workers of a loop that is fine without them can verify slower)
    how = next(f["how"] for f in [*(vars(r) for r in a.recommendations), *a.rejected] if f.get("apply") == apply)
    assert "an IterableDataset: split its items by worker (torch.utils.data.get_worker_info())" in how
