"""The shared-memory floor of a hop between two processes: iceoryx2's ping-pong.

Issue 30 sets the placed runs' hop targets against an existing shared-memory
library measured in the same run. This is that measurement, for
``benchmarks/processes.py``: a parent and a child process (``spawn``) echo a
payload through iceoryx2's Python bindings (https://iceoryx.io, PyPI
``iceoryx2``), each direction a publish-subscribe service of raw bytes
(``Slice[c_uint8]``) beside an event service of the same name that wakes the
reader: every wait blocks in the event listener (no spinning), as a group's
data-plane thread would. The sender copies the payload into a loaned sample
once; the reader reads a large payload in place (a read-only view of the
shared memory) and copies a small one out (cheaper than making the view), and
the echo copies it into its own loan. A hop is half a round trip.

Measured behaviour this relies on (iceoryx2 0.10.0; docs/performance.md,
"Shared memory between groups"): a listener's ``timed_wait`` may return before
its timeout with nothing, so every wait here keeps its own deadline; a view
of a received sample is valid only while the sample is held, and must be
read-only (the memory is mapped read-only: a write through it is a SIGSEGV);
service names are global to the user, so each run's carry a random id and
are created, never opened (another run's service of the same name is an error,
not a channel).

Usage: ``python benchmarks/shm_floor.py [--rtt 2000] [--size 8]``; as a module,
`hop(size, n)`. Needs the ``bench`` extra (``iceoryx2``); `available` says
whether it is installed.
"""

from __future__ import annotations

import argparse
import ctypes
import multiprocessing as mp
import secrets
import sys
import time
from typing import Any

TIMEOUT_S = 30.0  # a wait for the peer: its death ends the benchmark, not the machine
WARMUP = 50
SMALL = 4096  # payloads below this size are read by a copy, larger ones in place


def available() -> bool:
    """Whether iceoryx2's Python bindings can be imported here."""
    try:
        import iceoryx2  # noqa: F401
    except ImportError:
        return False
    return True


class _Endpoint:
    """One side of a two-way channel: reads service ``{prefix}/{me}``, writes ``{prefix}/{peer}``.

    Each service is created by its reader (``me``), before the writer opens it,
    so the writer's first sample has a subscriber.
    """

    def __init__(self, prefix: str, me: str, peer: str, max_len: int, opened: Any = None) -> None:
        import iceoryx2 as iox2

        iox2.set_log_level(iox2.LogLevel.Error)  # no notice about a missing config file
        self._iox2 = iox2
        u8 = iox2.Slice[ctypes.c_uint8]
        self.node = iox2.NodeBuilder.new().create(iox2.ServiceType.Ipc)

        def service(name: str, create: bool) -> tuple[Any, Any]:
            builder = self.node.service_builder(iox2.ServiceName.new(f"{prefix}/{name}"))
            pubsub = (builder.publish_subscribe(u8).subscriber_max_buffer_size(2)
                      .history_size(0).max_publishers(1).max_subscribers(1))
            event = self.node.service_builder(iox2.ServiceName.new(f"{prefix}/{name}")).event()
            if create:
                return pubsub.create(), event.create()
            return pubsub.open(), event.open()

        inbox, inbox_event = service(me, create=True)
        self.sub = inbox.subscriber_builder().buffer_size(2).create()
        self.listener = inbox_event.listener_builder().create()
        if opened is not None:
            opened()  # the peer may open this side's inbox now
        self._outbox: Any = None
        self._peer, self._max_len, self._service = peer, max_len, service

    def connect(self) -> None:
        """Open the peer's inbox (once the peer has created it)."""
        outbox, outbox_event = self._service(self._peer, create=False)
        self.pub = (outbox.publisher_builder().initial_max_slice_len(self._max_len)
                    .allocation_strategy(self._iox2.AllocationStrategy.Static).create())
        self.notifier = outbox_event.notifier_builder().create()

    def send(self, source: Any, n: int) -> None:
        """Copy ``n`` bytes from the address ``source`` into a loaned sample; send; wake."""
        sample = self.pub.loan_slice_uninit(n)
        ctypes.memmove(sample.payload_ptr, source, n)
        if sample.assume_init().send() != 1:
            raise RuntimeError("shm_floor: the peer's subscriber did not get the sample")
        self.notifier.notify()

    def receive(self) -> Any:
        """The next sample, waiting in the listener (never spinning), at most `TIMEOUT_S`."""
        deadline = time.monotonic() + TIMEOUT_S
        wait = self._iox2.Duration.from_secs_f64(1.0)
        while True:
            sample = self.sub.receive()
            if sample is not None:
                return sample
            if time.monotonic() > deadline:
                raise TimeoutError(f"shm_floor: no message within {TIMEOUT_S} s")
            self.listener.timed_wait(wait)  # may return early and empty: loop


def _echo(prefix: str, size: int, rounds: int, ready: Any, go: Any) -> None:
    """The child: echo ``rounds`` payloads of ``size`` bytes, copying each into its own loan."""
    end = _Endpoint(prefix, "child", "parent", size, opened=ready.set)
    if not go.wait(TIMEOUT_S):
        return
    end.connect()
    for _ in range(rounds):
        sample = end.receive()
        end.send(sample.payload_ptr, size)
        del sample  # the loan goes back before the next one


def hop(size: int, n: int) -> dict[str, float]:
    """Round trips of a ``size``-byte payload between two processes; hop = RTT / 2 (µs).

    Raises:
        ImportError: iceoryx2 is not installed (the ``bench`` extra).
        TimeoutError: the child did not answer within `TIMEOUT_S`.
    """
    import numpy as np

    ctx = mp.get_context("spawn")
    prefix = f"mujou-bench/{secrets.token_hex(8)}"
    ready, go = ctx.Event(), ctx.Event()
    child = ctx.Process(target=_echo, args=(prefix, size, n + WARMUP, ready, go), daemon=True)
    child.start()
    try:
        if not ready.wait(TIMEOUT_S):
            raise TimeoutError("shm_floor: the child did not start")
        end = _Endpoint(prefix, "parent", "child", size)
        end.connect()
        go.set()
        payload = np.zeros(size, dtype=np.uint8)
        source = payload.ctypes.data
        clock = time.perf_counter_ns
        us = []
        for i in range(n + WARMUP):
            t0 = clock()
            end.send(source, size)
            sample = end.receive()
            if size < SMALL:  # the cheapest read of a few bytes: a copy out
                ctypes.string_at(sample.payload_ptr, size)
            else:  # read in place
                view = np.frombuffer(sample.payload().as_memory_view().toreadonly(), np.uint8)
                view[-1]
                del view
            del sample
            if i >= WARMUP:
                us.append((clock() - t0) / 1e3)
        child.join(TIMEOUT_S)
    finally:
        if child.is_alive():
            child.kill()
            child.join(5)
    us.sort()
    p50, p99 = us[len(us) // 2], us[min(len(us) - 1, int(len(us) * 0.99))]
    return {"rtt_p50": p50, "rtt_p99": p99, "hop_p50": p50 / 2}


def main(argv: list[str] | None = None) -> int:
    """Print one measurement."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rtt", type=int, default=2000, help="round trips")
    ap.add_argument("--size", type=int, default=8, help="payload bytes")
    cfg = ap.parse_args(argv)
    if not available():
        print("iceoryx2 is not installed: pip install -e '.[bench]'", file=sys.stderr)
        return 1
    print(hop(cfg.size, cfg.rtt))
    return 0


if __name__ == "__main__":
    sys.exit(main())
