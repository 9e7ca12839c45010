"""Shards in object storage or on a web server: the store behind ``open_shards(URL)``.

``RemoteShards`` is a shard store (``hasten.stream.shard_store``: ``len``,
``store[i] -> bytes``, ``names``, ``examples``, ``sizes``, ``classes``) whose shards
are objects under a URL (``hasten.stream.store_url``: s3://, gs://, az://,
http(s)://), laid out as ``hasten data pack`` writes them and uploaded as they are.
The index (``index.json``) is read first; a shard is then read as ranged GETs of
``part_bytes`` each, at most ``connections`` at once for the whole store (object
stores serve one connection at a fraction of what they serve several: parts in
parallel fill the link). A web server that ignores Range headers (``python -m
http.server`` answers 200 and the whole file), found by asking for one byte of the
index, has each shard read in one whole GET instead (``ranges`` false), streamed
into the cache file as it arrives. Every body is checked against the length asked
for, and the shard against the size and the SHA-256 in the index, before anything uses it:
the hash is taken in order as the parts arrive (from the page cache for parts written
into a cache file), so no shard is read twice for it; a mismatch is read once more, then
stops the run in one line (the store's copy is not the packed one).

Faults: a connection reset or refused, a timeout, a 5xx answer, throttling (503
SlowDown, 429) and a body cut short are retried with backoff
(``hasten.stream.retry``, ``retries`` per part); an answer a retry cannot change
(not found, access denied, no credentials) is not (``hasten.stream.store_errors``).
Retries are said while they happen (``hasten.stream.retry.Outage``). A shard that
keeps failing raises one ``hasten.errors.StoreUnavailable`` line naming the shard,
the store and the last error; a refused answer one ``StoreError`` line naming the
cause and the fix: nothing is skipped, so a run either gets every example of every
shard or stops.

``hasten.stream.remote_cache.open_remote_shards`` (what ``open_shards(URL)`` returns) puts the local
``ShardCache`` in front, in ``$HASTEN_CACHE/remote/<the index>/<split>``
(``remote_cache_dir``), which the ranks of one host share: epoch 1 reads from the store, later epochs from
the disk. The loader reads ``prefetch`` shards ahead of its decode workers
(``hasten.stream.epoch_plan.plan_records``). When the cache holds the whole split
(the default cap, disk permitting), each shard is streamed into its cache file part
by part, chunk by chunk (``write_to``: a chunk per GET in flight in memory) and then read as a
local shard is: its tar headers scanned, each image read by the decode worker that
decodes it, in epoch 1 as in epoch 2. With a smaller cap a shard could be evicted
while its images wait, so it is read whole (``store[i]``) and memory is bounded by
``prefetch`` shards.

The client is obstore (``hasten.stream.store_client``: why, and where the credentials
come from; never from the URL, and no message carries them).

Based on: Kumar et al., "Scale MLPerf-0.6 models on Google TPU-v3 Pods" (2019) and
the WebDataset practice of streaming tar shards from object storage; AWS's S3
performance guidance (parallel byte-range GETs of 8-16 MB).

Changes the training math: no.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from hasten.errors import DataError, StoreError
from hasten.stream.retry import Outage, RetriesExhausted, RetryPolicy, call as call_with_retries
from hasten.stream.store_client import store_client
from hasten.stream.store_errors import INDEX, ShortBody, refused, transient, unavailable
from hasten.stream.store_url import StoreURL, parse_store_url

PART_BYTES = 8 << 20  # AWS's guidance for ranged GETs: 8-16 MB
CHUNK_BYTES = 1 << 20  # a body written to the cache file in chunks of at least this (the last one less)
CONNECTIONS = 8


class RemoteShards:
    """The shards of ``split`` under ``url`` (module docstring).

    ``retry``: the backoff policy of every request (``RetryPolicy``); ``part_bytes``:
    bytes per ranged GET; ``connections``: GETs in flight at once for the whole
    store; ``timeout_s``: one GET's limit (a stalled connection is a failed try).
    Counters: ``requests`` (GETs made), ``bytes_read`` (body bytes received),
    ``retried`` ((name, reason) of each retry, the most recent 1000), ``retries``
    (their number), ``checksum_mismatches`` (shards read whose SHA-256 was not the index's),
    ``peak_bytes`` (most shard bytes held at once by reads in progress);
    ``ranges``: whether shards are read in ranged parts (false: one whole GET each).
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
        self.requests = self.retries = self.peak_bytes = self.bytes_read = self.checksum_mismatches = 0
        self.retried: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._held = 0
        self._outage = Outage(f"store {self.url}", self.policy)
        self._client = store_client(self.url, self.timeout_s)
        self._pool = ThreadPoolExecutor(max_workers=connections, thread_name_prefix="hasten-get")
        self.index_bytes = self._index()
        self._parse_index(self.index_bytes, split)
        # Object stores answer Range requests; a web server may not (python -m http.server
        # answers 200 with the whole file): then each shard is one GET of the whole object,
        # with the time limit of its parts together.
        self.ranges = self.url.kind != "http" or self._answers_ranges()
        self._whole_client = None if self.ranges else store_client(
            self.url, self.timeout_s * max(1, -(-max(self.sizes, default=0) // self.part_bytes)))

    # --- the store interface -------------------------------------------------

    def __len__(self) -> int:
        return len(self.names)

    @property
    def total(self) -> int:
        return sum(self.examples)

    def __getitem__(self, i: int) -> bytes:
        return self._checked(i, self._read)

    def write_to(self, i: int, fd: int) -> None:
        """Shard i written into the open file ``fd``, each part at its offset as it arrives
        (``ShardCache.shard_file``): a chunk of a part is in memory only from its arrival to its
        write, so at most ``connections`` chunks at once, and nothing is joined or copied here.
        ``fd`` is open for reading too (each part is hashed from it). Raises ``StoreError`` as
        ``store[i]`` does, ``OSError`` when the file cannot be written."""
        self._checked(i, lambda i: self._write(i, fd))

    def _checked(self, i: int, read):
        """``read(i)`` -> (result, SHA-256 of the shard's bytes, or None when the index gives
        none), the digest checked against the index's: a mismatch is read once more (a body
        damaged on the way), then one ``StoreError`` line (the store's copy is not the packed one)."""
        name, want, seen = self.names[i], self.checksums[i], []
        for _ in range(2):
            result, got = read(i)
            if want is None or got == want:
                return result
            seen.append(got)
            with self._lock:
                self.checksum_mismatches += 1
        raise StoreError(f"shard {name} of {self.url}: its SHA-256 is not the one index.json gives after 2 reads "
                         f"(read {', '.join(g[:12] for g in seen)}; the index says {want[:12]}): the store's copy "
                         f"differs from the packed shard; upload the packed shards and index.json again")

    def _read(self, i: int) -> tuple[bytes, str | None]:
        name, size = self.names[i], self.sizes[i]
        if not self.ranges:
            return self._pool.submit(self._whole, name, size, None, self.checksums[i] is not None).result()
        with self._lock:
            self._held += size
            self.peak_bytes = max(self.peak_bytes, self._held)
        try:
            starts = list(range(0, size, self.part_bytes)) or [0]
            parts = [self._pool.submit(self._part, name, start, min(start + self.part_bytes, size))
                     for start in starts]
            # Hashed in order as the parts arrive, while the later ones are still on their way.
            digest = hashlib.sha256() if self.checksums[i] is not None else None
            try:
                bodies = []
                for p in parts:
                    bodies.append(memoryview(p.result()))
                    if digest is not None:
                        digest.update(bodies[-1])
                data = b"".join(bodies)
                del bodies
            finally:
                for p in parts:
                    p.cancel()
        finally:
            with self._lock:
                self._held -= size
        if len(data) != size:  # (each part was checked; this holds by construction)
            raise StoreError(f"shard {name} of {self.url}: {len(data)} bytes read, the index says {size}")
        return data, None if digest is None else digest.hexdigest()

    def _write(self, i: int, fd: int) -> tuple[None, str | None]:
        """``write_to``'s work: the file written, and its SHA-256 where the index gives one."""
        name, size = self.names[i], self.sizes[i]
        os.ftruncate(fd, 0)
        if not self.ranges:
            return self._pool.submit(self._whole, name, size, fd, self.checksums[i] is not None).result()
        # Each part writes through its own duplicate of fd and closes it: when one part fails, the
        # error is raised at once, and parts still running (retrying) write into the file (which
        # the caller discards) through a descriptor that no other file can have reused.
        parts = []
        for start in range(0, size, self.part_bytes):
            part_fd = os.dup(fd)
            parts.append((self._pool.submit(self._part_to_file, name, start, min(start + self.part_bytes, size),
                                            part_fd), part_fd))
        # Each part hashed in order once it is written, from the page cache (its body is gone
        # by then: holding bodies that arrive early would lift the bound on memory).
        digest = hashlib.sha256() if self.checksums[i] is not None else None
        try:
            for p, _ in parts:
                start = p.result()
                if digest is not None:
                    digest.update(os.pread(fd, min(self.part_bytes, size - start), start))
        finally:
            for p, part_fd in parts:
                if p.cancel():  # never ran: its descriptor was never handed over
                    os.close(part_fd)
        written = os.fstat(fd).st_size
        if written != size:  # (each part was checked; this holds by construction)
            raise StoreError(f"shard {name} of {self.url}: {written} bytes written, the index says {size}")
        return None, None if digest is None else digest.hexdigest()

    def _part_to_file(self, name: str, start: int, end: int, fd: int) -> int:
        """One part written at its offset through ``fd`` (which it closes) as it arrives; its offset."""
        import obstore

        def get():
            with self._lock:
                self.requests += 1
            result = obstore.get(self._client, name, options={"range": (start, end)})
            self._stream(result, end - start, f"at byte {start}", self._writer(fd, start))

        try:
            self._call(get, name, f"shard {name}")
        finally:
            os.close(fd)
        return start

    def _stream(self, result, length: int, where: str, write) -> None:
        """A GET's body, ``length`` bytes, handed to ``write(chunk, at)`` chunk by chunk (at least
        ``CHUNK_BYTES``) as it arrives; ``ShortBody`` if it is not ``length`` bytes. Not
        ``get_range``'s body: obstore gathers that into a fresh buffer per part, whose page faults
        and copy cost the reader more CPU per GB than the writes (``benchmarks/remote_cpu.py``)."""
        done = 0
        for chunk in result.stream(min_chunk_size=min(length, CHUNK_BYTES) or 1):
            view = memoryview(chunk)
            if done + len(view) > length:
                raise ShortBody(f"more than the {length} bytes {where}")
            write(view, done)
            done += len(view)
            with self._lock:
                self.bytes_read += len(view)
        if done != length:
            raise ShortBody(f"{done} of {length} bytes {where}")

    def _writer(self, fd: int, offset: int):
        """``write(chunk, at)`` for ``_stream``: the chunk at ``offset + at`` of ``fd``, held until written."""
        def write(view, at):
            with self._lock:
                self._held += len(view)
                self.peak_bytes = max(self.peak_bytes, self._held)
            try:
                done = 0
                while done < len(view):
                    done += os.pwrite(fd, view[done:], offset + at + done)
            finally:
                with self._lock:
                    self._held -= len(view)
        return write

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

    def _whole(self, name: str, size: int, fd: int | None, hashed: bool):
        """A shard as one GET of the whole object (a server without Range support), checked
        against the index's size: (its bytes, or None when ``fd`` is given and it was written into
        the file ``fd`` chunk by chunk as they arrive, a chunk in memory at a time (a retry starts
        the file over); with ``hashed`` its SHA-256, taken as the chunks arrive, else None)."""
        import obstore

        def get():
            with self._lock:
                self.requests += 1
            result, chunks = obstore.get(self._whole_client, name), []
            digest = hashlib.sha256() if hashed else None
            if fd is not None:
                os.ftruncate(fd, 0)
            sink = self._writer(fd, 0) if fd is not None else lambda view, _: chunks.append(view)

            def write(view, at):
                if digest is not None:
                    digest.update(view)
                sink(view, at)
            self._stream(result, size, "the index gives", write)
            return b"".join(chunks) if fd is None else None, None if digest is None else digest.hexdigest()

        with self._lock:
            self._held += size if fd is None else 0
            self.peak_bytes = max(self.peak_bytes, self._held)
        try:
            return self._call(get, name, f"shard {name}")
        finally:
            with self._lock:
                self._held -= size if fd is None else 0

    def _call(self, request, name: str, what: str, policy: RetryPolicy | None = None):
        policy = policy or self.policy
        try:
            result = call_with_retries(request, policy=policy, transient=transient,
                                       on_retry=lambda k, reason: self._count(name, reason, policy))
        except RetriesExhausted as e:
            raise unavailable(self.url, what, e.tries, e.reason, e.last) from None
        except Exception as e:  # noqa: BLE001 - an answer no retry changes, as one line
            raise refused(e, self.url, name, what) from None
        self._outage.answered()
        return result

    def _count(self, name: str, reason: str, policy: RetryPolicy) -> None:
        with self._lock:
            self.retries += 1
            self.retried.append((name, reason))
            del self.retried[:-1000]
        self._outage.retrying(name, reason, policy)

    # --- the index -----------------------------------------------------------

    def _index(self) -> bytes:
        import obstore

        def get():
            with self._lock:
                self.requests += 1
            return bytes(obstore.get(self._client, INDEX).bytes())

        return self._call(get, INDEX, INDEX, self._first_policy())

    def _first_policy(self) -> RetryPolicy:
        # At most 2 retries: a store that does not answer at the start is most often a wrong
        # URL or endpoint, to be said at once; mid-run, the full policy rides out a restart.
        return replace(self.policy, retries=min(self.policy.retries, 2))

    def _answers_ranges(self) -> bool:
        """Whether the web server answers a Range request with the range (one byte of the index)."""
        import obstore
        from obstore.exceptions import NotSupportedError

        def get():
            with self._lock:
                self.requests += 1
            try:
                obstore.get_range(self._client, INDEX, start=0, end=1)
            except NotSupportedError as e:
                if "Range" not in str(e):
                    raise
                return False
            return True

        return self._call(get, INDEX, INDEX, self._first_policy())

    def _parse_index(self, raw: bytes, split: str) -> None:
        where = self.url.join(INDEX)
        try:
            index = json.loads(raw)
            shards = index["splits"][split]["shards"]
            self.names = [str(s["name"]) for s in shards]
            self.examples = [int(s["examples"]) for s in shards]
            self.sizes = [int(s["bytes"]) for s in shards]
            self.checksums = [s.get("sha256") for s in shards]
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

