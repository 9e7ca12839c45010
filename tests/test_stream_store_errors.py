"""The one line a user reads about a store's error: the cause kept, the debug dump and the
XML body dropped, cut at a word, secrets masked only where they stand alone."""

import pytest

from hasten.errors import StoreError, StoreUnavailable
from hasten.stream.store_errors import mask, one_line, refused, shorten, transient, unavailable
from hasten.stream.store_url import parse_store_url

# What obstore raised for a GET of a bucket moto does not have (its text, shortened in the middle).
NO_SUCH_BUCKET = (
    'Object at location x/index.json not found: Error performing GET http://127.0.0.1:5000/nobucket/x/index.json '
    'in 61.867736ms - Server returned non-2xx status code: 404 Not Found: <?xml version="1.0" encoding="utf-8"?>\n'
    '<Error><Code>NoSuchBucket</Code><Message>The specified bucket does not exist</Message><BucketName>nobucket'
    '</BucketName><RequestId>Xxfyd</RequestId><HostId>9Gjj</HostId></Error>\n\nDebug source:\nNotFound {\n'
    '    path: "x/index.json",\n    source: RetryError(...),\n}')


@pytest.fixture
def moto_keys(monkeypatch):
    """The docs' moto recipe: every key is the word ``test``."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "test")


def test_a_secret_that_is_also_a_folder_name_leaves_the_path_alone(moto_keys):
    text = "shard test/shard-000000.tar of s3://shards/test/: signature for key=test, token test failed"
    assert mask(text) == "shard test/shard-000000.tar of s3://shards/test/: signature for key=***, token *** failed"


def test_a_real_secret_is_masked_wherever_it_stands_alone(monkeypatch):
    secret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    assert secret not in one_line(OSError(f"bad signature (secret {secret}) for request"))
    assert one_line(OSError(f"secret={secret}")) == "secret=***"


def test_the_xml_body_becomes_its_code_and_message_and_the_timing_goes():
    line = one_line(FileNotFoundError(NO_SUCH_BUCKET))
    assert line.endswith("404 Not Found: NoSuchBucket: The specified bucket does not exist")
    assert "<" not in line and "ms" not in line and "Debug" not in line


def test_a_long_line_is_cut_at_a_word_and_says_so():
    words = " ".join(f"word{i}" for i in range(200))
    cut = shorten(words, 100)
    assert len(cut) <= 100 and cut.endswith("...") and cut[:-3].split()[-1] in words.split()
    assert shorten("short", 100) == "short"


def test_a_missing_bucket_is_one_whole_line_naming_the_endpoint(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:5000")
    e = refused(FileNotFoundError(NO_SUCH_BUCKET), parse_store_url("s3://nobucket/x/"), "index.json", "index.json")
    assert type(e) is StoreError
    assert str(e) == ("s3://nobucket/x/: the bucket 'nobucket' does not exist at http://127.0.0.1:5000 "
                      "(AWS_ENDPOINT_URL); check the bucket's name in the URL")


def test_what_waiting_may_cure_is_unavailable_and_what_it_cannot_is_not():
    url = parse_store_url("http://127.0.0.1:1/set/")
    refused_error = ConnectionRefusedError("error sending request (ConnectionRefused)")
    assert transient(refused_error) == "connection refused"
    e = unavailable(url, "index.json", 3, "connection refused", refused_error)
    assert isinstance(e, StoreUnavailable) and str(e).startswith("index.json of http://127.0.0.1:1/set/: 3 tries")
    assert transient(FileNotFoundError(NO_SUCH_BUCKET)) is None
    assert not isinstance(refused(FileNotFoundError("404"), url, "index.json", "index.json"), StoreUnavailable)
