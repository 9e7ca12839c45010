"""`hasten train --loader stream --data s3://...`: end to end against a real S3-API server
(moto) through a fault proxy; epoch 2 from the local cache; a store that keeps failing
stops the run in one line naming the newest checkpoint; a stop mid-epoch and
`--resume auto` (the shards read again from the store, through faults) end with the
weights of a run that never stopped, which are those of the same run on the shards read
locally; no credential reaches the run directory."""

import json

import pytest
import torch
from store_servers import FaultProxy, moto_s3, plain_http, s3_env, upload

from hasten.cli import main
from hasten.stream.pack import pack

URL = "s3://shards/set/"
TINY = ["--loader", "stream", "--data", URL, "--model", "resnet10", "--width", "4", "--image-size", "16",
        "--batch-size", "8", "--epochs", "2", "--warmup-epochs", "1", "--deterministic", "--device", "cpu"]
STEPS = 2 * (54 // 8)  # photo_folder: 54 training images
# One torch thread, as the other training tests: on 2 shared cores a second one slows small steps down.
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def moto(photo_folder, tmp_path_factory):
    packed = tmp_path_factory.mktemp("train-remote") / "set"
    pack(photo_folder, packed, shard_bytes=40_000)
    server = moto_s3(tmp_path_factory.mktemp("moto"))
    upload(server.url, "shards", "set/", packed)
    yield server, json.loads((packed / "index.json").read_text()), packed
    server.kill()


@pytest.fixture
def proxy(moto, monkeypatch):
    server, _, _ = moto
    p = FaultProxy(server.port)
    for name, value in s3_env(p.url).items():
        monkeypatch.setenv(name, value)
    yield p
    p.close()


def shard_names(index, split):
    return [s["name"] for s in index["splits"][split]["shards"]]


def test_train_over_s3_through_faults_reads_each_shard_once_in_two_epochs(moto, proxy, tmp_path, capsys):
    _, index, _ = moto
    train_shards = shard_names(index, "train")
    proxy.inject("reset", train_shards[0], times=2)
    proxy.inject("503", train_shards[1], times=2)
    proxy.inject("truncate", train_shards[2])
    run = tmp_path / "run"
    assert main(["train", *TINY, "--run-dir", str(run), "--json", str(tmp_path / "r.json")]) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["steps"] == STEPS and report["images_per_epoch"] == 48 and report["dataset"] == index["source"]
    # Epoch 2 came from the cache: every training shard was read (answered) once, in epoch 1.
    for name in train_shards:
        assert proxy.count("forwarded", name) + proxy.count("truncate", name) == 1 + (name == train_shards[2]), name
    assert proxy.count("reset") == 2 and proxy.count("503") == 2
    assert json.loads((run / "config.json").read_text())["data"] == URL
    # No credential in any file of the run directory.
    secrets = [s3_env("")["AWS_SECRET_ACCESS_KEY"], s3_env("")["AWS_ACCESS_KEY_ID"]]
    for f in run.rglob("*"):
        if f.is_file():
            data = f.read_bytes()
            assert not any(s.encode() in data for s in secrets), f


def test_train_from_python_http_server_which_ignores_range(moto, tmp_path, capsys):
    """The web server most people start first answers 200 with the whole file to a Range
    request: each shard is read whole, once, and the run trains as from any store."""
    _, index, packed = moto
    server = plain_http(packed.parent, tmp_path)
    try:
        proxy = FaultProxy(server.port)
        url = f"{proxy.url}/set/"
        argv = ["train", *[url if a == URL else a for a in TINY], "--json", str(tmp_path / "r.json")]
        assert main(argv) == 0
        report = json.loads((tmp_path / "r.json").read_text())
        assert report["steps"] == STEPS and report["dataset"] == index["source"]
        for name in shard_names(index, "train") + shard_names(index, "test"):
            assert proxy.count("forwarded", name) == 1, name  # whole, once; epoch 2 from the cache
        proxy.close()
    finally:
        server.kill()


def test_a_store_that_keeps_failing_stops_the_run_in_one_line_naming_the_newest_checkpoint(moto, proxy, tmp_path,
                                                                                          capsys, monkeypatch):
    _, index, _ = moto
    test_shard = shard_names(index, "test")[0]  # test/shard-000000.tar
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):  # the docs' moto recipe: the keys are "test"
        monkeypatch.setenv(name, "test")
    proxy.inject("503", test_shard, times=10**6)  # evaluation, after the last checkpoint, cannot read it
    argv = ["train", *TINY, "--retries", "1", "--checkpoint-every", "3"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("hasten train: error: ")
    assert test_shard in err and URL in err and "503" in err and "2 tries failed" in err
    assert "newest checkpoint: " in err and f"(step {STEPS})" in err and "--resume auto" in err
    proxy.clear()
    assert main([*argv, "--resume", "auto"]) == 0  # the store answers again: the run completes
    assert "already complete" in capsys.readouterr().out
    # Finished now: the same command again says so and exits 0, with or without --resume auto.
    requests = proxy.count()
    for again in (argv, [*argv, "--resume", "auto"]):
        assert main(again) == 0
        out, err = capsys.readouterr()
        assert "already complete" in out and "finished at step" in err
    assert proxy.count() == requests  # nothing read: not trained, not evaluated again


def test_stop_mid_epoch_then_resume_auto_gives_the_weights_of_a_run_that_never_stopped(moto, proxy, tmp_path,
                                                                                       monkeypatch, capsys):
    """...and those are the weights of the same run on the same shards read locally."""
    import hasten.recipes.train_hooks as recipe  # (where the checkpoints are saved)
    from hasten.errors import Terminated

    _, _, packed = moto
    argv = ["train", *TINY, "--checkpoint-every", "4"]
    assert main([*argv, "--run-dir", str(tmp_path / "straight")]) == 0
    local = [a if a != URL else str(packed) for a in argv]
    assert main([*local, "--run-dir", str(tmp_path / "local")]) == 0
    real_save = recipe.save_checkpoint

    def save_then_stop(path, state, **kw):
        real_save(path, state, **kw)
        if state["step"] == 8:  # two batches into epoch 1
            raise Terminated()

    monkeypatch.setattr(recipe, "save_checkpoint", save_then_stop)
    assert main([*argv, "--run-dir", str(tmp_path / "stopped")]) == 128 + 15
    assert "newest checkpoint: " in capsys.readouterr().err
    saved = torch.load(tmp_path / "stopped" / "checkpoint.pt", weights_only=True)
    assert saved["step"] == 8 and saved["data"]["ranks"] == [{"epoch": 1, "position": 16}]
    monkeypatch.setattr(recipe, "save_checkpoint", real_save)
    # Resumed elsewhere: an empty cache, every shard from the store again, through faults.
    monkeypatch.setenv("HASTEN_CACHE", str(tmp_path / "other-host-cache"))
    proxy.inject("reset", ".tar", times=2)
    proxy.inject("truncate", ".tar", times=2)
    resumed = tmp_path / "resumed.json"
    assert main([*argv, "--run-dir", str(tmp_path / "stopped"), "--resume", "auto", "--json", str(resumed)]) == 0
    assert proxy.count("reset") == 2 and proxy.count("truncate") == 2
    # The time of the 8 steps before the stop is kept: the rate is of all 14 steps over all their time.
    report = json.loads(resumed.read_text())
    assert report["resumed_from_step"] == 8 and report["time_of_all_steps"]
    assert report["time_s"] > saved["train_time_s"] > 0
    assert report["images_per_s"] == pytest.approx(STEPS * 8 / report["time_s"])
    a, b, c = (torch.load(tmp_path / run / "checkpoint.pt", weights_only=True)
               for run in ("straight", "stopped", "local"))
    assert a["step"] == b["step"] == c["step"] == STEPS
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]) and torch.equal(a["model"][k], c["model"][k]), k


@pytest.mark.parametrize("data, mistake, says", [
    ("s3://missing-bucket/set/", None, "the bucket 'missing-bucket' does not exist at http://127.0.0.1:"),
    ("s3://shards/elsewhere/", None, "no index.json at s3://shards/elsewhere/"),
    (URL, "unreachable", "1 try failed (connection refused)"),
    (URL, "no credentials", "no credentials, or they do not give access"),
])
def test_url_mistakes_found_at_open_end_in_one_line_and_exit_2(moto, proxy, data, mistake, says, capsys,
                                                              monkeypatch, tmp_path):
    from store_servers import free_port

    closed = f"http://127.0.0.1:{free_port()}"
    if mistake == "unreachable":
        monkeypatch.setenv("AWS_ENDPOINT_URL", closed)
    if mistake == "no credentials":  # none in the environment, no AWS files, no metadata service
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            monkeypatch.delenv(name)
        for name in ("AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE"):
            monkeypatch.setenv(name, str(tmp_path / "none"))
        monkeypatch.setenv("AWS_METADATA_ENDPOINT", closed)
        monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("HASTEN_PROGRESS", "0")  # (the retry lines of an unreachable store: tested elsewhere)
    assert main(["train", *TINY[:2], "--data", data, *TINY[4:], "--retries", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err and err.startswith("hasten train: error: "), err
    # Waiting is advised only for a store that did not answer; no run directory is named (none is left).
    assert ("rerun when the store answers" in err) == (mistake == "unreachable")
    assert "--resume" not in err and "train-" not in err and "<" not in err, err
    assert not list((tmp_path / "runs").glob("*"))


def test_a_url_needs_the_stream_loader(capsys):
    assert main(["train", "--data", URL, "--device", "cpu"]) == 2
    assert "add --loader stream" in capsys.readouterr().err
