"""The delay relay: every byte arrives, in order, and a round trip through it takes at
least twice the one-way delay (a lower bound that holds by construction; no upper bound
on a loaded machine)."""

import socket
import subprocess
import sys
import threading
import time

import pytest
from store_servers import free_port

DELAY_MS = 150


def echo_server(sock: socket.socket) -> None:
    conn, _ = sock.accept()
    with conn:
        while data := conn.recv(65536):
            conn.sendall(data)


@pytest.fixture
def relay():
    upstream = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=echo_server, args=(upstream,), daemon=True).start()
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "hasten.harness.delay_relay", "--delay-ms", str(DELAY_MS),
                             f"127.0.0.1:{port}=127.0.0.1:{upstream.getsockname()[1]}"],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "relaying"
    yield port
    proc.terminate()
    proc.wait(timeout=10)
    upstream.close()


def test_every_byte_comes_back_in_order_after_at_least_the_round_trip(relay):
    payload = bytes(range(256)) * 8192  # 2 MiB: several chunks each way
    with socket.create_connection(("127.0.0.1", relay), timeout=30) as s:
        t0 = time.monotonic()
        s.sendall(b"x")
        assert s.recv(1) == b"x"
        assert time.monotonic() - t0 >= 2 * DELAY_MS / 1e3
        threading.Thread(target=s.sendall, args=(payload,), daemon=True).start()
        got = bytearray()
        while len(got) < len(payload):
            got += s.recv(1 << 20)
    assert bytes(got) == payload


def test_a_bad_route_is_one_line_and_exit_2():
    done = subprocess.run([sys.executable, "-m", "hasten.harness.delay_relay", "--delay-ms", "10", "nonsense"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "LISTEN_HOST:PORT=TARGET_HOST:PORT" in done.stderr
    assert "Traceback" not in done.stderr
