"""URLs of remote shards: the forms read, and each mistake as one line before any request."""

import argparse

import pytest

from hasten.errors import DataError
from hasten.stream.store_url import data_argument, is_url, parse_store_url


@pytest.mark.parametrize("text, canonical, kind, bucket, prefix", [
    ("s3://bucket/a/b", "s3://bucket/a/b/", "s3", "bucket", "a/b/"),
    ("s3://bucket/a/b///", "s3://bucket/a/b/", "s3", "bucket", "a/b/"),
    ("S3A://bucket", "s3a://bucket/", "s3", "bucket", ""),
    ("gs://bucket/shards/", "gs://bucket/shards/", "gcs", "bucket", "shards/"),
    ("az://container/x", "az://container/x/", "azure", "container", "x/"),
    ("https://host:8443/data/set", "https://host:8443/data/set/", "http", "host:8443", "data/set/"),
])
def test_forms_read_and_their_one_spelling(text, canonical, kind, bucket, prefix):
    url = parse_store_url(text)
    assert (url.text, url.kind, url.bucket, url.prefix) == (canonical, kind, bucket, prefix)
    assert url.join("train/shard-000000.tar") == canonical + "train/shard-000000.tar"
    assert parse_store_url(canonical) == url  # one spelling: one run directory, one cache


@pytest.mark.parametrize("text, says", [
    ("ftp://host/shards/", "unknown URL scheme ftp://"),
    ("memory:///x/", "unknown URL scheme memory://"),
    ("s3:///prefix/", "no bucket in 's3:///prefix/'; write s3://BUCKET/PREFIX/"),
    ("gs://", "no bucket"),
    ("https:///shards/", "no host"),
    ("s3://bucket/p/?versionId=3", "?query or #fragment"),
    ("file:///tmp/shards/", "give a local directory as a path"),
])
def test_each_mistake_is_one_line_naming_it(text, says):
    with pytest.raises(DataError) as e:
        parse_store_url(text)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_credentials_in_the_url_are_refused_without_being_echoed():
    with pytest.raises(DataError) as e:
        parse_store_url("https://alice:s3cr3t-value@host/shards/")
    text = str(e.value)
    assert "holds credentials" in text and "s3cr3t-value" not in text and "alice" not in text


def test_paths_are_not_urls_and_the_cli_type_takes_both(tmp_path):
    assert not is_url(str(tmp_path)) and not is_url("C:\\data") and not is_url(tmp_path)
    assert is_url("s3://b/p") and is_url("https://h/")
    assert data_argument("s3://bucket/set") == "s3://bucket/set/"
    assert data_argument(str(tmp_path)) == str(tmp_path)
    for bad in ("s3://", str(tmp_path / "missing"), "ftp://h/x"):
        with pytest.raises(argparse.ArgumentTypeError):
            data_argument(bad)
