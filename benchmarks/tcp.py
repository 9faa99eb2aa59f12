"""The data plane's links between machines (``tcp://``, with and without CURVE), next to ipc.

What is measured
----------------
The parent holds a ``dataplane.HostLink``; a child process (``python
benchmarks/tcp.py --child ADDRESS``, the secret in ``MUJOU_SECRET``) holds the
``GroupLink`` and answers grants: the links, codec and headers of a placed
run, without its driver and kernels. For each *transport*:

* ``ipc+shm``: ``ipc://`` in a temporary folder, with the shared-memory pools
  (the data plane between processes of one machine);
* ``tcp``: plain TCP on ``127.0.0.1`` (allowed on loopback only);
* ``tcp+curve``: TCP on ``127.0.0.1`` with the shared secret's CURVE
  (what runs between machines: every message encrypted and authenticated).

Figures:

* **hop p50 / p99 µs** for ``int`` (one int message) and ``1MiB`` (one 1 MiB
  float32 tensor): a grant carrying the message, the child's reply carrying
  it back; ``--rtt`` (``--rtt-big``) round trips after 50 unmeasured ones;
  a hop is half a round trip (its p99: half the round trips' p99);
* **msg/s**: ``--small`` int messages in grants of 64 each, sent without
  waiting (the child only counts them), the clock stopped by the child's
  count coming back.

Every message carries its sequence number (the int itself; the tensor is
filled with it), and the child checks them in order: a lost, duplicated or
reordered message fails the run (``benchmarks/netns.py`` relies on it over a
lossy path).

The script imports ``mujou_actors`` from ``sys.path``: set ``PYTHONPATH`` to
the tree to measure. Results: a table, and JSON in
``benchmarks/results/tcp.json`` unless ``--json`` says otherwise. Every wait
has a timeout; the child is asked to end, then killed, whatever happens.

Usage::

    python benchmarks/tcp.py [--quick] [--repeat 3] [--only ipc+shm,tcp,tcp+curve] [--json PATH]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import zmq
from common import machine, repeat_and_only, show_table, summary

from mujou_actors.distributed import dataplane, secret, wire

ROOT = Path(__file__).resolve().parent.parent
TRANSPORTS = ("ipc+shm", "tcp", "tcp+curve")
TIMEOUT = 60.0  # seconds: the bound on any single wait; a healthy run never comes close
ROUTES: Any = type("Routes", (), {"declared": [int, torch.Tensor]})()  # what a link needs
MiB = 1 << 20
ECHO, END = (1, 0), (-1, 0)  # grant bounds the child reads as commands


# --------------------------------------------------------------------------- the child


def child_main(address: str, pools: str | None) -> int:
    """The group's end: echoes grants with a bound, counts the others, reports on ``take``.

    Checks every message's sequence number; a gap or a repeat ends it with status 3.
    """
    torch.set_num_threads(1)
    key = secret.load_secret(required=False)
    link = dataplane.GroupLink(address, ROUTES, pools, secret=key)
    expected = 0  # the next sequence number of the sink's stream
    counted = 0
    try:
        link.handshake(TIMEOUT)
        while True:
            grant = link.receive(TIMEOUT)
            if grant is None:
                print(f"child: no grant within {TIMEOUT} s", file=sys.stderr)
                return 2
            if grant.bound == END:
                return 0
            if grant.bound == ECHO:
                link.send(dataplane.Reply(None, 0, grant.messages))
                continue
            if grant.take:
                link.send(dataplane.Reply(None, counted, [], {"next": expected}))
                counted = 0
                continue
            for item in grant.messages:
                if item[4] != expected:
                    print(f"child: message {item[4]} where {expected} was next",
                          file=sys.stderr)
                    return 3
                expected += 1
            counted += len(grant.messages)
    finally:
        link.close()


# --------------------------------------------------------------------------- the parent


class Peer:
    """The host's link and the child process at its other end.

    Args:
        bind (str): the address the host's link binds (``tcp://HOST:0``: any port).
        key (bytes | None): the secret (CURVE), or None.
        pools (str | None): the run's shared-memory prefix (ipc only).
        launch (list[str]): the command's start that runs the child (``[python]``;
            ``ip netns exec NS python`` for another namespace).
        connect_host (str | None): the host the child connects to, when not the
            bound one (``0.0.0.0`` is bound, a namespace's address connected).
    """

    def __init__(self, bind: str, key: bytes | None, pools: str | None,
                 launch: list[str], connect_host: str | None = None) -> None:
        self.link = dataplane.HostLink(bind, ROUTES, pools, secret=key)
        # A PAIR socket's send waits for a peer: bounded, so that a child that never
        # connected cannot hold the parent (zmq.Again after the timeout).
        self.link.sock.setsockopt(zmq.SNDTIMEO, int(TIMEOUT * 1000))
        address = self.link.endpoint
        if connect_host is not None:
            address = f"tcp://{connect_host}:{address.rpartition(':')[2]}"
        env = dict(os.environ)  # PYTHONPATH included: the child measures the same tree
        env.pop(secret.ENV_SECRET_FILE, None)
        env.pop(secret.ENV_SECRET, None)
        if key is not None:
            env[secret.ENV_SECRET] = key.decode()
        command = [*launch, str(Path(__file__).resolve()), "--child", address]
        if pools is not None:
            command += ["--pools", pools]
        self.proc = subprocess.Popen(command, env=env)
        self.seq = 0  # the next sequence number of the sink's stream
        try:
            self.link.handshake(TIMEOUT)
        except BaseException:
            self.close()
            raise

    def echo(self, messages: list[wire.Item]) -> list[wire.Item]:
        """One round trip: the messages out in a grant and back in the reply."""
        self.link.send(dataplane.Grant(ECHO, False, messages))
        reply = self.link.receive(TIMEOUT)
        if reply is None:
            raise RuntimeError(f"no reply within {TIMEOUT} s (child status {self.proc.poll()})")
        return reply.sends

    def close(self) -> None:
        """Ask the child to end; wait, then kill it, with timeouts; close the link."""
        try:
            if self.proc.poll() is None:
                self.link.send(dataplane.Grant(END))
            self.proc.wait(10)
        except (subprocess.TimeoutExpired, zmq.ZMQError):
            self.proc.kill()
            self.proc.wait(5)
        finally:
            self.link.close()


def round_trips(peer: Peer, case: str, n: int) -> dict[str, float]:
    """Hop p50/p99 (µs) of one message of a case, ``n`` round trips after 50.

    Raises:
        RuntimeError: a message came back other than it went.
    """
    lat: list[float] = []
    for i in range(n + 50):
        message: Any = i if case == "int" else torch.full((MiB // 4,), float(i))
        port = 0 if case == "int" else 1
        t0 = time.perf_counter_ns()
        back = peer.echo([(i, 0, 0, port, message)])
        t1 = time.perf_counter_ns()
        same = (back[0][4] == message) if case == "int" else torch.equal(back[0][4], message)
        if len(back) != 1 or back[0][0] != i or not same:
            raise RuntimeError(f"round trip {i} ({case}) came back other than it went")
        if i >= 50:
            lat.append((t1 - t0) / 1e3)
    lat.sort()
    return {"hop_p50": lat[len(lat) // 2] / 2,
            "hop_p99": lat[min(len(lat) - 1, len(lat) * 99 // 100)] / 2}


def rate(peer: Peer, n: int) -> float:
    """Int messages a second, one way, in grants of 64 (``n`` rounded up to grants).

    Raises:
        RuntimeError: the child's count or its next expected number is not what was sent.
    """
    grants = []
    for _ in range(-(-n // 64)):
        grants.append(dataplane.Grant(None, False, [(s, 0, 0, 0, s)
                                                    for s in range(peer.seq, peer.seq + 64)]))
        peer.seq += 64
    t0 = time.perf_counter()
    for grant in grants:
        peer.link.send(grant)
    peer.link.send(dataplane.Grant(None, True))
    reply = peer.link.receive(TIMEOUT)
    elapsed = time.perf_counter() - t0
    if reply is None or reply.time_ns != 64 * len(grants) or reply.failure != {"next": peer.seq}:
        raise RuntimeError(f"the child counted {None if reply is None else reply.time_ns} "
                           f"messages of {64 * len(grants)} (its report: "
                           f"{None if reply is None else reply.failure})")
    return 64 * len(grants) / elapsed


def measure(peer: Peer, cfg: argparse.Namespace) -> dict[str, float]:
    """Every figure of one transport, on one child."""
    out: dict[str, float] = {}
    for case, n in (("int", cfg.rtt), ("1MiB", cfg.rtt_big)):
        for k, v in round_trips(peer, case, n).items():
            out[f"{case}_{k}"] = v
    out["rate"] = rate(peer, cfg.small)
    return out


def open_peer(transport: str, folder: str, run: str, key: bytes) -> Peer:
    """A child over ``transport`` on this machine."""
    if transport == "ipc+shm":
        return Peer(f"ipc://{folder}/link", None, f"{run}link-", [sys.executable])
    return Peer("tcp://127.0.0.1:0", key if transport == "tcp+curve" else None, None,
                [sys.executable])


COLUMNS = (("int_hop_p50", "int hop p50 µs", "{:.0f}"), ("int_hop_p99", "p99", "{:.0f}"),
           ("1MiB_hop_p50", "1 MiB hop p50 µs", "{:.0f}"), ("1MiB_hop_p99", "p99", "{:.0f}"),
           ("rate", "int msg/s (grants of 64)", "{:,.0f}"))


def medians(reps: list[dict[str, float]]) -> dict[str, float]:
    """The median of each figure over the repetitions."""
    return {k: summary([r[k] for r in reps])["median"] for k in reps[0]}


def write_json(path: Path, cfg: argparse.Namespace, results: dict[str, Any],
               samples: dict[str, Any]) -> str:
    """Write the results with the date, the machine and the versions; the date."""
    when = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "date": when, "machine": machine(), "mujou_actors": wire.__file__,
        "versions": {"torch": torch.__version__, "pyzmq": zmq.pyzmq_version(),
                     "libzmq": zmq.zmq_version()},
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(cfg).items()},
        "results": results, "samples": samples}, indent=1))
    print(f"wrote {path}")
    return when


def add_common(ap: argparse.ArgumentParser) -> None:
    """The options this script and ``netns.py`` share."""
    ap.add_argument("--rtt", type=int, default=2000, help="round trips of the int")
    ap.add_argument("--rtt-big", type=int, default=200, help="round trips of the 1 MiB tensor")
    ap.add_argument("--small", type=int, default=64_000, help="messages of the rate")
    ap.add_argument("--repeat", type=int, default=None, help="repetitions (5; --quick: 2)")
    ap.add_argument("--quick", action="store_true", help="300 + 30 round trips, 6,400 messages")


def main(argv: list[str] | None = None) -> int:
    """Run the child (``--child``) or the measurements; print the table; write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--child", metavar="ADDRESS", help=argparse.SUPPRESS)
    ap.add_argument("--pools", help=argparse.SUPPRESS)
    add_common(ap)
    ap.add_argument("--only", type=lambda s: [w.strip() for w in s.split(",") if w.strip()],
                    default=None, help=f"transports, from {', '.join(TRANSPORTS)}")
    ap.add_argument("--json", type=Path, default=ROOT / "benchmarks/results/tcp.json")
    cfg = ap.parse_args(argv)
    if cfg.child:
        return child_main(cfg.child, cfg.pools)
    if cfg.quick:
        cfg.rtt, cfg.rtt_big, cfg.small = 300, 30, 6400
    repeat, only = repeat_and_only(ap, cfg, TRANSPORTS)
    torch.set_num_threads(1)
    key = secrets.token_hex(32).encode()
    run = f"mujou-bench-tcp-{os.getpid()}-"
    samples: dict[str, list[dict[str, float]]] = {t: [] for t in only}
    try:
        with tempfile.TemporaryDirectory(prefix="mujou-tcp-") as folder:
            for rep in range(repeat):  # the transports interleaved, repetition by repetition
                print(f"repetition {rep + 1}/{repeat}", flush=True)
                for transport in only:
                    peer = open_peer(transport, folder, run, key)
                    try:
                        samples[transport].append(measure(peer, cfg))
                    finally:
                        peer.close()
    finally:
        wire.remove_blocks(run)  # pools a failed run left behind
    results = {t: medians(reps) for t, reps in samples.items()}
    when = write_json(cfg.json, cfg, results, samples)
    show_table(f"Data-plane links, host and group processes on one machine, {when}, "
               f"{machine()}, median of {repeat}", "transport", results, COLUMNS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
