"""What a group's process runs: `serve` builds the group's server for the run's timer.

The control plane calls `serve` by name (`recovery.GROUP_TARGET`) in a new group
process, with the keyword arguments the host settled for the group. It picks
`group.GroupServer` for simulated time and `grouprt.RealTimeGroupServer` for
real time; their module docstrings say what each runs.
"""

from __future__ import annotations

from typing import Any

from .._runtime.loops import DEFAULT_MAX_DELTA_CYCLES
from .group import GroupServer
from .grouprt import RealTimeGroupServer

__all__ = ["serve"]


def serve(*, group: str, factory: str, net_kwargs: bytes, nodes: list[str], seed: int | None,
          workers: int, address: str, host_pid: int, timer: str = "simulated",
          pools: str | None = None, trace: int | None = None,
          secure: bool = False, heartbeat: str | None = None,
          seeds: dict[str, int] | None = None,
          check_read_only: bool = False,
          max_delta_cycles: int = DEFAULT_MAX_DELTA_CYCLES,
          stop_timeout: float = 10.0, cuda_ipc: bool = False,
          params: dict[str, Any] | None = None,
          torch_settings: dict[str, Any] | None = None) -> GroupServer:
    """Build the group's kernel and connect its data plane; called in the new process.

    Args:
        group (str): the group's name.
        factory (str): the net factory's reference (`placement.FactoryRef.ref`).
        net_kwargs (bytes): its keyword arguments, snapshot-encoded.
        nodes (list[str]): the paths of the group's nodes (exactly these: a
            child of one of them may run in another group).
        seed (int, optional): the run's seed.
        workers (int): the kernel's worker threads.
        seeds (dict[str, int], optional): the seeds the host settled for the
            group's nodes (`Run.seeds`: a restored tree's, the nodes' own,
            derived from ``seed``, or random); they win over ``seed``, so
            every process seeds its nodes as the host says.
        address (str): the host's data-plane endpoint for this group.
        host_pid (int): the host's pid (the loop ends when the host is gone);
            0: the host is on another machine (its heartbeat tells).
        timer (str): ``"simulated"`` (the host grants delta cycles) or
            ``"realtime"`` (the group runs on its own clock and ships its
            sends as they come).
        pools (str, optional): the prefix of this link's shared-memory pools
            (None: large tensors go inline).
        trace (int, optional): record a trace into a buffer of this many
            records (the group's share of the Tracer's capacity); the host
            takes it with `TakeTrace`. None: untraced.
        secure (bool): the data plane runs over ``tcp://`` between machines,
            authenticated by the run's shared secret, which this process reads
            from its own environment (`secret.load_secret`: it never travels).
        heartbeat (str, optional): the host's heartbeat endpoint
            (`heartbeat.Monitor`): this process answers its pings, named
            ``group``, so the host finds it lost within the run's heartbeat
            timeout; and it ends itself once the host has not pinged it for
            `ORPHAN_S` (the host, or its machine, is gone).
        max_delta_cycles (int): ``mujou.run(max_delta_cycles=)``: an instant
            of the group's kernel past it is an algebraic loop. Default: 10000.
        check_read_only (bool): ``mujou.run(check_read_only=)``: the group's
            kernel fails a node that changes a message it received in place
            (`actor.guard_read_only`). Default: False.
        stop_timeout (float): ``mujou.run(stop_timeout=)``: a hook still
            running this many wall seconds after it was first seen is logged,
            and again with back-off (`Watcher`, as one process does). Default: 10.0.
        cuda_ipc (bool): the host and this group are on one machine and CUDA
            tensors cross by CUDA IPC (`cudaipc`): the group's CUDA senders keep
            messages for other groups on their device, and its link shares and
            opens device memory. Default: False (the host path).
        params (dict, optional): ``mujou.run(params=)`` for the group's nodes:
            set on every net the group builds (its first, and each after a
            restart), before its kernel. Default: None.
        torch_settings (dict, optional): the host's process-wide torch settings
            (`devices.torch_settings`: threads, deterministic algorithms, the
            default dtype, matmul precision, the backends' flags), applied
            before the factory is imported, so the group's nodes compute as
            they would in the host's process. Default: None (torch's defaults).

    Returns:
        GroupServer: serving (a `grouprt.RealTimeGroupServer` in real time);
        the control plane calls its `GroupServer.handle`.

    Raises:
        TypeError / ValueError: ``workers`` is not an int / is below 1.
        ValueError: a torch setting of the host's that this process cannot
            take (`devices.apply_torch_settings`).
        SecretError: ``secure`` and this machine has no valid secret.
        HandshakeError: the host refused this machine's secret (or did not
            answer within `HANDSHAKE_S`).
    """
    server = RealTimeGroupServer if timer == "realtime" else GroupServer
    return server(group=group, factory=factory, net_kwargs=net_kwargs, nodes=nodes,
                  seed=seed, workers=workers, address=address, host_pid=host_pid,
                  timer=timer, pools=pools, trace=trace, secure=secure,
                  heartbeat=heartbeat, seeds=seeds, check_read_only=check_read_only,
                  max_delta_cycles=max_delta_cycles,
                  stop_timeout=stop_timeout, cuda_ipc=cuda_ipc, params=params,
                  torch_settings=torch_settings)
