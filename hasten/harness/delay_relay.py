"""A TCP relay that holds every byte for a fixed time each way: added latency without sch_netem.

The usual way to give an emulated link a round-trip time is the ``netem`` qdisc
(``tc qdisc add dev X root netem delay 10ms``); a kernel built without
``sch_netem`` (as here: only htb, tbf and pfifo are available) cannot delay packets
with tc at all. This relay is the documented stand-in: it runs beside a server (in
the server's network namespace), accepts the client's connections on one address
and opens one to the server per connection, and forwards each chunk of bytes
``delay_s`` after it arrived, in both directions. A request therefore reaches the
server ``delay_s`` late and its answer's every byte the client ``delay_s`` late:
``2 * delay_s`` is added to each request-response round trip, and a stream keeps
its rate (bytes in flight are held, not throttled).

What it is not: packet-level delay. TCP between the client and the relay sees the
link's own round trip (well under a millisecond), so slow start and the window
needed to fill a long link (rate x RTT) are not emulated; each connection behaves
as if its window were unlimited. Label results "20 ms request round trip (userspace
relay)", not "20 ms RTT link".

    python -m hasten.harness.delay_relay --delay-ms 10 HOST:PORT=TARGET_HOST:TARGET_PORT [...]

Changes the training math: no (a test harness).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import time
from collections import deque

CHUNK = 1 << 20


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_s: float) -> None:
    """Copies reader to writer, each chunk written ``delay_s`` after it was read."""
    queue: deque[tuple[float, bytes]] = deque()
    arrived = asyncio.Event()
    done = False

    async def receive() -> None:
        nonlocal done
        try:
            while data := await reader.read(CHUNK):
                queue.append((time.monotonic() + delay_s, data))
                arrived.set()
        except (ConnectionError, OSError):
            pass
        finally:
            done = True
            arrived.set()

    receiver = asyncio.ensure_future(receive())
    try:
        while True:
            if not queue:
                if done:
                    break
                arrived.clear()
                await arrived.wait()
                continue
            due, data = queue.popleft()
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        pass
    finally:
        receiver.cancel()


async def _serve(listen: tuple[str, int], target: tuple[str, int], delay_s: float) -> asyncio.AbstractServer:
    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection(*target)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(_pump(client_r, server_w, delay_s), _pump(server_r, client_w, delay_s))
        for w in (client_w, server_w):
            w.close()

    return await asyncio.start_server(handle, *listen, limit=CHUNK)


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


async def _main(routes: list[tuple[tuple[str, int], tuple[str, int]]], delay_s: float) -> None:
    servers = [await _serve(listen, target, delay_s) for listen, target in routes]
    print("relaying", flush=True)  # readiness line for whoever started us
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    for s in servers:
        s.close()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--delay-ms", type=float, required=True, help="one-way delay added in each direction")
    ap.add_argument("routes", nargs="+", help="LISTEN_HOST:PORT=TARGET_HOST:PORT")
    args = ap.parse_args(argv)
    if not 0 <= args.delay_ms < 60_000:
        ap.error(f"--delay-ms must be in [0, 60000); got {args.delay_ms}")
    routes = []
    for r in args.routes:
        listen, sep, target = r.partition("=")
        if not sep:
            ap.error(f"a route is LISTEN_HOST:PORT=TARGET_HOST:PORT; got {r!r}")
        try:
            routes.append((_address(listen), _address(target)))
        except argparse.ArgumentTypeError as e:
            ap.error(str(e))
    asyncio.run(_main(routes, args.delay_ms / 1e3))


if __name__ == "__main__":
    main()
