"""Real storage servers for tests, and a proxy between the reader and a server that injects faults.

``ServerProcess`` runs a server from a pip package as a child process on a port of
its own: ``moto_s3`` the moto S3 server (``moto[server]``; its buckets live in its
memory), ``range_http`` RangeHTTPServer (``rangehttpserver``: Python's static file
server with Range support) serving a directory, ``plain_http`` Python's own
``http.server`` (no Range support) serving one. Either can be killed and started
again on the same port.

``FaultProxy`` listens on a port of its own and forwards each HTTP request to the
server, one request per connection (it answers ``Connection: close``), unless a
queued fault matches the request's path: ``reset`` (the connection is reset before
any answer), ``500``, ``503`` (S3's SlowDown), ``429``, ``truncate`` (the server's
answer cut to half its body, the connection then closed), ``corrupt`` (the answer
whole, one byte of its body changed) or ``stall`` (no answer until the proxy closes:
the reader's timeout). While the server is down the proxy
resets each connection. Every request is logged with what was done to it, so
tests count events, never time.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ANSWERS = {
    "500": (b"500 Internal Server Error", b"<Error><Code>InternalError</Code><Message>injected</Message></Error>"),
    "503": (b"503 Slow Down",
            b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"),
    "429": (b"429 Too Many Requests", b"too many requests (injected)"),
}
FAULTS = ("reset", "truncate", "corrupt", "stall", *ANSWERS)
REGION = "us-east-1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_listening(port: int, proc: subprocess.Popen, timeout_s: float, log: Path, ready: str) -> None:
    # Ready when the server's own log says so (not merely when the port answers: another
    # process may hold it) and the port takes connections.
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}: {log.read_text()[-2000:]}")
        if ready in log.read_text(errors="replace"):
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        time.sleep(0.05)
    raise RuntimeError(f"the server did not listen on port {port} within {timeout_s} s: {log.read_text()[-2000:]}")


class ServerProcess:
    """A server command run as a child process on ``port``; ``kill()`` and ``start()`` again.
    ``ready``: what the server writes to its log once it listens."""

    def __init__(self, argv: list[str], port: int, *, cwd: Path, log: Path, ready: str):
        self.argv, self.port, self.cwd, self.log, self.ready = argv, port, cwd, log, ready
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 60.0) -> "ServerProcess":
        self.log.write_bytes(b"")  # a restart's readiness is read from its own lines
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.argv, cwd=self.cwd, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.starts += 1
        _wait_listening(self.port, self.proc, timeout_s, self.log, self.ready)
        return self

    def kill(self) -> None:
        """SIGKILL: the process dies mid-answer, as a crashed store does."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def _started(make) -> ServerProcess:
    # A free port can be taken by another process (xdist runs test files side by side)
    # between the check and the server's bind: then the server exits, and another port is tried.
    for attempt in range(3):
        try:
            return make(free_port()).start()
        except RuntimeError:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def moto_s3(tmp: Path) -> ServerProcess:
    """The moto S3 server (``python -m moto.server``), started."""
    return _started(lambda port: ServerProcess(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], port, cwd=tmp,
        log=tmp / f"moto-{port}.log", ready="Running on"))


def range_http(root: Path, log_dir: Path) -> ServerProcess:
    """RangeHTTPServer serving ``root`` (``python -m RangeHTTPServer PORT -b 127.0.0.1``), started."""
    return _started(lambda port: ServerProcess(
        [sys.executable, "-m", "RangeHTTPServer", str(port), "-b", "127.0.0.1"], port, cwd=root,
        log=log_dir / f"http-{port}.log", ready="Serving HTTP on"))


def plain_http(root: Path, log_dir: Path) -> ServerProcess:
    """Python's own static file server serving ``root`` (``python -m http.server PORT --bind
    127.0.0.1``), started: the server most people start first. It ignores Range headers and
    answers every GET with 200 and the whole file."""
    return _started(lambda port: ServerProcess(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"], port, cwd=root,
        log=log_dir / f"plain-http-{port}.log", ready="Serving HTTP on"))


def s3_env(endpoint: str) -> dict[str, str]:
    """The environment an S3 client reads to talk to ``endpoint`` (moto takes any keys)."""
    return {"AWS_ACCESS_KEY_ID": "testing-key-id", "AWS_SECRET_ACCESS_KEY": "testing-secret-key",
            "AWS_ENDPOINT_URL": endpoint, "AWS_REGION": REGION, "AWS_DEFAULT_REGION": REGION}


def upload(endpoint: str, bucket: str, prefix: str, folder: Path) -> int:
    """Every file under ``folder`` put under s3://bucket/prefix/ (the bucket made if needed); the count."""
    import boto3

    env = s3_env(endpoint)
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name=REGION, aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                      aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"])
    with contextlib.suppress(s3.exceptions.BucketAlreadyOwnedByYou):
        s3.create_bucket(Bucket=bucket)
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    for p in files:
        s3.put_object(Bucket=bucket, Key=prefix + p.relative_to(folder).as_posix(), Body=p.read_bytes())
    return len(files)


@dataclass
class Fault:
    kind: str
    match: str  # a substring of the request's path
    times: int  # requests it still applies to


@dataclass
class Logged:
    method: str
    path: str
    done: str  # "forwarded", a fault's kind, or "down" (the server did not answer)


@dataclass
class FaultProxy:
    """A proxy to ``upstream_port`` injecting queued faults (module docstring)."""

    upstream_port: int
    port: int = 0
    faults: list[Fault] = field(default_factory=list)
    log: list[Logged] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Condition()
        self._server = socket.create_server(("127.0.0.1", self.port))
        self.port = self._server.getsockname()[1]
        self._stalled: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="fault-proxy").start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def inject(self, kind: str, match: str = "", times: int = 1) -> None:
        if kind not in FAULTS:
            raise ValueError(f"unknown fault {kind!r}; one of {FAULTS}")
        with self._lock:
            self.faults.append(Fault(kind, match, times))

    def clear(self) -> None:
        with self._lock:
            self.faults.clear()

    def count(self, done: str | None = None, match: str = "") -> int:
        with self._lock:
            return sum(1 for e in self.log if (done is None or e.done == done) and match in e.path)

    def wait_for(self, predicate, timeout_s: float = 60.0) -> None:
        """Block until ``predicate(self.log)`` holds (checked at every request)."""
        with self._lock:
            if not self._lock.wait_for(lambda: predicate(self.log), timeout=timeout_s):
                raise TimeoutError(f"the proxy saw no such request within {timeout_s} s; log: {self.log[-10:]}")

    def close(self) -> None:
        self._closed = True
        self._server.close()
        for s in self._stalled:
            with contextlib.suppress(OSError):
                s.close()

    # --- serving ---------------------------------------------------------------

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _fault_for(self, path: str) -> str | None:
        with self._lock:
            for f in self.faults:
                if f.times > 0 and f.match in path:
                    f.times -= 1
                    return f.kind
        return None

    def _record(self, method: str, path: str, done: str) -> None:
        with self._lock:
            self.log.append(Logged(method, path, done))
            self._lock.notify_all()

    def _serve(self, client: socket.socket) -> None:
        try:
            head, body = _read_request(client)
            if head is None:
                client.close()
                return
            method, path = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")[:2]
            kind = self._fault_for(path)
            if kind == "reset":
                self._record(method, path, kind)
                _reset(client)
                return
            if kind == "stall":
                self._record(method, path, kind)
                self._stalled.append(client)  # held open, unanswered, until the proxy closes
                return
            if kind in ANSWERS:
                self._record(method, path, kind)
                status, text = ANSWERS[kind]
                client.sendall(b"HTTP/1.1 " + status + b"\r\nContent-Type: application/xml\r\nContent-Length: "
                               + str(len(text)).encode() + b"\r\nConnection: close\r\n\r\n" + text)
                client.close()
                return
            try:
                answer = _forward(self.upstream_port, head, body)
            except OSError:
                self._record(method, path, "down")
                _reset(client)
                return
            if kind == "truncate":
                split = answer.index(b"\r\n\r\n") + 4
                answer = answer[:split + (len(answer) - split) // 2]
            if kind == "corrupt":
                at = answer.index(b"\r\n\r\n") + 4 + (len(answer) - answer.index(b"\r\n\r\n") - 4) // 2
                answer = answer[:at] + bytes([answer[at] ^ 0xFF]) + answer[at + 1:]
            self._record(method, path, kind or "forwarded")
            client.sendall(answer)
            client.close()
        except OSError:
            with contextlib.suppress(OSError):
                client.close()


def _read_request(sock: socket.socket) -> tuple[bytes | None, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return None, b""
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return head, body


def _with_close(head: bytes) -> bytes:
    """``head`` with its Connection header set to close (one request per connection)."""
    lines = [line for line in head.split(b"\r\n") if not line.lower().startswith((b"connection:", b"keep-alive:"))]
    return b"\r\n".join(lines + [b"Connection: close"]) + b"\r\n\r\n"


def _forward(port: int, head: bytes, body: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as up:
        up.sendall(_with_close(head) + body)
        chunks = []
        while chunk := up.recv(1 << 20):
            chunks.append(chunk)
    answer = b"".join(chunks)
    if b"\r\n\r\n" not in answer:
        raise ConnectionResetError("the server closed the connection without an answer")
    answer_head, answer_body = answer.split(b"\r\n\r\n", 1)
    return _with_close(answer_head) + answer_body


def _reset(sock: socket.socket) -> None:
    # SO_LINGER with a zero timeout: close() sends RST instead of FIN.
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
