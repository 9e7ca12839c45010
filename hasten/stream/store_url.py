"""Where remote shards are: the URL forms hasten reads, checked before any request.

A directory of shards written by ``hasten data pack`` and uploaded as it is can be
read from object storage or a web server by its URL (``hasten.stream.remote_store``):

    s3://BUCKET/PREFIX/          (also s3a://; S3-compatible servers via AWS_ENDPOINT_URL)
    gs://BUCKET/PREFIX/          Google Cloud Storage
    az://CONTAINER/PREFIX/       Azure Blob Storage (also azure://, abfs://, abfss://, adl://)
    https://HOST/PATH/           any web server that serves files (also http://; with or without Range)

``parse_store_url`` turns a mistake into one ``DataError`` line before anything is
read: an unknown scheme, a missing bucket or host, and credentials written into the
URL, which are refused because the URL is printed in messages and stored in the
run directory (``config.json``, ``environment.json``): credentials come from each
store's standard places instead (``docs/remote.md``). A query or fragment is
refused too: shard names are appended to the URL's path.

Changes the training math: no.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from hasten.errors import DataError

# scheme -> the kind of store (what the client library calls it)
SCHEMES = {"s3": "s3", "s3a": "s3", "gs": "gcs", "az": "azure", "azure": "azure", "abfs": "azure",
           "abfss": "azure", "adl": "azure", "http": "http", "https": "http"}
# The schemes --help names (one per kind of store; the aliases above are accepted too).
HELP_SCHEMES = "s3://, gs://, az://, http://, https://"
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
# Where each kind of store looks for credentials, for the message that says none were found.
CREDENTIALS = {
    "s3": "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, a profile in ~/.aws/credentials (AWS_PROFILE), "
          "or AWS_SKIP_SIGNATURE=true for a public bucket",
    "gcs": "GOOGLE_APPLICATION_CREDENTIALS, or `gcloud auth application-default login`",
    "azure": "AZURE_STORAGE_ACCOUNT_NAME with AZURE_STORAGE_ACCOUNT_KEY (or AZURE_STORAGE_SAS_KEY)",
    "http": "none: a web server is read without credentials",
}


@dataclass(frozen=True)
class StoreURL:
    """A checked URL of a directory of shards: ``text`` always ends with one ``/``."""

    text: str
    scheme: str
    kind: str  # s3, gcs, azure or http
    bucket: str  # the bucket or container; the host for http(s)
    prefix: str  # the path inside it, "" or ending with "/"

    def __str__(self) -> str:
        return self.text

    def join(self, name: str) -> str:
        """The URL of ``name`` (a path relative to the directory), for messages."""
        return self.text + name


def is_url(path) -> bool:
    """Whether ``path`` is written as a URL (``scheme://...``) rather than a local path."""
    return isinstance(path, str) and bool(_URL.match(path))


def parse_store_url(text: str) -> StoreURL:
    """``text`` checked as the URL of a directory of shards; one ``DataError`` line if it cannot be."""
    if not is_url(text):
        raise DataError(f"{text!r} is not a URL (scheme://...)")
    scheme = text.split("://", 1)[0].lower()
    if scheme == "file":
        raise DataError(f"{text!r}: give a local directory as a path, without file://")
    if scheme not in SCHEMES:
        raise DataError(f"unknown URL scheme {scheme}:// in {text!r}; hasten reads shards from "
                        f"{', '.join(s + '://' for s in SCHEMES)} or a local directory")
    parts = urlsplit(text)
    if "@" in parts.netloc:
        # Never echo the URL back: it holds a secret.
        raise DataError(f"the {scheme}:// URL holds credentials (user:password@); they would be printed and stored "
                        "with the run. Remove them and give them the store's standard way: "
                        f"{CREDENTIALS[SCHEMES[scheme]]}")
    if parts.query or parts.fragment:
        raise DataError(f"{text!r}: a URL with a ?query or #fragment cannot name a directory of shards "
                        "(shard names are appended to its path)")
    kind = SCHEMES[scheme]
    bucket = parts.netloc
    if not bucket:
        what = "host" if kind == "http" else "container" if kind == "azure" else "bucket"
        raise DataError(f"no {what} in {text!r}; write {scheme}://{what.upper()}/PREFIX/")
    path = parts.path.strip("/")
    prefix = path + "/" if path else ""
    return StoreURL(f"{scheme}://{bucket}/{prefix}", scheme, kind, bucket, prefix)


def data_argument(text: str) -> str:
    """``--data``: a URL of remote shards (checked, as ``StoreURL.text``) or a local path that exists."""
    if is_url(text):
        try:
            return parse_store_url(text).text
        except DataError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    from hasten.cli_types import existing_path

    return existing_path(text)
