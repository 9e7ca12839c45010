"""``hasten echo`` over shards served by a real HTTP server with Range support, and over
packed shards on disk: the same pipeline (open_source + ShardLoader + EchoStage) as a folder."""

import json

import pytest
from store_servers import range_http

from hasten.cli import main
from hasten.stream.pack import pack


@pytest.fixture(scope="module")
def served(colours, tmp_path_factory):
    """The colours folder packed into shards, and a RangeHTTPServer serving the folder that holds them."""
    packed = tmp_path_factory.mktemp("echo-remote") / "set"
    pack(colours, packed, shard_bytes=20_000)
    server = range_http(packed.parent, tmp_path_factory.mktemp("logs"))
    yield packed, server
    server.kill()


@pytest.mark.parametrize("where", ["url", "dir"])
def test_echo_over_packed_shards_reaches_the_target_with_and_without_echoing(served, where, tmp_path, one_thread):
    packed, server = served
    data = f"{server.url}/set/" if where == "url" else str(packed)
    out = tmp_path / "echo.json"
    rc = main(["echo", "--data", data, "--echo", "2", "--variant", "example-before", "--upstream-delay", "0.001",
               "--target", "0.9", "--json", str(out)])
    assert rc == 0
    results = json.loads(out.read_text())["results"]
    assert {r["echo_factor"] for r in results} == {1.0, 2.0}
    for r in results:
        assert r["reached_target"] and r["skipped_images"] == 0
        # Echoing at 2: about two items per fresh example; none without.
        items = r["steps_to_target"] * 64
        assert items >= (1.5 if r["echo_factor"] == 2.0 else 1.0) * r["fresh_examples_to_target"] - 64


@pytest.mark.parametrize("url,match", [("ftp://host/set/", "ftp"), ("s3://", "bucket")])
def test_a_url_mistake_is_one_line_and_exit_2(url, match, capsys):
    try:
        rc = main(["echo", "--data", url])
    except SystemExit as e:
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2 and match in err and "Traceback" not in err and len(err.splitlines()) == 1
