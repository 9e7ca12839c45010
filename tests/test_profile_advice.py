"""The fixes fit the script (issue 32, item 5): read from the lines that make the batch, never advice to
do what the script does already, and every snippet valid code.

nanoGPT's tiny-context run (block 8, batch 512) spends its data time in get_batch()'s per-row list
comprehension over a memmap it has already prepared; it was told to "prepare the data once ... then
get_batch() only slices it", which it does."""

import ast
import sys
import textwrap

import numpy as np
import pytest
import torch

from hasten.profile.inject.batch_shape import line_shape
from hasten.profile.inject.rows_at_once import rows_at_once
from hasten.profile.verdict import analyse

# nanoGPT train.py @ 3adf61e, get_batch(), and ng-video-lecture's bigram.py get_batch(), as written
NANOGPT_X = "x = torch.stack([torch.from_numpy((data[i:i+block_size]).astype(np.int64)) for i in ix])"
NANOGPT_Y = "y = torch.stack([torch.from_numpy((data[i+1:i+1+block_size]).astype(np.int64)) for i in ix])"
BIGRAM_Y = "y = torch.stack([data[i+1:i+block_size+1] for i in ix])"
BIGRAM_X = "x = torch.stack([data[i:i+block_size] for i in ix])"


def _run(code: str, **names) -> dict:
    scope = {"torch": torch, "np": np, **names}
    exec(compile(code, "<snippet>", "exec"), scope)
    return scope


@pytest.mark.parametrize("line", [NANOGPT_X, NANOGPT_Y, BIGRAM_X])
def test_a_per_row_comprehension_of_windows_is_rewritten_as_one_index_making_the_same_rows(line, tmp_path):
    path = tmp_path / "train.bin"
    np.memmap(path, dtype=np.uint16, mode="w+", shape=(5000,))[:] = np.arange(5000) % 997
    memmap = np.memmap(path, dtype=np.uint16, mode="r")
    data = memmap if "from_numpy" in line else torch.from_numpy(memmap.astype(np.int64))
    ix = torch.randint(len(data) - 9, (512,), generator=torch.Generator().manual_seed(0))
    at_once = rows_at_once(ast.parse(line).body[0])
    assert at_once is not None and " for " not in at_once and "ix[:, None]" in at_once
    name = line.split("=")[0].strip()
    expected = _run(line, data=data, ix=ix, block_size=8)[name]
    got = _run(at_once, data=data, ix=ix, block_size=8)[name]
    assert got.dtype == expected.dtype and torch.equal(got, expected)


def test_a_window_of_another_shape_is_named_not_rewritten():
    # the upper bound is not "lower + width": no rewrite (this one's rows are block_size + 1 - 1 long)
    assert rows_at_once(ast.parse(BIGRAM_Y).body[0]) is None
    assert rows_at_once(ast.parse("x = torch.stack([augment(img) for img in images])").body[0]) is None
    assert rows_at_once(ast.parse("x = data[ix]").body[0]) is None


def test_the_sampled_line_says_per_row_prepared_and_its_rewrite(tmp_path):
    script = tmp_path / "get_batch_source.py"
    script.write_text(textwrap.dedent('''
        import sys
        import numpy as np
        import torch

        frames = []

        def grab(x):
            frames.append(sys._getframe(1))  # the frame that made the row: the comprehension's (or get_batch's)
            return x

        def get_batch(path, block_size=8):
            data = np.memmap(path, dtype=np.uint16, mode="r")
            ix = torch.randint(len(data) - block_size, (4,))
            x = torch.stack([grab(torch.from_numpy((data[i:i+block_size]).astype(np.int64))) for i in ix])
            return x
    '''))
    np.memmap(tmp_path / "t.bin", dtype=np.uint16, mode="w+", shape=(100,))[:] = 1
    sys.path.insert(0, str(tmp_path))
    try:
        import get_batch_source as mod
        mod.get_batch(str(tmp_path / "t.bin"))
    finally:
        sys.path.remove(str(tmp_path))
    shape = line_shape(mod.frames[0])
    assert shape["per_row"] and shape["prepared"]
    assert shape["rows_at_once"] == ("x = grab(torch.from_numpy(data[(ix[:, None] + torch.arange(block_size))"
                                     ".numpy()].astype(np.int64)))")


def _tiny_context_rank(prepared=True, per_row=True):
    """nanoGPT's tiny context as the profile sees it: no DataLoader, 20 of 70 ms a step outside compute,
    all of it sampled in get_batch(), most of it on the two per-row lines."""
    recs = [{"wait_s": 0.020, "work_s": 0.050, "span_s": 0.070, "compute_s": 0.050, "cpu_s": 0.068,
             "data_cpu_s": 0.018} for _ in range(20)]
    rows = [{"at": "train.py:121", "function": "get_batch", "code": NANOGPT_X[:80], "samples": 30,
             "per_row": per_row, "prepared": prepared},
            {"at": "train.py:122", "function": "get_batch", "code": NANOGPT_Y[:80], "samples": 28,
             "per_row": per_row, "prepared": prepared},
            {"at": "train.py:116", "function": "get_batch", "code": "data = np.memmap(...)", "samples": 4,
             "per_row": False, "prepared": prepared}]
    if per_row:
        rows[0]["rows_at_once"] = rows_at_once(ast.parse(NANOGPT_X).body[0])
        rows[1]["rows_at_once"] = rows_at_once(ast.parse(NANOGPT_Y).body[0])
    return {"rank": 0, "world_size": 1, "device": "cpu", "num_workers": 0, "loader_driven": False,
            "batch_size": None, "dataset_len": None, "batch_bytes": 0, "cpu_count": 2, "warmup": 3,
            "records": {"measure": recs, "step_alone": [{**r, "wait_s": 0.0, "span_s": 0.050} for r in recs]},
            "loader_probe": {}, "ddp": False, "grad_bytes": 0, "allreduce_times": [],
            "outside": {"counts": {"batch": 62, "other": 0}, "batch_found": True, "lines": {"batch": rows}}}


def test_a_prepared_memmap_sliced_row_by_row_is_told_to_index_the_rows_at_once_not_to_prepare_it():
    a = analyse([_tiny_context_rank()])
    assert a.verdict == "input-bound"
    fixes = a.recommendations + [type("R", (), r) for r in a.rejected]
    assert not any("prepare the data once" in f.fix for f in fixes)  # it reads a memmap already
    top = next(r for r in a.recommendations if "rows at once" in r.fix)
    assert "train.py:121 (get_batch)" in top.fix
    assert "ix[:, None] + torch.arange(block_size)" in top.how and "ix[:, None] + 1 + torch.arange" in top.how
    # at most what the per-row lines took: 58 of the 62 batch samples of the 20 ms
    assert top.predicted_speedup == pytest.approx(0.070 / (0.070 - 0.020 * 58 / 62))


def test_data_made_in_the_loop_from_unprepared_data_is_still_told_to_prepare_it():
    a = analyse([_tiny_context_rank(prepared=False, per_row=False)])
    prep = next(r for r in a.recommendations if r.fix.startswith("prepare the data once"))
    assert "get_batch(...) only indexes it" in prep.how


def _loader_ranks():
    from test_profile_verdict import _rank, _workers_rank
    return [_rank(wait=0.050, work=0.020), _rank(wait=0.050, work=0.020, workers=2, loader=0.2),
            _workers_rank(0.004, 0.130, alone=0.060, alone_cpu=0.120, wait=0.006, work=0.064, recv_cpu=0.006)]


@pytest.mark.parametrize("rank", [_tiny_context_rank(), _tiny_context_rank(prepared=False, per_row=False),
                                  _tiny_context_rank(prepared=True, per_row=False), *_loader_ranks()])
def test_every_suggested_snippet_compiles(rank):
    # the hand-off of a batch from a worker measured, as the loader probe does: a workers fix is predicted
    rank = {**rank, "loader_probe": {**rank["loader_probe"], "handoff_s": 0.0005}}
    a = analyse([rank], cpus={"available": 2.0})
    assert a.recommendations
    for r in a.recommendations + [type("R", (), x) for x in a.rejected if x.get("how")]:
        compile(_as_printed(r.how), f"<{r.fix}>", "exec")


def _as_printed(how: str) -> str:
    """A fix's code as the report prints it, less the report's indent: 5 spaces before each line after
    the first (hasten.profile.report.format_report)."""
    first, *rest = how.splitlines()
    return "\n".join([first] + [line[5:] if line.startswith("     ") else line for line in rest])
