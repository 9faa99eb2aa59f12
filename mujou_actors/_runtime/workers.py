"""Worker threads: how many a run starts by default, and their timer slack.

The default follows the CPUs this process may really use (affinity and the
cgroup's CPU quota, as a container sets it), halved while the GIL is enabled.
Real-time threads ask Linux for a tight timer slack so that they wake on time.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["usable_cpus", "gil_enabled", "default_workers", "tight_timer_slack", "on_time"]

log = logging.getLogger("mujou_actors")

PR_SET_TIMERSLACK = 29  # linux/prctl.h


def tight_timer_slack() -> bool:
    """Ask Linux to wake the calling thread on time: 1 ns of timer slack.

    By default the kernel may delay a sleeping thread's wake-up by up to
    50 µs (the thread's *timer slack*, ``prctl(PR_SET_TIMERSLACK)``, see
    prctl(2)) so as to batch wake-ups. The real-time timer's worker and
    dedicated threads ask for 1 ns instead, which takes that 50 µs off the
    lateness of every tick without any busy waiting. The setting belongs to
    the calling thread only.

    Returns:
        bool: True if the kernel accepted it; False elsewhere than Linux or
        when the call fails (the thread then keeps the default slack).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0) == 0
    except (OSError, AttributeError) as exc:  # no libc symbol: keep the default
        log.debug("timer slack unchanged: %s", exc)
        return False


def _cgroup_cpu_limit() -> float | None:
    """CPUs allowed by the cgroup quota of this process (v2 ``cpu.max`` or v1), if any."""
    limits: list[float] = []
    try:
        with open("/proc/self/cgroup") as f:
            entries = [line.strip().split(":", 2) for line in f if line.strip()]
    except OSError:
        return None
    for _, controllers, rel in entries:
        if controllers == "":  # cgroup v2: walk the path and its ancestors
            parts = [p for p in rel.split("/") if p]
            for i in range(len(parts), -1, -1):
                limit = _read_cpu_max(os.path.join("/sys/fs/cgroup", *parts[:i], "cpu.max"))
                if limit is not None:
                    limits.append(limit)
        elif "cpu" in controllers.split(","):
            for root in ("/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup/cpu"):
                limit = _read_cfs(os.path.join(root, rel.lstrip("/")))
                if limit is None:
                    limit = _read_cfs(root)
                if limit is not None:
                    limits.append(limit)
                    break
    return min(limits) if limits else None


def _read_cpu_max(path: str) -> float | None:
    try:
        with open(path) as f:
            quota, period = f.read().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    return int(quota) / int(period)


def _read_cfs(folder: str) -> float | None:
    try:
        with open(os.path.join(folder, "cpu.cfs_quota_us")) as f:
            quota = int(f.read())
        with open(os.path.join(folder, "cpu.cfs_period_us")) as f:
            period = int(f.read())
    except (OSError, ValueError):
        return None
    return None if quota <= 0 else quota / period


def usable_cpus() -> int:
    """CPUs this process may use: logical cores, limited by affinity and cgroup quota.

    Returns:
        int: at least 1. The quota is rounded up (1.5 CPUs allow 2 threads to
        make progress).
    """
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    quota = _cgroup_cpu_limit()
    if quota is not None:
        cpus = min(cpus, max(1, -(-int(quota * 1000) // 1000)))
    return max(1, cpus)


def gil_enabled() -> bool:
    """Whether the GIL is enabled (always on Pythons before 3.13)."""
    probe = getattr(sys, "_is_gil_enabled", None)
    return True if probe is None else bool(probe())


def default_workers(pool_nodes: int, *, cpus: int | None = None, gil: bool | None = None) -> int:
    """The default number of worker threads.

    The usable CPUs, halved while the GIL is enabled (more threads would mostly
    contend for it), never more than the nodes that run on the workers, and at
    least 1.

    Args:
        pool_nodes (int): nodes without ``dedicated_thread``.
        cpus (int, optional): usable CPUs; default `usable_cpus`.
        gil (bool, optional): whether the GIL is enabled; default: this process.
    """
    cpus = usable_cpus() if cpus is None else cpus
    gil = gil_enabled() if gil is None else gil
    n = cpus // 2 if gil else cpus
    return max(1, min(n, pool_nodes))


def on_time(loop: Callable[..., None], *args: Any) -> None:
    """Run a real-time thread's loop with tight timer slack (see `tight_timer_slack`)."""
    tight_timer_slack()
    loop(*args)


