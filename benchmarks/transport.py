"""Candidate transports for a placed run's data plane, between two processes on one machine.

What is measured
----------------
The parent process (the sender) and one child process per transport (the
receiver, started with the ``spawn`` start method) exchange port messages
encoded with the snapshot codec (``mujou_actors.snapshot.dumps`` / ``loads``:
msgpack with raw tensor bytes, never pickle). A *small message* is the tree
``{"stamp": <int ns>, "msg": <16 float32 tensor>}`` (132 bytes encoded); a
*batch* is a list of 64 of them encoded as one tree (one frame). Every figure
includes the encoding on the sending side and the decoding on the receiving
side (the codec is part of the hop); the ``codec only`` row is the codec alone,
in one process, without a transport. Transports:

* ``zmq-ipc`` / ``zmq-tcp``: pyzmq ``PUSH``/``PULL`` over ``ipc://`` (a socket
  file in a temporary folder) and over ``tcp://127.0.0.1``; one ``PUSH``/``PULL``
  pair each way (the way back carries replies). Frames of 64 KiB and more are
  sent with ``copy=False``.
* ``pipe``: ``multiprocessing.Pipe()`` (``send_bytes`` / ``recv_bytes``).
* ``thespian``: two actors of a private ``multiprocTCPBase`` actor system (its
  own free admin port, ``transientUnique=True``, the ``spawn`` start method,
  shut down with the system's ``shutdown()``; stock Thespian, but every socket
  on 127.0.0.1 and every process gone with this script's, killed or not:
  ``common.thespian_peer``), each in its own process; one pings the other
  with ``tell`` (``self.send``) and times the replies. Control-plane figures
  only (round trip and unbatched rate); its payload is the same encoded bytes.

Figures (per transport, the median over ``--repeat`` repetitions, the
transports interleaved within each repetition):

* **msg/s 1-by-1**: the sender encodes and sends ``--small`` small messages,
  one frame each, without waiting; the receiver decodes each and counts; after
  the last, a control frame asks for the count and the clock stops when the
  reply arrives. Figure = messages / (that time - the first send's time).
  For thespian: ``tell`` from one actor to the other, timed by the first actor
  from its first send to the other's reply after the last.
* **msg/s batch 64**: the same with frames of 64 messages (``--small``
  messages in all, rounded up to whole batches).
* **RTT p50 / p99 µs**: ping-pong of one small message, ``--rtt`` round trips
  after 50 unmeasured ones: encode, send, the receiver decodes, encodes it
  again and sends it back, the sender decodes; ``time.perf_counter_ns`` around
  each round trip; the 50th and 99th percentile.
* **MB/s 1 MiB** and **MB/s 16 MiB**: like *msg/s 1-by-1* with a float32
  tensor of 1 MiB (``--mib1`` messages) or 16 MiB (``--mib16`` messages) in
  place of the 16 floats; figure = tensor bytes moved / elapsed time, with
  MB = 10^6 bytes.
* **MB/s 16 MiB shm**: a 16 MiB tensor handed over through shared memory
  (``multiprocessing.shared_memory``): one block, created by the sender and
  attached by the receiver before the clock starts; per message the sender
  copies the tensor into the block and sends a small encoded descriptor
  (block name, offset, dtype, shape, stamp) over the transport; the receiver
  decodes it, copies the tensor out of the block into a tensor of its own and
  replies with a 2-byte acknowledgement (the block may be reused). Figure =
  ``--mib16`` × 16 MiB / elapsed time. This is a ping-pong per message (one
  copy on each side), not a pipelined stream.

Every child process is killed and joined at the end, with timeouts, whatever
happens; every wait in both processes has a timeout. A transport whose package
is not installed (pyzmq, thespian) is skipped with a line saying so.

Results: a table, and JSON in ``benchmarks/results/transport.json`` unless
``--json`` says otherwise.

Usage::

    python benchmarks/transport.py [--quick] [--repeat 3] [--only zmq-ipc,pipe]
                                   [--json PATH]
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import os
import platform
import socket
import statistics
import sys
import tempfile
import time
from multiprocessing import shared_memory
from pathlib import Path
from typing import Any

import torch
from common import show_table, thespian_peer

from mujou_actors import snapshot

try:
    import zmq
except ImportError:  # the bench extra is not installed: the zmq rows are skipped
    zmq = None

try:
    from thespian.actors import Actor, ActorExitRequest, ActorSystem
except ImportError:  # thespian missing: its row is skipped
    Actor = object  # type: ignore[assignment,misc]
    ActorSystem = None
    ActorExitRequest = None

ROOT = Path(__file__).resolve().parent.parent
TRANSPORTS = ("zmq-ipc", "zmq-tcp", "pipe", "thespian")
BATCH = 64
TIMEOUT_S = 60.0  # the bound on any single wait; a healthy run never comes close
CTL = b"CTL:"  # control frames start with this; an encoded tree starts with b"MUJOUSNP"
MiB = 1 << 20


def small(stamp: int) -> dict[str, Any]:
    """A small port message: a 16-float tensor and its stamp."""
    return {"stamp": stamp, "msg": torch.arange(16, dtype=torch.float32) + stamp}


def count_of(tree: Any) -> int:
    """How many messages a decoded frame holds (a batch is a list)."""
    return len(tree) if isinstance(tree, list) else 1


# --------------------------------------------------------------------------- channels

class ZmqChannel:
    """One PUSH/PULL pair each way; the parent binds both, the child connects."""

    def __init__(self, out_addr: str, in_addr: str, bind: bool) -> None:
        """Open the sockets.

        Args:
            out_addr (str): the address this side pushes to.
            in_addr (str): the address this side pulls from.
            bind (bool): bind (the parent) or connect (the child).
        """
        self.ctx = zmq.Context()
        self.push = self.ctx.socket(zmq.PUSH)
        self.pull = self.ctx.socket(zmq.PULL)
        for s in (self.push, self.pull):
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.RCVTIMEO, int(TIMEOUT_S * 1000))
            s.setsockopt(zmq.SNDTIMEO, int(TIMEOUT_S * 1000))
        if bind:
            self.push.bind(out_addr)
            self.pull.bind(in_addr)
        else:
            self.push.connect(out_addr)
            self.pull.connect(in_addr)

    def send(self, data: bytes) -> None:
        """Send one frame (without a copy from 64 KiB up)."""
        self.push.send(data, copy=len(data) < 65536)

    def recv(self) -> bytes:
        """Receive one frame; raises ``zmq.Again`` after ``TIMEOUT_S``."""
        return self.pull.recv()

    def close(self) -> None:
        """Close the sockets and the context."""
        self.push.close(0)
        self.pull.close(0)
        self.ctx.term()


class PipeChannel:
    """One end of a ``multiprocessing.Pipe``."""

    def __init__(self, conn: Any) -> None:
        """Keep the connection."""
        self.conn = conn

    def send(self, data: bytes) -> None:
        """Send one frame."""
        self.conn.send_bytes(data)

    def recv(self) -> bytes:
        """Receive one frame; raises ``TimeoutError`` after ``TIMEOUT_S``."""
        if not self.conn.poll(TIMEOUT_S):
            raise TimeoutError("no frame within the timeout")
        return self.conn.recv_bytes()

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()


def child_main(kind: str, args: tuple[Any, ...]) -> None:
    """The receiver: decode, count, echo or copy out of shared memory, per mode.

    Control frames: ``CTL:sink`` (decode and count), ``CTL:echo`` (decode,
    encode, send back), ``CTL:shm:<name>`` (attach the block; descriptors
    follow), ``CTL:done`` (reply with the count, reset it), ``CTL:quit``.
    """
    torch.set_num_threads(1)
    ch: Any = ZmqChannel(*args, bind=False) if kind.startswith("zmq") else PipeChannel(*args)
    mode, n, shm = b"sink", 0, None
    try:
        while True:
            frame = ch.recv()
            if frame[:4] == CTL:
                cmd = frame[4:]
                if cmd == b"quit":
                    return
                if cmd == b"done":
                    ch.send(CTL + str(n).encode())
                    n = 0
                elif cmd.startswith(b"shm:"):
                    if shm is not None:
                        shm.close()
                    shm = shared_memory.SharedMemory(name=cmd[4:].decode())
                    mode = b"shm"
                    ch.send(CTL + b"ok")
                else:
                    mode = cmd
                    ch.send(CTL + b"ok")
                continue
            tree = snapshot.loads(frame)
            if mode == b"sink":
                n += count_of(tree)
            elif mode == b"echo":
                ch.send(snapshot.dumps(tree))
            else:  # a shared-memory descriptor: copy the tensor out, acknowledge
                view = torch.frombuffer(shm.buf, dtype=torch.float32, count=tree["count"],
                                        offset=tree["offset"])
                t = view.clone()
                del view, t
                n += 1
                ch.send(b"ok")
    finally:
        if shm is not None:
            shm.close()
        ch.close()


def free_port() -> int:
    """A free TCP port on the loopback interface (bound, read, released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Peer:
    """A child receiver process and the parent's end of its channel."""

    def __init__(self, kind: str, tmp: str) -> None:
        """Start the child (spawn) and open the channel."""
        ctx = mp.get_context("spawn")
        if kind == "pipe":
            mine, theirs = ctx.Pipe()
            self.ch: Any = PipeChannel(mine)
            child_args: tuple[Any, ...] = (theirs,)
        else:
            if kind == "zmq-ipc":
                a, b = f"ipc://{tmp}/{kind}-a", f"ipc://{tmp}/{kind}-b"
            else:
                a, b = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
            self.ch = ZmqChannel(a, b, bind=True)
            child_args = (b, a)  # the child pushes to b and pulls from a
        self.proc = ctx.Process(target=child_main, args=(kind, child_args), daemon=True)
        self.proc.start()
        if kind == "pipe":
            theirs.close()
        try:
            self.control(b"sink")  # the first reply also says the child is up and connected
        except BaseException:
            self.stop()
            raise

    def control(self, cmd: bytes) -> bytes:
        """Send a control frame and return the reply's body."""
        self.ch.send(CTL + cmd)
        reply = self.ch.recv()
        assert reply[:4] == CTL, reply[:16]
        return reply[4:]

    def stop(self) -> None:
        """Ask the child to quit; then join, terminate, kill, each with a timeout."""
        try:
            self.ch.send(CTL + b"quit")
        except Exception:  # the child may be gone already; it is killed below anyway
            pass
        reap(self.proc)
        self.ch.close()


def reap(proc: Any) -> None:
    """Join a process; terminate and then kill it if it does not exit in time."""
    proc.join(5)
    if proc.is_alive():
        proc.terminate()
        proc.join(2)
    if proc.is_alive():
        proc.kill()
        proc.join(2)


# --------------------------------------------------------------------------- measures

def one_way(peer: Peer, frames: list[bytes], expect: int) -> float:
    """Send frames without waiting; seconds until the child's count comes back."""
    t0 = time.perf_counter()
    for f in frames:
        peer.ch.send(f)
    got = int(peer.control(b"done"))
    dt = time.perf_counter() - t0
    assert got == expect, (got, expect)
    return dt


def rate_small(peer: Peer, n: int, batch: int) -> float:
    """Messages per second, encoding included, frames of ``batch`` messages."""
    frames = n // batch if batch > 1 else n
    t0 = time.perf_counter()
    for i in range(frames):
        tree = [small(i * batch + j) for j in range(batch)] if batch > 1 else small(i)
        peer.ch.send(snapshot.dumps(tree))
    got = int(peer.control(b"done"))
    dt = time.perf_counter() - t0
    total = frames * batch
    assert got == total, (got, total)
    return total / dt


def rtt(peer: Peer, n: int) -> list[float]:
    """Round trips of one small message, µs, after 50 unmeasured ones."""
    peer.control(b"echo")
    out = []
    for i in range(n + 50):
        t0 = time.perf_counter_ns()
        peer.ch.send(snapshot.dumps(small(i)))
        back = snapshot.loads(peer.ch.recv())
        t1 = time.perf_counter_ns()
        assert back["stamp"] == i
        if i >= 50:
            out.append((t1 - t0) / 1e3)
    peer.control(b"sink")
    return out


def bulk(peer: Peer, mib: int, n: int) -> float:
    """MB/s (10^6 bytes) of ``n`` one-way messages holding a ``mib`` MiB tensor."""
    t = torch.rand(mib * MiB // 4)
    t0 = time.perf_counter()
    for i in range(n):
        peer.ch.send(snapshot.dumps({"stamp": i, "msg": t}))
    got = int(peer.control(b"done"))
    dt = time.perf_counter() - t0
    assert got == n
    return n * t.numel() * 4 / dt / 1e6


def shm_handoff(peer: Peer, mib: int, n: int) -> float:
    """MB/s of a tensor handed over through one shared-memory block, acknowledged."""
    t = torch.rand(mib * MiB // 4)
    block = shared_memory.SharedMemory(create=True, size=t.numel() * 4)
    try:
        dest = torch.frombuffer(block.buf, dtype=torch.float32, count=t.numel())
        assert peer.control(b"shm:" + block.name.encode()) == b"ok"
        t0 = time.perf_counter()
        for i in range(n):
            dest.copy_(t)
            peer.ch.send(snapshot.dumps({"shm": block.name, "offset": 0, "count": t.numel(),
                                         "dtype": "float32", "shape": [t.numel()], "stamp": i}))
            assert peer.ch.recv() == b"ok"
        dt = time.perf_counter() - t0
        peer.control(b"done")
        peer.control(b"sink")
        del dest
    finally:
        block.close()
        block.unlink()
    return n * t.numel() * 4 / dt / 1e6


def measure_socket(kind: str, cfg: argparse.Namespace, tmp: str) -> dict[str, Any]:
    """Every figure for one socket transport, in one fresh child process."""
    peer = Peer(kind, tmp)
    try:
        lat = rtt(peer, cfg.rtt)
        return {
            "rate_1": rate_small(peer, cfg.small, 1),
            "rate_64": rate_small(peer, cfg.small, BATCH),
            "rtt_p50": pct(lat, 50), "rtt_p99": pct(lat, 99),
            "mbs_1": bulk(peer, 1, cfg.mib1),
            "mbs_16": bulk(peer, 16, cfg.mib16),
            "mbs_16_shm": shm_handoff(peer, 16, cfg.mib16),
        }
    finally:
        peer.stop()


def pct(xs: list[float], p: float) -> float:
    """The ``p``-th percentile (nearest rank)."""
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def measure_codec(cfg: argparse.Namespace) -> dict[str, Any]:
    """The codec alone in this process: encode and decode, no transport."""
    t0 = time.perf_counter()
    for i in range(cfg.small):
        snapshot.loads(snapshot.dumps(small(i)))
    r1 = cfg.small / (time.perf_counter() - t0)
    frames = cfg.small // BATCH
    t0 = time.perf_counter()
    for i in range(frames):
        snapshot.loads(snapshot.dumps([small(i * BATCH + j) for j in range(BATCH)]))
    r64 = frames * BATCH / (time.perf_counter() - t0)
    out = {"rate_1": r1, "rate_64": r64}
    for mib, n, key in ((1, cfg.mib1, "mbs_1"), (16, cfg.mib16, "mbs_16")):
        t = torch.rand(mib * MiB // 4)
        t0 = time.perf_counter()
        for i in range(n):
            snapshot.loads(snapshot.dumps({"stamp": i, "msg": t}))
        out[key] = n * t.numel() * 4 / (time.perf_counter() - t0) / 1e6
    return out


# --------------------------------------------------------------------------- thespian

class Ponger(Actor):  # type: ignore[misc,valid-type]
    """Replies to every ping; in count mode, replies once after ``n`` messages."""

    def receiveMessage(self, msg: Any, sender: Any) -> None:  # noqa: N802 (Thespian's name)
        """Echo a ping, or count towards a total and then reply."""
        if isinstance(msg, tuple) and msg[0] == "count":
            self.left, self.reply_to = msg[1], sender
        elif isinstance(msg, tuple) and msg[0] == "ping":
            self.send(sender, ("pong", msg[1]))
        elif isinstance(msg, bytes):
            snapshot.loads(msg)
            self.left -= 1
            if self.left == 0:
                self.send(self.reply_to, ("counted",))


class Pinger(Actor):  # type: ignore[misc,valid-type]
    """Times ``tell`` round trips and a one-way stream to a Ponger; reports to the asker."""

    def receiveMessage(self, msg: Any, sender: Any) -> None:  # noqa: N802 (Thespian's name)
        """Drive the measurement, one step per message."""
        if isinstance(msg, tuple) and msg[0] == "go":
            _, self.ponger, self.n, self.n_rate = msg
            self.asker, self.i, self.lat = sender, 0, []
            self._ping()
        elif isinstance(msg, tuple) and msg[0] == "pong":
            t1 = time.perf_counter_ns()
            snapshot.loads(msg[1])
            if self.i >= 50:
                self.lat.append((t1 - self.t0) / 1e3)
            self.i += 1
            if self.i < self.n + 50:
                self._ping()
            else:
                self.send(self.ponger, ("count", self.n_rate))
                self.r0 = time.perf_counter()
                for i in range(self.n_rate):
                    self.send(self.ponger, snapshot.dumps(small(i)))
        elif isinstance(msg, tuple) and msg[0] == "counted":
            rate = self.n_rate / (time.perf_counter() - self.r0)
            self.send(self.asker, ("result", self.lat, rate))

    def _ping(self) -> None:
        """Send the next ping and start its clock."""
        self.t0 = time.perf_counter_ns()
        self.send(self.ponger, ("ping", snapshot.dumps(small(self.i))))


def measure_thespian(cfg: argparse.Namespace) -> dict[str, Any]:
    """Round trips and unbatched rate between two actors of a private multiprocTCPBase.

    Stock Thespian, its sockets on 127.0.0.1 and its processes (the admin, its
    logger, the actors) ended with this one, even if it is killed
    (`common.thespian_peer`); shut down, and any process left SIGKILLed, at the end.
    """
    import transport as importable  # the actors' module by its import name, not __main__

    # A private system (transientUnique): the object shut down is this run's, not a
    # default system a bare ActorSystem() would name.
    with thespian_peer("multiprocTCPBase", {"Admin Port": free_port(),
                                            "Process Startup Method": "spawn"},
                       transientUnique=True) as system:
        ponger = system.createActor(importable.Ponger)
        pinger = system.createActor(importable.Pinger)
        budget = TIMEOUT_S + (cfg.rtt + cfg.thespian_small) * 0.01
        reply = system.ask(pinger, ("go", ponger, cfg.rtt, cfg.thespian_small), budget)
        if not (isinstance(reply, tuple) and reply[0] == "result"):
            raise TimeoutError(f"thespian: no result within {budget:.0f} s ({reply!r})")
        _, lat, rate = reply
        for a in (pinger, ponger):
            system.tell(a, ActorExitRequest())
    return {"rtt_p50": pct(lat, 50), "rtt_p99": pct(lat, 99), "rate_1": rate}


# --------------------------------------------------------------------------- main

COLUMNS = (("rate_1", "msg/s 1-by-1", "{:,.0f}"), ("rate_64", "msg/s batch 64", "{:,.0f}"),
           ("rtt_p50", "RTT p50 µs", "{:.0f}"), ("rtt_p99", "RTT p99 µs", "{:.0f}"),
           ("mbs_1", "MB/s 1 MiB", "{:,.0f}"), ("mbs_16", "MB/s 16 MiB", "{:,.0f}"),
           ("mbs_16_shm", "MB/s 16 MiB shm", "{:,.0f}"))


def show(results: dict[str, dict[str, float]], header: str) -> None:
    """Print the table (rich if installed, plain text otherwise)."""
    show_table(header, "transport", results, COLUMNS)


def main(argv: list[str] | None = None) -> int:
    """Run the measurements; print the table; write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--small", type=int, default=20000, help="small messages per rate")
    parser.add_argument("--rtt", type=int, default=2000, help="measured round trips")
    parser.add_argument("--mib1", type=int, default=200, help="1 MiB messages")
    parser.add_argument("--mib16", type=int, default=20, help="16 MiB messages")
    parser.add_argument("--thespian-small", type=int, default=2000,
                        help="messages for thespian's one-way rate")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", default=",".join(TRANSPORTS))
    parser.add_argument("--quick", action="store_true",
                        help="2,000 small, 200 round trips, 20 x 1 MiB, 4 x 16 MiB, 1 repeat")
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks/results/transport.json")
    cfg = parser.parse_args(argv)
    if cfg.quick:
        cfg.small, cfg.rtt, cfg.mib1, cfg.mib16, cfg.thespian_small, cfg.repeat = (
            2000, 200, 20, 4, 300, 1)
    chosen = [t.strip() for t in cfg.only.split(",") if t.strip()]
    if not chosen or any(t not in TRANSPORTS for t in chosen):
        parser.error(f"--only: choose from {', '.join(TRANSPORTS)}")
    if zmq is None and any(t.startswith("zmq") for t in chosen):
        print("pyzmq is not installed (pip install -e .[bench]): zmq-ipc and zmq-tcp skipped")
        chosen = [t for t in chosen if not t.startswith("zmq")]
    if ActorSystem is None and "thespian" in chosen:
        print("thespian is not installed: the thespian row skipped")
        chosen.remove("thespian")
    torch.set_num_threads(1)
    samples: dict[str, list[dict[str, float]]] = {"codec only": []}
    samples.update({t: [] for t in chosen})
    with tempfile.TemporaryDirectory(prefix="mujou-transport-") as tmp:
        for rep in range(cfg.repeat):  # the transports interleaved, repetition by repetition
            samples["codec only"].append(measure_codec(cfg))
            for kind in chosen:
                print(f"repetition {rep + 1}/{cfg.repeat}: {kind}", flush=True)
                if kind == "thespian":
                    samples[kind].append(measure_thespian(cfg))
                else:
                    samples[kind].append(measure_socket(kind, cfg, tmp))
    results = {name: {k: statistics.median(s[k] for s in reps) for k in reps[0]}
               for name, reps in samples.items() if reps}
    when = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    versions = {"torch": torch.__version__,
                "pyzmq": zmq.pyzmq_version() if zmq is not None else None,
                "libzmq": zmq.zmq_version() if zmq is not None else None}
    show(results, f"Transports, {when}, {machine}, median of {cfg.repeat}")
    cfg.json.parent.mkdir(parents=True, exist_ok=True)
    cfg.json.write_text(json.dumps({
        "date": when, "machine": machine, "versions": versions,
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(cfg).items()},
        "results": results, "samples": samples}, indent=1))
    print(f"wrote {cfg.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
