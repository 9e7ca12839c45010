"""The client of a remote shard store: obstore's store for a URL, with credentials.

obstore (the Rust ``object_store`` crate) is an optional dependency, imported when a URL
is opened; without it, one line says what to install. S3 credentials come from the
environment (``AWS_*``), else from boto3's chain where boto3 is installed (profiles in
``~/.aws``, SSO, ...); ``AWS_SKIP_SIGNATURE`` reads a public bucket anonymously. Used by
``hasten.stream.remote_store.RemoteShards``.

Changes the training math: no.
"""

from __future__ import annotations

import os
from datetime import timedelta

from hasten.errors import DataError
from hasten.stream.store_errors import one_line
from hasten.stream.store_url import StoreURL

# hasten is installed from its source folder (it is not on the package index); the client alone also does.
EXTRA = "in hasten's source folder, pip install -e '.[remote]' (or the client alone: pip install obstore boto3)"


def store_client(url: StoreURL, timeout_s: float):
    """obstore's store for ``url``: ``timeout_s`` per request, plain http allowed, its own
    retries off; S3 credentials from boto3's chain where the environment gives none."""
    try:
        import obstore.store
    except ImportError:
        raise DataError(f"reading shards from {url.scheme}:// needs the client library obstore: {EXTRA}") from None
    options = {"timeout": timedelta(seconds=timeout_s), "connect_timeout": timedelta(seconds=min(timeout_s, 10)),
               # The endpoint is the user's choice (a local S3-compatible server is often plain http).
               "allow_http": True}
    kwargs = {}
    anonymous = _true(os.environ.get("AWS_SKIP_SIGNATURE"))
    if url.kind == "s3" and not os.environ.get("AWS_ACCESS_KEY_ID") and not anonymous:
        provider = _boto3_credentials()
        if provider is not None:  # profiles in ~/.aws, SSO, ...: the AWS SDK's own chain
            kwargs["credential_provider"] = provider
    try:
        # Retries are ours (``retry``): one bound, one count, and faults the library does not retry.
        return obstore.store.from_url(url.text.rstrip("/"), client_options=options, retry_config={"max_retries": 0},
                                      **kwargs)
    except Exception as e:  # noqa: BLE001 - the library's configuration errors, as one line
        raise DataError(f"cannot open {url}: {one_line(e)}") from None


def _true(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes")


def _boto3_credentials():
    """obstore's provider over boto3's credential chain when boto3 is installed and finds credentials."""
    try:
        import boto3
        from obstore.auth.boto3 import Boto3CredentialProvider
    except ImportError:
        return None
    session = boto3.Session()
    if session.get_credentials() is None:
        return None
    return Boto3CredentialProvider(session)
