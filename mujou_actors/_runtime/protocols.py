"""The typed protocols between the kernel's parts and whatever drives them.

The dispatcher knows what drives it (the run's coordinator, or a test, or
later a process of a multi-process run) only through `KernelListener`: four
calls, each with its locking rule, and no other channel. The driver talks
back to the dispatcher only through the dispatcher's methods.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..stats import CapsuleStats, RecordingStats
    from .actor import Actor

__all__ = ["KernelListener", "HostSide", "Subscribed", "RecorderSide"]


class KernelListener(Protocol):
    """What a `Dispatcher` tells the one that drives it.

    Two calls come with the dispatcher's lock held (`reached_end`, `held`):
    they must not block, nor call back into the dispatcher, nor take a lock
    that is ever held while calling the dispatcher; they post an event for
    the driver's own thread. The other two come without any lock of the
    dispatcher's, on the thread where it happened.
    """

    def hook_failed(self, actor: Actor, hook: str, exc: BaseException) -> None:
        """A hook raised (no lock held; on the thread that ran the hook).

        Args:
            actor (Actor): the actor whose hook raised.
            hook (str): the hook's name (``"on_update"``, ``"on_start"``...).
            exc (BaseException): what it raised, whatever it is.
        """

    def reached_end(self) -> None:
        """The run's end (`Dispatcher.set_end`) is reached; timed work has stopped.

        Called once, WITH the dispatcher's lock held: must not block; posts an
        event.
        """

    def held(self) -> None:
        """The dispatcher entered a hold (a consistent cut), whoever asked for it.

        Called WITH the dispatcher's lock held: must not block; posts an event.
        """

    def crashed(self, exc: BaseException) -> None:
        """An exception escaped a thread's loop: a defect of the kernel, not a hook's.

        No lock held. The run must end and report it, never lose it.

        Args:
            exc (BaseException): what escaped.
        """


class Subscribed(Protocol):
    """A subscription whose callback failed, as the host side reports it (`host.Subscription`)."""

    @property
    def port(self) -> str:
        """str: the dotted path of the port subscribed to."""


class HostSide(Protocol):
    """What the coordinator asks of a run's host side (`host.Host`): its bounded end.

    The kernel does not import host.py: the run attaches its host side to the
    coordinator (`Coordinator.attach_host`).
    """

    def close(self, timeout: float) -> None:
        """Deliver what is queued for at most ``timeout`` wall seconds, wake every waiter.

        Args:
            timeout (float): wall seconds; 0 delivers nothing more.
        """


class CapsuleSide(Protocol):
    """What the coordinator asks of a run's crash capsule (`capsule.CapsuleKeeper`).

    The kernel does not import recording/capsule.py: the run attaches it to the
    coordinator (`Coordinator.attach_capsule`), which hands it the
    supervisor's snapshots, a one_for_all restart's rewind and the first
    failure, and closes it at the end.
    """

    def snapshot(self, tree: dict[str, Any]) -> None:
        """A supervisor snapshot was taken (its tree); never blocks."""

    def param(self, key: tuple[int, int], node: str, name: str, value: Any) -> None:
        """A parameter set was made on the running net, applying from ``key``: keep it."""

    def restored(self, tree: dict[str, Any]) -> None:
        """A one_for_all restart took the net back to ``tree``."""

    def failed(self, path: str, hook: str, exc: BaseException, key: tuple[int, int]) -> None:
        """A hook raised (on its thread): write the capsule of the first failure."""

    def close(self, timeout: float) -> BaseException | None:
        """Wait for the capsule being written; what made it fail, None if nothing did."""

    def stats(self) -> CapsuleStats:
        """The capsule's counts so far."""


class RecorderSide(Protocol):
    """What the coordinator asks of a run's recording (`recording.Recorder`).

    The kernel does not import recording/recorder.py: the run attaches its recorder to
    the coordinator (`Coordinator.attach_recorder`), which hands it the
    supervisor's snapshots and closes it at the end.
    """

    def snapshot(self, tree: dict[str, Any]) -> None:
        """A supervisor snapshot was taken (its tree): attach it if asked to; never blocks."""

    def param(self, key: tuple[int, int], node: str, name: str, value: Any) -> None:
        """A parameter set was made on the running net, applying from ``key``: keep it."""

    def close(self, end_ns: int | None, failure: str, timeout: float) -> BaseException | None:
        """Write what is queued within ``timeout`` wall seconds, then the file's end.

        Args:
            end_ns (int | None): the run's end time, ns (None: unknown).
            failure (str): what made the run fail, ``""`` if nothing.
            timeout (float): wall seconds.

        Returns:
            BaseException | None: what made the writer fail, None if nothing did.
        """

    def stats(self) -> RecordingStats:
        """The recording's counts so far."""
