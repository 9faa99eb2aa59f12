"""The data plane between two network namespaces: a truer second machine, with delay and loss.

Optional, and only as root: it makes network namespaces and links, so it
skips (status 0, saying why) when not root, or without ``ip``, network
namespaces or the links it needs. The host's link runs in this process (the
root namespace), the group's in a child in a namespace of its own
(``ip netns exec``), over ``tcp+curve`` (an address off loopback needs the
secret): separate addresses, separate network stacks, every packet through
the kernel's TCP. The measurements are ``benchmarks/tcp.py``'s (hop p50/p99
of an int and of a 1 MiB tensor, int messages a second), and its checks:
every message carries its sequence number and comes back as it went, so a
lost, duplicated or reordered message fails the run.

Paths:

* ``veth``: a veth pair (10.77.0.1 <-> 10.77.0.2), no impairment;
* ``veth+1ms`` and ``veth+1%loss``: the same with ``tc netem`` on both ends
  (1 ms added each way; 1 % of packets dropped each way), when the kernel has
  netem;
* ``tun``, ``tun+1ms`` and ``tun+1%loss``: when the kernel has no netem, a
  pair of TUN devices (10.77.1.1 <-> 10.77.1.2) joined by a relay process
  that reads each IP packet from one and writes it to the other, after the
  delay, or drops it (seeded: the same packets of a run each time): netem in
  user space, so that the kernel's TCP sees real delay and real loss (and
  retransmits). The relay costs some tens of µs per packet (``tun`` is its
  floor).

Every namespace, link and process is removed or ended at the end, with
timeouts, whatever happens. Results: a table, and JSON in
``benchmarks/results/netns.json`` unless ``--json`` says otherwise.

Usage::

    sudo env PYTHONPATH=$PWD python benchmarks/netns.py [--quick] [--repeat 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import fcntl
import heapq
import os
import random
import secrets
import select
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from common import machine, show_table
from tcp import COLUMNS, ROOT, Peer, add_common, measure, medians, write_json

NS = f"mujou-bench-{os.getpid()}"
VETH = ("mujou-v0", "mujou-v1")
TUN = ("mujou-t0", "mujou-t1")
TUNSETIFF, IFF_TUN, IFF_NO_PI = 0x400454CA, 0x0001, 0x1000
IMPAIRMENTS = {"": (0.0, 0.0), "+1ms": (0.001, 0.0), "+1%loss": (0.0, 0.01)}  # delay s, loss


def ip(*args: str, ns: bool = False, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``ip ARGS`` (in the namespace when ``ns``), bounded."""
    command = ["ip", "netns", "exec", NS, *args] if ns else list(args)
    return subprocess.run(command, capture_output=True, text=True, timeout=30, check=check)


def skip_reason() -> str | None:
    """Why this machine cannot run it (None: it can)."""
    if os.name != "posix" or os.geteuid() != 0:
        return "not root (network namespaces need it)"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    probe = f"{NS}-probe"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True,
                          timeout=30)
    if made.returncode != 0:
        return f"`ip netns add` fails: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=30)
    return None


# --------------------------------------------------------------------------- the relay


def attach(name: str) -> int:
    """A file descriptor on the TUN device ``name`` (IP packets, no extra header)."""
    fd = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    os.set_blocking(fd, False)
    return fd


def relay_main(seed: int) -> int:
    """The relay process: packets between the two TUN devices, delayed or dropped.

    Reads commands on stdin, one a line: ``set DELAY_S LOSS`` (answers
    ``ok``), ``stats`` (answers ``forwarded N dropped M``); ends at EOF.
    Prints ``ready`` once attached to both devices.
    """
    fds = [attach(TUN[0]), attach(TUN[1])]
    peer = {fds[0]: fds[1], fds[1]: fds[0]}
    rng = random.Random(seed)
    delay, loss = 0.0, 0.0
    queue: list[tuple[float, int, int, bytes]] = []  # (due, order, fd out, packet)
    order = forwarded = dropped = 0
    stdin = sys.stdin.fileno()
    print("ready", flush=True)
    pending = b""
    while True:
        wait = max(0.0, queue[0][0] - time.monotonic()) if queue else 1.0
        ready, _, _ = select.select([stdin, *fds], [], [], wait)
        for fd in ready:
            if fd == stdin:
                chunk = os.read(stdin, 4096)
                if not chunk:
                    return 0
                pending += chunk
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    words = line.decode().split()
                    if words[:1] == ["set"]:
                        delay, loss = float(words[1]), float(words[2])
                        print("ok", flush=True)
                    elif words[:1] == ["stats"]:
                        print(f"forwarded {forwarded} dropped {dropped}", flush=True)
                continue
            while True:
                try:
                    packet = os.read(fd, 65536)
                except BlockingIOError:
                    break
                if loss and rng.random() < loss:
                    dropped += 1
                    continue
                order += 1
                heapq.heappush(queue, (time.monotonic() + delay, order, peer[fd], packet))
        now = time.monotonic()
        while queue and queue[0][0] <= now:
            _, _, out, packet = heapq.heappop(queue)
            try:
                os.write(out, packet)
                forwarded += 1
            except OSError:  # the device is full, or not up yet: a loss, as on a wire
                dropped += 1


class Relay:
    """The relay process, driven over its stdin; ended (EOF, then kill) by `close`."""

    def __init__(self, seed: int) -> None:
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--relay",
                                      str(seed)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        self.ask("", "ready")

    def ask(self, command: str, expect: str) -> str:
        """Send a command; its answer line (which must start with ``expect``)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if command:
            self.proc.stdin.write(command + "\n")
            self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], 30.0)
        line = self.proc.stdout.readline().strip() if ready else ""
        if not line.startswith(expect):
            raise RuntimeError(f"the relay answered {line!r} to {command or 'its start'!r}")
        return line

    def close(self) -> None:
        """EOF on its stdin; wait, then kill, bounded."""
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            self.proc.wait(5)
        except (subprocess.TimeoutExpired, OSError):
            self.proc.kill()
            self.proc.wait(5)


# --------------------------------------------------------------------------- the links


def make_veth() -> None:
    """The veth pair, one end in the namespace: 10.77.0.1 here, 10.77.0.2 there."""
    ip("ip", "link", "add", VETH[0], "type", "veth", "peer", "name", VETH[1])
    ip("ip", "link", "set", VETH[1], "netns", NS)
    ip("ip", "addr", "add", "10.77.0.1/24", "dev", VETH[0])
    ip("ip", "link", "set", VETH[0], "up")
    ip("ip", "addr", "add", "10.77.0.2/24", "dev", VETH[1], ns=True)
    ip("ip", "link", "set", VETH[1], "up", ns=True)


def netem(delay: float, loss: float) -> bool:
    """Set netem on both veth ends (nothing when both are 0); False when the kernel has none."""
    spec = ["delay", f"{delay * 1000:g}ms"] if delay else []
    spec += ["loss", f"{loss * 100:g}%"] if loss else []
    for dev, ns in ((VETH[0], False), (VETH[1], True)):
        if not spec:
            ip("tc", "qdisc", "del", "dev", dev, "root", ns=ns, check=False)
            continue
        if shutil.which("tc") is None:
            return False
        done = ip("tc", "qdisc", "replace", "dev", dev, "root", "netem", *spec, ns=ns,
                  check=False)
        if done.returncode != 0:
            return False
    return True


def make_tun(seed: int) -> Relay:
    """The TUN pair and its relay: 10.77.1.1 here, 10.77.1.2 in the namespace."""
    for dev in TUN:
        ip("ip", "tuntap", "add", "dev", dev, "mode", "tun")
    relay = Relay(seed)  # attached before one device moves: it can only attach here
    ip("ip", "link", "set", TUN[1], "netns", NS)
    ip("ip", "addr", "add", "10.77.1.1", "peer", "10.77.1.2", "dev", TUN[0])
    ip("ip", "link", "set", TUN[0], "up")
    ip("ip", "addr", "add", "10.77.1.2", "peer", "10.77.1.1", "dev", TUN[1], ns=True)
    ip("ip", "link", "set", TUN[1], "up", ns=True)
    return relay


def cleanup() -> None:
    """Remove the namespace and the links (a link in the namespace goes with it)."""
    ip("ip", "netns", "del", NS, check=False)
    for dev in (VETH[0], TUN[0], TUN[1]):
        ip("ip", "link", "del", dev, check=False)


def run_path(name: str, bind: str, key: bytes, cfg: argparse.Namespace,
             samples: dict[str, list[dict[str, float]]]) -> None:
    """Measure one path on a fresh child in the namespace; every message checked."""
    peer = Peer(f"tcp://{bind}:0", key, None, ["ip", "netns", "exec", NS, sys.executable])
    try:
        samples.setdefault(name, []).append(measure(peer, cfg))
    finally:
        peer.close()


def main(argv: list[str] | None = None) -> int:
    """Set the namespace up, measure each path, print the table, write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--relay", type=int, metavar="SEED", help=argparse.SUPPRESS)
    add_common(ap)
    ap.add_argument("--json", type=Path, default=ROOT / "benchmarks/results/netns.json")
    cfg = ap.parse_args(argv)
    if cfg.relay is not None:
        return relay_main(cfg.relay)
    if cfg.quick:
        cfg.rtt, cfg.rtt_big, cfg.small = 300, 30, 6400
    repeat = cfg.repeat if cfg.repeat is not None else (1 if cfg.quick else 3)
    why = skip_reason()
    if why is not None:
        print(f"skipped: {why}")
        return 0
    torch.set_num_threads(1)
    # SIGTERM unwinds like Ctrl-C: the namespace and the links are removed all the same.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    key = secrets.token_hex(32).encode()
    samples: dict[str, list[dict[str, float]]] = {}
    relay_stats: dict[str, str] = {}
    relay: Relay | None = None
    try:
        ip("ip", "netns", "add", NS)
        ip("ip", "link", "set", "lo", "up", ns=True)
        make_veth()
        has_netem = netem(0.001, 0.0)
        netem(0.0, 0.0)
        if not has_netem:
            relay = make_tun(seed=17)
        for rep in range(repeat):
            print(f"repetition {rep + 1}/{repeat}", flush=True)
            run_path("veth", "10.77.0.1", key, cfg, samples)
            for suffix, (delay, loss) in IMPAIRMENTS.items():
                if has_netem and suffix:
                    netem(delay, loss)
                    try:
                        run_path(f"veth{suffix}", "10.77.0.1", key, cfg, samples)
                    finally:
                        netem(0.0, 0.0)
                elif relay is not None:
                    relay.ask(f"set {delay} {loss}", "ok")
                    before = relay.ask("stats", "forwarded")
                    run_path(f"tun{suffix}", "10.77.1.1", key, cfg, samples)
                    relay_stats[f"tun{suffix} rep {rep + 1}"] = (
                        f"{before} -> {relay.ask('stats', 'forwarded')}")
    finally:
        if relay is not None:
            relay.close()
        cleanup()
    results: dict[str, Any] = {name: medians(reps) for name, reps in samples.items()}
    when = write_json(cfg.json, cfg, {"paths": results, "relay": relay_stats,
                                      "netem": has_netem}, samples)
    show_table(f"Data plane (tcp+curve) between two network namespaces, {when}, {machine()}, "
               f"median of {repeat}; every message checked in order", "path", results, COLUMNS)
    for name, stats in relay_stats.items():
        print(f"relay {name}: {stats}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
