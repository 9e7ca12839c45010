"""hasten.profile.inject's parts on their own, in this process: batches, settings, the DataLoader guard."""

import collections

import pytest
import torch

from hasten.profile.inject import loader, state
from hasten.profile.inject.batches import fresh_copy, is_data, same_layout
from hasten.profile.inject.settings import PROBES, Settings, parse_probes


def test_data_is_tensors_outside_any_graph():
    x = torch.randn(4, 3)
    w = torch.randn(3, 2, requires_grad=True)
    assert is_data((x, torch.tensor([1, 0])))
    assert not is_data((x @ w,))  # a generator's output on its way to a discriminator
    assert not is_data((w,)) and not is_data(()) and not is_data(("text", 3))


def test_a_kept_batch_stands_in_only_for_one_of_the_same_layout():
    a = (torch.zeros(8, 3), {"mask": torch.ones(8, dtype=torch.bool)}, 5)
    assert same_layout(a, fresh_copy(a))
    assert not same_layout(a, (torch.zeros(7, 3), {"mask": torch.ones(8, dtype=torch.bool)}, 5))  # a last batch
    assert not same_layout(a, (torch.zeros(8, 3, dtype=torch.float64), {"mask": torch.ones(8, dtype=torch.bool)}, 5))
    assert not same_layout(a, (torch.zeros(8, 3), {"mask": torch.ones(8, dtype=torch.bool)}, 6))
    assert not same_layout(a, [torch.zeros(8, 3), {"mask": torch.ones(8, dtype=torch.bool)}, 5])


def test_a_fresh_copy_is_untouched_by_the_loop_changing_its_batch_in_place():
    Pair = collections.namedtuple("Pair", "x y")
    kept = {"pair": Pair(torch.ones(2), torch.zeros(2)), "labels": torch.arange(2)}
    handed = fresh_copy(kept)
    handed["pair"].x.mul_(255)
    handed.pop("labels")  # as a Hugging Face loop does
    assert kept["pair"].x.tolist() == [1.0, 1.0] and "labels" in kept
    assert type(handed["pair"]) is Pair


def test_probe_names_are_checked_and_replay_takes_its_comparisons_with_it(monkeypatch, tmp_path):
    assert parse_probes(" autocast, loader ,") == {"autocast", "loader"}
    with pytest.raises(ValueError, match="unknown probe 'autocats'; the probes are replay, autocast"):
        parse_probes("autocats")
    monkeypatch.setenv("HASTEN_PROFILE_DIR", str(tmp_path))
    monkeypatch.setenv("HASTEN_PROFILE_PROBES", "autocast,comm,loader")  # replay off
    assert Settings.from_environment().probes == {"loader"}
    monkeypatch.delenv("HASTEN_PROFILE_PROBES")
    assert Settings.from_environment().probes == set(PROBES)


def test_a_torch_without_the_dataloader_iterator_class_gets_one_line_not_a_crash(monkeypatch, tmp_path, capsys):
    from torch.utils.data import dataloader as dl
    monkeypatch.setenv("HASTEN_PROFILE_DIR", str(tmp_path))
    st = state.State(Settings.from_environment())
    monkeypatch.delattr(dl, "_BaseDataLoaderIter")
    loader.patch_dataloader(st)
    assert capsys.readouterr().err == ("hasten profile: this torch's DataLoader has no _BaseDataLoaderIter; "
                                       "loader timing off\n")


def test_a_dataloader_iterator_class_without_next_is_left_alone(monkeypatch, tmp_path, capsys):
    from torch.utils.data import dataloader as dl

    class Iter:  # a future torch's iterator: __next__ elsewhere
        def __init__(self, loader):
            pass

    monkeypatch.setenv("HASTEN_PROFILE_DIR", str(tmp_path))
    monkeypatch.setattr(dl, "_BaseDataLoaderIter", Iter)
    loader.patch_dataloader(state.State(Settings.from_environment()))
    assert "DataLoader has no __next__; loader timing off" in capsys.readouterr().err
    assert "__next__" not in vars(Iter)


def test_a_loaders_worker_processes_are_noted_and_no_line_says_they_are_missing(monkeypatch, tmp_path, capsys):
    """The multiprocessing iterator starts its workers after the base class's __init__ (the
    hook): they are noted at its first batch. Checked in __init__, every run with workers
    said "this torch's DataLoader iterator has no _workers", on a torch that has them."""
    import os

    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data import dataloader as dl

    base = dl._BaseDataLoaderIter
    for name in ("__init__", "__next__"):  # (put back after the test)
        monkeypatch.setattr(base, name, vars(base)[name])
    monkeypatch.setenv("HASTEN_PROFILE_DIR", str(tmp_path))
    st = state.State(Settings.from_environment())
    monkeypatch.setattr(state, "current", st)
    loader.patch_dataloader(st)
    it = iter(DataLoader(TensorDataset(torch.arange(16.0)), batch_size=4, num_workers=2))
    workers = [w.pid for w in it._workers]
    next(it), next(it)
    del it
    (d,) = st.loaders.values()
    assert set(d["pids"]) == set(workers) and os.getpid() not in d["pids"]
    assert "_workers" not in capsys.readouterr().err


def test_the_inject_modules_import_one_another_without_a_cycle():
    # Each module named for its concern imports only those below it (function-level imports included):
    # a cycle is a module that has grown two concerns (output.py mixed messages with the rank's report).
    import ast
    from pathlib import Path

    import hasten.profile.inject as inject
    root = Path(inject.__file__).parent
    graph = {}
    for path in root.glob("*.py"):
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "hasten.profile.inject":
                deps |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("hasten.profile.inject."):
                deps.add(node.module.rsplit(".", 1)[1])
        graph[path.stem] = deps - {path.stem}
    done, active = set(), []

    def visit(m):
        assert m not in active, f"import cycle: {' -> '.join(active[active.index(m):] + [m])}"
        if m in done:
            return
        active.append(m)
        for d in sorted(graph.get(m, ())):
            visit(d)
        active.pop()
        done.add(m)

    for m in sorted(graph):
        visit(m)
    assert {"messages", "report", "user_code", "device_sync"} <= graph.keys() and "output" not in graph


def _model(*args):
    """Stands for the model's forward hook: the frame it is called from is the loop's."""
    import sys

    from hasten.profile.inject.batch_source import batch_lines
    return batch_lines(sys._getframe(1))


def _relative(found, fn):
    (lines,) = [v for k, v in found.items() if k is fn.__code__]
    return {n - fn.__code__.co_firstlineno for n in lines}


def test_the_lines_that_make_the_batch_are_those_that_assign_the_models_inputs():
    import time

    def loop():
        data = torch.randn(100, 4)
        ix = torch.randint(100, (8,))
        x = data[ix]
        time.sleep(0)  # not the batch: a pause between steps
        label = (x[:, 0] > 0).long()
        return _model(x, label)

    # data (1), ix (2), x (3) and label (5) make the inputs; the sleep (4) and the call (6) do not
    assert _relative(loop(), loop) == {1, 2, 3, 5}


def test_a_batch_made_inline_is_the_calling_line_and_a_parameter_is_followed_to_the_caller():
    def inline():
        n = 3
        return _model(torch.randn(n, 2))

    assert _relative(inline(), inline) == {2}

    def step(batch):
        return _model(batch)

    def caller():
        b = torch.ones(2)
        return step(b)

    found = caller()
    assert _relative(found, caller) == {1}  # `b = torch.ones(2)`, in the caller: the batch came in as `batch`


def test_a_probe_that_changes_torchs_threads_has_them_put_back(monkeypatch, tmp_path):
    from hasten.profile.inject import probes

    monkeypatch.setenv("HASTEN_PROFILE_DIR", str(tmp_path))
    st = state.State(Settings.from_environment())
    before = torch.get_num_threads()
    probes.guarded(st, "loader", lambda st: torch.set_num_threads(before + 1))
    assert torch.get_num_threads() == before and st.threads["restored_after"] == ["loader"]
