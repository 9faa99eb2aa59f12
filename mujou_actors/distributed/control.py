"""What a placed run's driver asks of one group, wherever the group runs.

The driver (`driver._Driver`) controls every group through one interface,
`GroupControl`: start its nodes, restore part of a tree, take its state, a
host's write or read, publish an Output to the host, restart one node, its
figures, the ends of its peer links to other machines, its stop. Two
implementations keep the same contract:

* `LocalControl`: the host's own group, a `Kernel` in this process, called
  directly on the driver's thread (the kernel of its current link: a restart
  replaces both);
* `RemoteControl`: a group process, here or on another machine, through the
  control plane's requests (`group.Start`, `group.Write`, ...; answered by
  `group.GroupServer.handle`), trees and messages crossing as the snapshot
  codec's bytes, each wait bounded.

So the driver's rules (when to ask, what to do with the answer, a dead
group's last figures) are written once, whichever side runs the group.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from .. import snapshot
from .._runtime.keys import Key
from . import group

if TYPE_CHECKING:
    from .._runtime.kernel import Kernel

__all__ = ["GroupControl", "LocalControl", "RemoteControl"]

# Wall seconds a remote group is given for a request that runs no hook (a write, a
# read, a subscription, its figures) or restores one node: generous, since a busy
# group answers between two grants.
QUICK_S = 30.0
# The slack beyond a request's own bound (its start, restore, cut or stop) for the
# request's trip across the control plane.
TRIP_S = 5.0

Ask = Callable[[str, Any, float], Any]  # `driver._Driver.ask`: name, request, timeout


class GroupControl(Protocol):
    """The control operations of one group (see the module's docstring)."""

    def start(self, timeout: float) -> None:
        """Run every ``on_start`` of the group's nodes within ``timeout`` wall seconds.

        Raises:
            StartTimeoutError: not done in time (the nodes named); NodeError: a hook raised.
        """

    def load(self, tree: dict[str, Any], timeout: float) -> None:
        """Restore the group's part of a state tree (`group.split_tree`) within ``timeout``."""

    def take_state(self, timeout: float) -> dict[str, Any]:
        """The group's state tree at the cut it is held at (``timeout``: for its hooks)."""

    def write(self, input: str, message: Any, key: Key | None) -> None:
        """A host's write to an Input of the group, at ``key`` (None: as one process's)."""

    def read(self, port: str) -> Any:
        """The newest message of a port of the group (`Run.read`)."""

    def set_param(self, node: str, name: str, value: Any, key: Key | None) -> Key:
        """Queue a checked parameter set on a node of the group; the key it applies from."""

    def params(self) -> dict[str, Any]:
        """Every parameter of the group's nodes and its value now, by dotted path."""

    def subscribe(self, output: str) -> None:
        """Publish every later message of an Output of the group to the host."""

    def restart_node(self, path: str, state: Any) -> None:
        """Restart one node of the group from its ``state`` (its ``load_state_dict``)."""

    def stats(self) -> dict[str, Any]:
        """The group's figures as plain data (`group.link_stats`)."""

    def hold(self, timeout: float) -> bool:
        """Real time: hold the group at a cut (no hook in flight) within ``timeout``;
        False when its hooks did not return in time (it is not held)."""

    def release(self) -> None:
        """Real time: let a held group go on."""

    def run_free(self) -> int | None:
        """Real time: the group's kernel runs free on its own clock from now; the
        timer's origin on its machine's monotonic clock (ns), None for the host's own."""

    def bind_peers(self, generation: int, hosts: dict[str, str],
                   local: dict[str, str] | None = None) -> dict[str, str]:
        """Listen for the peer links of mesh ``generation`` made ahead (`group.BindPeers`):
        peer -> the address to listen on (TCP); ``local``, peer -> the ``ipc://`` socket's
        name for a peer of the group's own member's machine; the reply, peer -> endpoint."""

    def connect_peers(self, generation: int, endpoints: dict[str, str]) -> None:
        """Connect to the peers' listening ends of mesh ``generation`` (`group.ConnectPeers`)."""

    def check_peers(self, generation: int, timeout: float, listening: bool) -> dict[str, str]:
        """Wait for the handshake of every end made for mesh ``generation`` that listens
        (``listening``) or connects (`group.CheckPeers`); peer -> why, for each that failed."""

    def drop_peers(self) -> None:
        """Close the ends made for a mesh that will not be opened (`group.DropPeers`)."""

    def peer_clocks(self, generation: int, clocks: dict[str, tuple[str, int]]) -> None:
        """Real time: the timer origins of the groups on other machines that send to this
        one on the peer links of mesh ``generation``, peer -> (its machine, its origin),
        for the ages of their messages (`group.PeerClocks`)."""

    def logs(self, level: int | None, loggers: dict[str, int],
             timeout: float) -> tuple[list[tuple[int, dict[str, Any]]], int]:
        """Forward the group's log records from ``level`` up (None: stop) and take those
        kept (`group.Logs`): ``(entries, dropped)``, within ``timeout`` wall seconds."""

    def stop(self, stop_timeout: float, take_state: bool,
             idle: float) -> tuple[Mapping[str, str] | list[str], dict[str, Any] | None]:
        """Stop the group (``on_stop``); its stuck nodes' hooks, and its final tree.

        Args:
            stop_timeout (float): wall seconds for its ``on_stop`` hooks.
            take_state (bool): take the final tree (False: a group whose grant is
                still out has none to give).
            idle (float): wall seconds left for the hooks in flight.

        Returns:
            ``(stuck, tree)``: node path -> the hook it is stuck in (a list of paths
            from a server that names no hooks), and the final tree, or None when
            a node was stuck or none was asked for.
        """


class LocalControl:
    """`GroupControl` of the host's own group: the kernel of its link, called here.

    Args:
        entry: the driver's record of the group (`driver._Group`); its ``link``
            (`group.LocalLink`: the kernel, its published Outputs, its message
            counts) is read at each call, since a restart gives the group a new
            kernel and link.
    """

    def __init__(self, entry: Any) -> None:
        self._entry = entry

    @property
    def kernel(self) -> Kernel:
        """Kernel: the group's kernel now (a restart replaces it)."""
        kernel: Kernel = self._entry.link.kernel
        return kernel

    def start(self, timeout: float) -> None:
        """`GroupControl.start`."""
        self.kernel.start(timeout=timeout)

    def load(self, tree: dict[str, Any], timeout: float) -> None:
        """`GroupControl.load`."""
        self.kernel.load_state_dict(tree, timeout=timeout)

    def take_state(self, timeout: float) -> dict[str, Any]:
        """`GroupControl.take_state`."""
        return self.kernel.state_dict(timeout=timeout)

    def write(self, input: str, message: Any, key: Key | None) -> None:
        """`GroupControl.write`."""
        group.host_write(self.kernel, input, message, key)

    def read(self, port: str) -> Any:
        """`GroupControl.read`."""
        return self.kernel.read(port)

    def set_param(self, node: str, name: str, value: Any, key: Key | None) -> Key:
        """`GroupControl.set_param`."""
        return self.kernel.set_param(node, name, value, key)

    def params(self) -> dict[str, Any]:
        """`GroupControl.params`."""
        return self.kernel.params.values()

    def subscribe(self, output: str) -> None:
        """`GroupControl.subscribe`."""
        link = self._entry.link
        link.published.listen(link.kernel, output)

    def restart_node(self, path: str, state: Any) -> None:
        """`GroupControl.restart_node`."""
        self.kernel.restart_node(path, state)

    def stats(self) -> dict[str, Any]:
        """`GroupControl.stats`."""
        link = self._entry.link
        return group.link_stats(link.kernel, link, link.counted)

    def hold(self, timeout: float) -> bool:
        """`GroupControl.hold`."""
        return bool(self.kernel.hold(timeout))

    def release(self) -> None:
        """`GroupControl.release`."""
        self.kernel.release()

    def run_free(self) -> int | None:
        """`GroupControl.run_free`: the host's clock is the run's own (no origin to keep)."""
        self.kernel.run_free()
        return None

    # Peer links never apply with nodes in the host's group (its messages go through the
    # driver it runs on): nothing asks these of it.
    def bind_peers(self, generation: int, hosts: dict[str, str],
                   local: dict[str, str] | None = None) -> dict[str, str]:
        """`GroupControl.bind_peers`: not for the host's group."""
        raise RuntimeError("the host's own group has no peer links")

    def connect_peers(self, generation: int, endpoints: dict[str, str]) -> None:
        """`GroupControl.connect_peers`: not for the host's group."""
        raise RuntimeError("the host's own group has no peer links")

    def check_peers(self, generation: int, timeout: float, listening: bool) -> dict[str, str]:
        """`GroupControl.check_peers`: not for the host's group."""
        raise RuntimeError("the host's own group has no peer links")

    def drop_peers(self) -> None:
        """`GroupControl.drop_peers`: nothing held."""

    def peer_clocks(self, generation: int, clocks: dict[str, tuple[str, int]]) -> None:
        """`GroupControl.peer_clocks`: not for the host's group."""
        raise RuntimeError("the host's own group has no peer links")

    def logs(self, level: int | None, loggers: dict[str, int],
             timeout: float) -> tuple[list[tuple[int, dict[str, Any]]], int]:
        """`GroupControl.logs`: none (the host's group logs in the host, where the taps are)."""
        return [], 0

    def stop(self, stop_timeout: float, take_state: bool,
             idle: float) -> tuple[Mapping[str, str] | list[str], dict[str, Any] | None]:
        """`GroupControl.stop`."""
        # ``take_state`` is moot here: the host's group runs its grants on the
        # driver's thread, so none is still out when the driver stops it.
        kernel = self.kernel
        stuck = group.stop_kernel(kernel, stop_timeout, idle)
        return stuck, None if stuck else kernel.state_dict()


class RemoteControl:
    """`GroupControl` of a group process: its control requests through ``ask``.

    Args:
        ask: `driver._Driver.ask` (the control plane's ``system.ask``, a node's
            failure raised as the host's `NodeError`).
        name (str): the group's name.
    """

    def __init__(self, ask: Ask, name: str) -> None:
        self._ask = ask
        self.name = name

    def start(self, timeout: float) -> None:
        """`GroupControl.start`."""
        self._ask(self.name, group.Start(timeout), timeout + TRIP_S)

    def load(self, tree: dict[str, Any], timeout: float) -> None:
        """`GroupControl.load`."""
        self._ask(self.name, group.Load(snapshot.dumps(tree), timeout), timeout + TRIP_S)

    def take_state(self, timeout: float) -> dict[str, Any]:
        """`GroupControl.take_state`."""
        tree: dict[str, Any] = snapshot.loads(
            self._ask(self.name, group.TakeState(timeout), timeout + TRIP_S))
        return tree

    def write(self, input: str, message: Any, key: Key | None) -> None:
        """`GroupControl.write`."""
        self._ask(self.name, group.Write(input, snapshot.dumps(message), key), QUICK_S)

    def read(self, port: str) -> Any:
        """`GroupControl.read`."""
        return snapshot.loads(self._ask(self.name, group.Read(port), QUICK_S))

    def set_param(self, node: str, name: str, value: Any, key: Key | None) -> Key:
        """`GroupControl.set_param`."""
        t_ns, delta = self._ask(self.name, group.SetParam(node, name, value, key), QUICK_S)
        return (int(t_ns), int(delta))

    def params(self) -> dict[str, Any]:
        """`GroupControl.params`."""
        values: dict[str, Any] = self._ask(self.name, group.Params(), QUICK_S)
        return values

    def subscribe(self, output: str) -> None:
        """`GroupControl.subscribe`."""
        self._ask(self.name, group.Subscribe(output), QUICK_S)

    def restart_node(self, path: str, state: Any) -> None:
        """`GroupControl.restart_node`."""
        self._ask(self.name, group.RestartNode(path, snapshot.dumps(state)), QUICK_S)

    def stats(self) -> dict[str, Any]:
        """`GroupControl.stats`."""
        figures: dict[str, Any] = self._ask(self.name, group.Stats(), QUICK_S)
        return figures

    def hold(self, timeout: float) -> bool:
        """`GroupControl.hold`."""
        return bool(self._ask(self.name, group.Hold(timeout), timeout + TRIP_S))

    def release(self) -> None:
        """`GroupControl.release`."""
        self._ask(self.name, group.Release(), 30.0)

    def run_free(self) -> int | None:
        """`GroupControl.run_free` (`group.RunFree`'s answer: the timer's origin)."""
        origin = self._ask(self.name, group.RunFree(), 30.0)
        return origin if isinstance(origin, int) else None

    def bind_peers(self, generation: int, hosts: dict[str, str],
                   local: dict[str, str] | None = None) -> dict[str, str]:
        """`GroupControl.bind_peers`."""
        endpoints: dict[str, str] = self._ask(
            self.name, group.BindPeers(generation, hosts, dict(local or {})), QUICK_S)
        return endpoints

    def connect_peers(self, generation: int, endpoints: dict[str, str]) -> None:
        """`GroupControl.connect_peers`."""
        self._ask(self.name, group.ConnectPeers(generation, endpoints), QUICK_S)

    def check_peers(self, generation: int, timeout: float, listening: bool) -> dict[str, str]:
        """`GroupControl.check_peers`."""
        failed: dict[str, str] = self._ask(
            self.name, group.CheckPeers(generation, timeout, listening), timeout + TRIP_S)
        return failed

    def drop_peers(self) -> None:
        """`GroupControl.drop_peers`."""
        self._ask(self.name, group.DropPeers(), QUICK_S)

    def peer_clocks(self, generation: int, clocks: dict[str, tuple[str, int]]) -> None:
        """`GroupControl.peer_clocks`."""
        self._ask(self.name, group.PeerClocks(generation, clocks), QUICK_S)

    def logs(self, level: int | None, loggers: dict[str, int],
             timeout: float) -> tuple[list[tuple[int, dict[str, Any]]], int]:
        """`GroupControl.logs`."""
        entries, dropped = self._ask(self.name, group.Logs(level, loggers), timeout)
        return list(entries), int(dropped)

    def stop(self, stop_timeout: float, take_state: bool,
             idle: float) -> tuple[Mapping[str, str] | list[str], dict[str, Any] | None]:
        """`GroupControl.stop`."""
        # A group still in a grant is stopped too: its control thread is free, and
        # the stop ends the grant (or names the stuck hook).
        stuck, tree = self._ask(self.name, group.Stop(stop_timeout, take_state, idle),
                                idle + 2 * stop_timeout + TRIP_S)
        return stuck, None if tree is None else snapshot.loads(tree)
