"""Shards in object storage or on a web server: the store behind ``open_shards(URL)``.

``RemoteShards`` is a shard store (``hasten.stream.shard_store``: ``len``,
``store[i] -> bytes``, ``names``, ``examples``, ``sizes``, ``classes``) whose shards
are objects under a URL (``hasten.stream.store_url``: s3://, gs://, az://,
http(s)://), laid out as ``hasten data pack`` writes them and uploaded as they are.
The index (``index.json``) is read first; a shard is then read as ranged GETs of
``part_bytes`` each, at most ``connections`` at once for the whole store (object
stores serve one connection at a fraction of what they serve several: parts in
parallel fill the link). Every part's body is checked against the length asked
for, and the shard against the size in the index, before anything uses it.

Faults: a connection reset or refused, a timeout, a 5xx answer, throttling (503
SlowDown, 429) and a body cut short are retried with backoff
(``hasten.stream.retry``, ``retries`` per part); an answer a retry cannot change
(not found, access denied, no credentials) is not. A shard that keeps failing
raises one ``hasten.errors.StoreError`` line naming the shard, the store and the
last error: nothing is skipped, so a run either gets every example of every
shard or stops.

``open_remote_shards`` (what ``open_shards(URL)`` returns) puts the local
``ShardCache`` in front, in ``$HASTEN_CACHE/remote/<the URL and index>/<split>``,
which the ranks of one host share: epoch 1 reads from the store, later epochs from
the disk. The loader reads ``prefetch`` shards ahead of its decode workers
(``hasten.stream.epoch_plan.plan_records``). When the cache holds the whole split
(the default cap, disk permitting), each shard is streamed into its cache file part
by part (``write_to``: at most ``connections`` parts in memory) and then read as a
local shard is: its tar headers scanned, each image read by the decode worker that
decodes it, in epoch 1 as in epoch 2. With a smaller cap a shard could be evicted
while its images wait, so it is read whole (``store[i]``) and memory is bounded by
``prefetch`` shards.

The client is obstore (the Rust ``object_store`` crate), an optional dependency
(``pip install 'hasten[remote]'``), imported when a URL is opened; chosen over
fsspec with s3fs by measurement (``benchmarks/remote_clients.py``, docs/remote.md).
Credentials come from each store's standard places (environment variables,
``~/.aws`` through boto3, the cloud's metadata service), are never part of the
URL, and no message carries them.

Based on: Kumar et al., "Scale MLPerf-0.6 models on Google TPU-v3 Pods" (2019) and
the WebDataset practice of streaming tar shards from object storage; AWS's S3
performance guidance (parallel byte-range GETs of 8-16 MB).

Changes the training math: no.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

from hasten.errors import DataError, StoreError
from hasten.stream.retry import RetriesExhausted, RetryPolicy, call as call_with_retries
from hasten.stream.store_url import CREDENTIALS, StoreURL, parse_store_url

INDEX = "index.json"
PART_BYTES = 8 << 20  # AWS's guidance for ranged GETs: 8-16 MB
CONNECTIONS = 8
EXTRA = "pip install 'hasten[remote]'"
# Environment variables whose values are secrets: scrubbed from any message, whatever prints it.
_SECRETS = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID", "GOOGLE_SERVICE_ACCOUNT_KEY",
            "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_SAS_KEY", "AZURE_STORAGE_TOKEN")


class ShortBody(OSError):
    """A body shorter or longer than asked for: the connection was cut, or the object changed."""


def _client(url: StoreURL, timeout_s: float):
    try:
        import obstore.store
    except ImportError:
        raise DataError(f"reading shards from {url.scheme}:// needs the optional client library: {EXTRA}") from None
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
        raise DataError(f"cannot open {url}: {_one_line(e)}") from None


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


# What the library's debug dump says beneath "error sending request", in words.
_CAUSES = (("ConnectionRefused", "connection refused"), ("ConnectionReset", "connection reset"),
           ("UnexpectedEof", "body cut short"), ("IncompleteBody", "body cut short"),
           ("kind: Timeout", "timed out"), ("dns error", "host name not found"), ("BrokenPipe", "connection broken"))


def _cause(e: BaseException) -> str | None:
    text = str(e)
    return next((words for marker, words in _CAUSES if marker in text), None)


def _one_line(e: BaseException) -> str:
    """An error as one short line with no secrets (the library's messages add a long debug dump,
    of which the cause is kept)."""
    text = " ".join(str(e).split("\n\nDebug source", 1)[0].split()) or type(e).__name__
    cause = _cause(e)
    if cause is not None and cause not in text:
        text = f"{text} ({cause})"
    for name in _SECRETS:
        value = os.environ.get(name)
        if value and len(value) >= 4:
            text = text.replace(value, "***")
    return text[:400]


_STATUS = re.compile(r"status code: (\d{3})")


def transient(e: BaseException) -> str | None:
    """Why a retry may fix ``e`` (a short reason), or None when it cannot."""
    if isinstance(e, ShortBody):
        return f"body cut short ({e})"
    if isinstance(e, (FileNotFoundError, PermissionError)):
        return None
    name = type(e).__name__
    if name in ("PermissionDeniedError", "UnauthenticatedError", "InvalidPathError", "NotSupportedError",
                "UnknownConfigurationKeyError"):
        return None
    text = _one_line(e)
    status = _STATUS.search(text)
    if status is not None:
        code = int(status.group(1))
        if code >= 500 or code in (408, 429):
            return f"HTTP {code}"
        return None  # 4xx: the request itself is wrong
    if _no_credentials(text):
        return None
    if isinstance(e, OSError) or name in ("GenericError", "BaseError", "JoinError"):
        # Connection refused or reset, a timeout, a body that stopped: worth retrying.
        return _cause(e) or "connection error"
    return None


def _no_credentials(text: str) -> bool:
    # Without credentials in the environment the client asks the cloud's metadata service
    # (169.254.169.254 at /latest/api/token, metadata.google.internal), absent off the cloud.
    low = text.lower()
    return any(m in low for m in ("169.254.169.254", "/latest/api/token", "/latest/meta-data",
                                  "metadata.google.internal", "credential"))


class RemoteShards:
    """The shards of ``split`` under ``url`` (module docstring).

    ``retry``: the backoff policy of every request (``RetryPolicy``); ``part_bytes``:
    bytes per ranged GET; ``connections``: GETs in flight at once for the whole
    store; ``timeout_s``: one GET's limit (a stalled connection is a failed try).
    Counters: ``requests`` (GETs made), ``bytes_read`` (body bytes received),
    ``retried`` ((name, reason) of each retry, the most recent 1000), ``retries``
    (their number), ``peak_bytes`` (most shard bytes held at once by reads in progress).
    """

    def __init__(self, url: str | StoreURL, split: str = "train", *, retry: RetryPolicy | None = None,
                 part_bytes: int = PART_BYTES, connections: int = CONNECTIONS, timeout_s: float = 60.0):
        for name, value in (("part_bytes", part_bytes), ("connections", connections)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1; got {value!r}")
        if not (isinstance(timeout_s, (int, float)) and 0 < timeout_s < float("inf")):
            raise ValueError(f"timeout_s must be a finite number of seconds > 0; got {timeout_s!r}")
        self.url = url if isinstance(url, StoreURL) else parse_store_url(url)
        self.split = split
        self.policy = retry or RetryPolicy()
        self.part_bytes, self.connections, self.timeout_s = part_bytes, connections, float(timeout_s)
        self.requests = self.retries = self.peak_bytes = self.bytes_read = 0
        self.retried: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._held = 0
        self._client = _client(self.url, self.timeout_s)
        self._pool = ThreadPoolExecutor(max_workers=connections, thread_name_prefix="hasten-get")
        self.index_bytes = self._index()
        self._parse_index(self.index_bytes, split)

    # --- the store interface -------------------------------------------------

    def __len__(self) -> int:
        return len(self.names)

    @property
    def total(self) -> int:
        return sum(self.examples)

    def __getitem__(self, i: int) -> bytes:
        name, size = self.names[i], self.sizes[i]
        with self._lock:
            self._held += size
            self.peak_bytes = max(self.peak_bytes, self._held)
        try:
            starts = list(range(0, size, self.part_bytes)) or [0]
            parts = [self._pool.submit(self._part, name, start, min(start + self.part_bytes, size))
                     for start in starts]
            try:
                data = b"".join(memoryview(p.result()) for p in parts)
            finally:
                for p in parts:
                    p.cancel()
        finally:
            with self._lock:
                self._held -= size
        if len(data) != size:  # (each part was checked; this holds by construction)
            raise StoreError(f"shard {name} of {self.url}: {len(data)} bytes read, the index says {size}")
        return data

    def write_to(self, i: int, fd: int) -> None:
        """Shard i written into the open file ``fd``, each part at its offset as it arrives
        (``ShardCache.shard_file``): a part is in memory only from its arrival to its write,
        so at most ``connections`` parts at once, and nothing is joined or copied here.
        Raises ``StoreError`` as ``store[i]`` does, ``OSError`` when the file cannot be written."""
        name, size = self.names[i], self.sizes[i]
        os.ftruncate(fd, 0)
        # Each part writes through its own duplicate of fd and closes it: when one part fails, the
        # error is raised at once, and parts still running (retrying) write into the file (which
        # the caller discards) through a descriptor that no other file can have reused.
        parts = []
        for start in range(0, size, self.part_bytes):
            part_fd = os.dup(fd)
            parts.append((self._pool.submit(self._part_to_file, name, start, min(start + self.part_bytes, size),
                                            part_fd), part_fd))
        try:
            for p, _ in parts:
                p.result()
        finally:
            for p, part_fd in parts:
                if p.cancel():  # never ran: its descriptor was never handed over
                    os.close(part_fd)
        written = os.fstat(fd).st_size
        if written != size:  # (each part was checked; this holds by construction)
            raise StoreError(f"shard {name} of {self.url}: {written} bytes written, the index says {size}")

    def _part_to_file(self, name: str, start: int, end: int, fd: int) -> None:
        """One part fetched and written at its offset through ``fd``, which it closes."""
        try:
            body = self._part(name, start, end)
            with self._lock:
                self._held += len(body)
                self.peak_bytes = max(self.peak_bytes, self._held)
            try:
                view, done = memoryview(body), 0
                while done < len(view):
                    done += os.pwrite(fd, view[done:], start + done)
            finally:
                with self._lock:
                    self._held -= len(body)
        finally:
            os.close(fd)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def __repr__(self) -> str:
        return f"RemoteShards({str(self.url)!r}, {self.split!r}: {len(self)} shards)"

    # --- requests ------------------------------------------------------------

    def _part(self, name: str, start: int, end: int):
        import obstore

        def get():
            with self._lock:
                self.requests += 1
            if end == start:
                return b""
            body = obstore.get_range(self._client, name, start=start, end=end)
            with self._lock:
                self.bytes_read += len(body)
            if len(body) != end - start:
                raise ShortBody(f"{len(body)} of {end - start} bytes at byte {start}")
            return body

        return self._call(get, name, f"shard {name}")

    def _call(self, request, name: str, what: str, policy: RetryPolicy | None = None):
        try:
            return call_with_retries(request, policy=policy or self.policy, transient=transient,
                                on_retry=lambda k, reason: self._count(name, reason))
        except RetriesExhausted as e:
            tries = "1 try" if e.tries == 1 else f"{e.tries} tries"
            raise StoreError(f"{what} of {self.url}: {tries} failed ({e.reason}); last error: "
                             f"{_one_line(e.last)}") from None
        except Exception as e:  # noqa: BLE001 - an answer no retry changes, as one line
            raise self._refused(e, name, what) from None

    def _count(self, name: str, reason: str) -> None:
        with self._lock:
            self.retries += 1
            self.retried.append((name, reason))
            del self.retried[:-1000]

    def _refused(self, e: BaseException, name: str, what: str) -> StoreError:
        text = _one_line(e)
        if self.url.kind == "s3" and "NoSuchBucket" in text:
            return StoreError(f"{self.url}: the bucket {self.url.bucket!r} does not exist ({text[:160]})")
        if isinstance(e, FileNotFoundError) or "status code: 404" in text:
            if name == INDEX:
                return StoreError(f"no {INDEX} at {self.url}: pack the data with `hasten data pack SRC OUTDIR` and "
                                  "upload OUTDIR whole (docs/remote.md)")
            return StoreError(f"{what} is listed in {self.url.join(INDEX)} but not at {self.url.join(name)}: "
                              "upload the packed directory whole")
        if _no_credentials(text) or type(e).__name__ in ("UnauthenticatedError", "PermissionDeniedError") \
                or re.search(r"status code: 40[13]", text):
            return StoreError(f"{self.url}: no credentials, or they do not give access ({text[:200]}); "
                              f"credentials are read from: {CREDENTIALS[self.url.kind]}")
        return StoreError(f"{what} of {self.url}: {text}")

    # --- the index -----------------------------------------------------------

    def _index(self) -> bytes:
        import obstore

        def get():
            with self._lock:
                self.requests += 1
            return bytes(obstore.get(self._client, INDEX).bytes())

        # At most 2 retries: a store that does not answer at the start is most often a wrong
        # URL or endpoint, to be said at once; mid-run, the full policy rides out a restart.
        first = RetryPolicy(min(self.policy.retries, 2), self.policy.first_s, self.policy.max_s)
        return self._call(get, INDEX, INDEX, first)

    def _parse_index(self, raw: bytes, split: str) -> None:
        where = self.url.join(INDEX)
        try:
            index = json.loads(raw)
            shards = index["splits"][split]["shards"]
            self.names = [str(s["name"]) for s in shards]
            self.examples = [int(s["examples"]) for s in shards]
            self.sizes = [int(s["bytes"]) for s in shards]
            self.classes = list(index.get("classes", []))
            self.source = index.get("source")
        except KeyError as e:
            splits = sorted(index.get("splits", {})) if isinstance(index, dict) else "none"
            raise DataError(f"{where}: no {e} entry (splits present: {splits})") from None
        except (ValueError, TypeError, AttributeError) as e:
            raise DataError(f"{where} is not a readable shard index ({type(e).__name__}: {e})") from None
        for name in self.names:
            if name.startswith("/") or ".." in name.split("/"):
                raise DataError(f"{where}: shard name {name!r} leaves the directory")


def remote_cache_dir(store: RemoteShards) -> Path:
    """``$HASTEN_CACHE/remote/<bucket and prefix>-<digest of the URL and the index>/<split>``:
    a repacked set (a new index) gets a new directory, never the old set's shards."""
    from hasten.data.cache import cache_dir

    digest = hashlib.sha256(str(store.url).encode() + b"\0" + store.index_bytes).hexdigest()[:12]
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", f"{store.url.bucket}/{store.url.prefix}").strip("-")[:60]
    return cache_dir() / "remote" / f"{slug}-{digest}" / store.split


def open_remote_shards(url: str | StoreURL, split: str = "train", *, retry: RetryPolicy | None = None,
                       cache_dir: str | os.PathLike | None = None, cache_bytes: int | None = None, **options):
    """``RemoteShards`` behind a local ``ShardCache`` (module docstring). ``cache_dir``: the
    cache's directory (default ``remote_cache_dir``); ``cache_bytes``: its cap (default: the
    whole split, or half the disk's free space when that is less). ``options``: ``RemoteShards``'s."""
    from hasten.stream.shard_cache import ShardCache

    store = RemoteShards(url, split, retry=retry, **options)
    directory = Path(cache_dir).expanduser() if cache_dir is not None else remote_cache_dir(store)
    cache = ShardCache(store, directory, max_bytes=0 if cache_bytes is None else cache_bytes)
    if cache_bytes is None:
        # Half the free space at most: checkpoints and other runs need the disk too.
        cache.max_bytes = min(sum(store.sizes), shutil.disk_usage(directory).free // 2)
    return cache
