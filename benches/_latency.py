#!/usr/bin/env python3
"""Added network latency for bench_remote.py.

Two ways to slow a TCP path down by a fixed delay:

* ``netem``: a network namespace + veth pair with ``tc qdisc ... netem delay``.
  :func:`probe_netns` checks whether this machine can do that (root, ``ip``,
  ``tc`` and a kernel with ``sch_netem``) and always removes what it made.
* ``proxy``: :class:`DelayProxy`, this file run as a program: a TCP relay on
  127.0.0.1 that holds every chunk it relays for a fixed time before passing
  it on, in order, in both directions. It is what bench_remote.py uses.

Proxy model (``python _latency.py --upstream HOST:PORT --rtt-ms X``):

* Each direction's chunks are delayed by ``X / 2`` ms (``--each-way`` delays
  each direction by the full X instead), so a request/response exchange on an
  established connection costs ``X`` more, as one ``netem delay X`` on one
  side of a veth would add.
* A new connection costs one more added round trip before its first byte
  reaches the server (the TCP handshake on a real link): the proxy waits ``X``
  before it connects upstream, buffering what the client already sent.
* Bandwidth is not limited and nothing is dropped or reordered. Flow control
  is kept: a slow receiver pauses reading from the sender, and so does more
  than ``--max-queue`` bytes waiting out their delay in one direction.

The relay is one asyncio process; the driver starts it as a subprocess with
``start_new_session`` and the parent-death signal, so it never outlives the
benchmark. It prints ``READY <port>`` on stdout once it listens.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import uuid

HOST = "127.0.0.1"


# =========================================================================== netns / netem probe


def _run(cmd: list[str]) -> tuple[bool, str]:
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"{type(exc).__name__}: {exc}"
    return p.returncode == 0, p.stdout.strip()


def probe_netns() -> dict:
    """What this machine allows: {'netns': bool, 'veth': bool, 'netem': bool, 'detail': str}.

    Creates a throw-away namespace and veth pair (10.213.0.1/30 <-> 10.213.0.2/30,
    addresses that exist only between the two ends) and tries to attach a netem
    qdisc; everything is deleted again before returning, also on error."""
    out = {"netns": False, "veth": False, "netem": False, "detail": ""}
    if os.geteuid() != 0:
        out["detail"] = "not root"
        return out
    if not shutil.which("ip") or not shutil.which("tc"):
        out["detail"] = "`ip` or `tc` (iproute2) not installed"
        return out
    tag = uuid.uuid4().hex[:6]
    ns, a, b = f"lxbench-{tag}", f"lxb{tag}a", f"lxb{tag}b"
    try:
        ok, msg = _run(["ip", "netns", "add", ns])
        out["netns"] = ok
        if not ok:
            out["detail"] = f"ip netns add: {msg}"
            return out
        ok, msg = _run(["ip", "link", "add", a, "type", "veth", "peer", "name", b, "netns", ns])
        out["veth"] = ok
        if not ok:
            out["detail"] = f"ip link add type veth: {msg}"
            return out
        _run(["ip", "addr", "add", "10.213.0.1/30", "dev", a])
        _run(["ip", "link", "set", a, "up"])
        ok, msg = _run(["tc", "qdisc", "add", "dev", a, "root", "netem", "delay", "5ms"])
        out["netem"] = ok
        out["detail"] = "netns, veth and netem all work" if ok else f"tc qdisc add ... netem: {msg}"
        if not ok:
            try:  # say why, when the kernel config is readable
                import gzip
                with gzip.open("/proc/config.gz", "rt") as fh:
                    if "# CONFIG_NET_SCH_NETEM is not set" in fh.read():
                        out["detail"] += " (kernel built without CONFIG_NET_SCH_NETEM)"
            except OSError:
                pass
        return out
    finally:
        _run(["ip", "link", "del", a])  # deletes its peer as well
        _run(["ip", "netns", "del", ns])


# =========================================================================== delay proxy


class _Direction:
    """One direction of a relayed connection: chunks wait ``delay`` seconds,
    then go out in arrival order."""

    def __init__(self, loop: asyncio.AbstractEventLoop, delay: float, max_queue: int, src: "_Side"):
        self.loop, self.delay, self.max_queue, self.src = loop, delay, max_queue, src
        self.dst: _Side | None = None
        self.queue: collections.deque[tuple[float, bytes | None]] = collections.deque()  # None = EOF
        self.queued = 0
        self.timer: asyncio.TimerHandle | None = None
        self.throttled = False
        self.not_before = 0.0  # no chunk leaves before this loop time

    def feed(self, data: bytes | None) -> None:
        self.queue.append((max(self.loop.time() + self.delay, self.not_before), data))
        if data is not None:
            self.queued += len(data)
            if self.queued > self.max_queue and not self.throttled:
                self.throttled = True
                self.src.pause()
        self.flush()

    def flush(self) -> None:
        self.timer = None
        if self.dst is None or self.dst.transport is None:
            return  # upstream not connected yet: attach() flushes
        now = self.loop.time()
        while self.queue and self.queue[0][0] <= now:
            _, data = self.queue.popleft()
            if data is None:
                self.dst.finish()
                self.queue.clear()
                return
            self.queued -= len(data)
            self.dst.transport.write(data)
        if self.throttled and self.queued <= self.max_queue // 2:
            self.throttled = False
            self.src.resume()
        if self.queue:
            self.timer = self.loop.call_at(self.queue[0][0], self.flush)

    def attach(self, dst: "_Side") -> None:
        self.dst = dst
        if self.timer is None:
            self.flush()

    def cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.queue.clear()


class _Side(asyncio.Protocol):
    """One socket of a relayed connection (the accepted client, or upstream)."""

    def __init__(self, conn: "_Connection", name: str):
        self.conn, self.name = conn, name
        self.transport: asyncio.Transport | None = None
        self.out: _Direction | None = None  # where this side's incoming data goes
        self.peer: _Side | None = None
        self._paused_by: set[str] = set()

    # flow control: pause reading from this side while its data cannot go on
    def pause(self, why: str = "queue") -> None:
        if not self._paused_by and self.transport is not None:
            self.transport.pause_reading()
        self._paused_by.add(why)

    def resume(self, why: str = "queue") -> None:
        self._paused_by.discard(why)
        if not self._paused_by and self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.out.feed(data)

    def eof_received(self):
        self.out.feed(None)
        return True  # keep our writing half open until the delayed EOF went out

    def connection_lost(self, exc):
        self.conn.lost(self)

    # our peer's data backs up in our write buffer: stop reading from the peer
    def pause_writing(self):
        if self.peer is not None:
            self.peer.pause("write")

    def resume_writing(self):
        if self.peer is not None:
            self.peer.resume("write")

    def finish(self) -> None:
        """The other side sent EOF and the delay has passed."""
        if self.transport is None or self.transport.is_closing():
            return
        if self.transport.can_write_eof():
            self.transport.write_eof()
        else:
            self.transport.close()
        self.conn.half_closed(self)


class _Connection:
    def __init__(self, proxy: "DelayProxy"):
        self.proxy = proxy
        loop = proxy.loop
        self.client = _Side(self, "client")
        self.upstream = _Side(self, "upstream")
        self.client.peer, self.upstream.peer = self.upstream, self.client
        self.c2s = _Direction(loop, proxy.one_way, proxy.max_queue, self.client)
        self.s2c = _Direction(loop, proxy.one_way, proxy.max_queue, self.upstream)
        self.client.out, self.upstream.out = self.c2s, self.s2c
        self.s2c.attach(self.client)
        # The client's first bytes would follow the handshake (one added round
        # trip) and then travel one way, like any later chunk.
        self.c2s.not_before = loop.time() + proxy.connect_delay + proxy.one_way
        self.closed_halves: set[str] = set()
        self.dead = False

    async def connect(self) -> None:
        try:
            if self.proxy.connect_delay > 0:
                await asyncio.sleep(self.proxy.connect_delay)  # the handshake's round trip
            await self.proxy.loop.create_connection(lambda: self.upstream, self.proxy.upstream_host,
                                                    self.proxy.upstream_port)
        except OSError:
            self.close()
            return
        if self.dead:
            self.close()
            return
        self.c2s.attach(self.upstream)

    def half_closed(self, side: _Side) -> None:
        self.closed_halves.add(side.name)
        if len(self.closed_halves) == 2:
            self.close()

    def lost(self, side: _Side) -> None:
        # A reset or close on one side ends the whole relay (HTTP needs no more).
        self.dead = True
        self.close()

    def close(self) -> None:
        self.dead = True
        for d in (self.c2s, self.s2c):
            d.cancel()
        for s in (self.client, self.upstream):
            if s.transport is not None and not s.transport.is_closing():
                s.transport.close()
        self.proxy.connections.discard(self)


class DelayProxy:
    def __init__(self, upstream: str, rtt_ms: float, each_way: bool = False, max_queue: int = 64 << 20):
        host, _, port = upstream.rpartition(":")
        self.upstream_host, self.upstream_port = host or HOST, int(port)
        rtt = rtt_ms / 1e3
        self.one_way = rtt if each_way else rtt / 2
        self.connect_delay = 2 * self.one_way  # one added round trip per new connection
        self.max_queue = max_queue
        self.connections: set[_Connection] = set()
        self.loop: asyncio.AbstractEventLoop | None = None

    def _accept(self) -> _Side:
        conn = _Connection(self)
        self.connections.add(conn)
        self.loop.create_task(conn.connect())
        return conn.client

    async def serve(self, port: int = 0) -> None:
        self.loop = asyncio.get_running_loop()
        server = await self.loop.create_server(self._accept, HOST, port, backlog=1024)
        bound = server.sockets[0].getsockname()[1]
        print(f"READY {bound}", flush=True)
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            self.loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        server.close()
        for c in list(self.connections):
            c.close()


def _die_with_parent() -> None:
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class ProxyProcess:
    """The proxy as a child process (so the relay never competes with the
    benchmark's own interpreter for the GIL). ``port`` is where to connect."""

    def __init__(self, upstream: str, rtt_ms: float, each_way: bool = False, python: str | None = None):
        self.rtt_ms, self.each_way = rtt_ms, each_way
        cmd = [python or sys.executable, "-I", os.path.abspath(__file__), "--upstream", upstream,
               "--rtt-ms", str(rtt_ms)] + (["--each-way"] if each_way else [])
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=None,
                                     text=True, start_new_session=True, preexec_fn=_die_with_parent)
        line = self.proc.stdout.readline()
        if not line.startswith("READY "):
            self.stop()
            raise RuntimeError(f"delay proxy did not start (got {line!r})")
        self.port = int(line.split()[1])
        self.endpoint = f"http://{HOST}:{self.port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="TCP relay on 127.0.0.1 that adds a fixed delay")
    p.add_argument("--upstream", help="HOST:PORT to relay to")
    p.add_argument("--rtt-ms", type=float, default=0.0, help="added round-trip time in ms")
    p.add_argument("--each-way", action="store_true", help="delay each direction by the full --rtt-ms")
    p.add_argument("--port", type=int, default=0, help="listen port (default: any free one)")
    p.add_argument("--max-queue", type=int, default=64 << 20, help="bytes waiting per direction before pausing")
    p.add_argument("--probe-netns", action="store_true", help="only report what netns/veth/netem allow here")
    args = p.parse_args(argv)
    if args.probe_netns:
        print(probe_netns())
        return 0
    if not args.upstream:
        p.error("--upstream is required")
    asyncio.run(DelayProxy(args.upstream, args.rtt_ms, args.each_way, args.max_queue).serve(args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
