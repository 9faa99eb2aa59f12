"""The live view's parameters: Foxglove's Parameters panel over `Run.params` and `Run.set_param`.

`ParamPanel` answers the parameter ops of Foxglove's WebSocket protocol
(capabilities ``parameters`` and ``parametersSubscribe``) for `liveview`'s
server, each parameter named by its dotted path (``"sensor.noise"``):

* ``getParameters``: the values now (`Run.params`); no names: all of them;
* ``setParameters``: each value through `Run.set_param`, only when the
  server allows it (``serve_foxglove(allow_params=True)``,
  ``--foxglove-params``); a refused set (not allowed, no such parameter, a
  read-only one, a value of the wrong JSON type or that breaks the
  parameter's rules) changes nothing and is answered with a ``status`` of
  level error naming the parameter and the rule. Either way the client then
  gets ``parameterValues`` (with the request's ``id``): the value set for an
  accepted set (the node applies it at its next delta cycle), the value now
  for a refused one, so a panel shows what the run holds;
* ``subscribeParameterUpdates`` / ``unsubscribeParameterUpdates``: a
  subscriber gets ``parameterValues`` for each subscribed parameter at the
  first look after it subscribed, then whenever the value changed. The
  values are looked at every `POLL_EVERY` wall seconds, and only while a
  client subscribes: a set is seen once the node has applied it (so a
  subscriber, the setter too, sees when it took effect), and a parameter the
  node's own code changes is seen as well.

Bounds: a request names at most `MAX_NAMES` parameters (more: refused), and
a ``parameterValues`` message carries at most `MAX_PER_MESSAGE` (a longer
answer goes in several, each with the request's ``id``). A client has at
most one update in flight: one that reads slowly gets the newest values
when it has taken the last, never a queue of old ones.

Threads: the ops run on the server's loop (``mujou-foxglove``); the calls to
the run (``params``, ``set_param``: a placed run's wait for the driver's
round in progress) run on ``mujou-foxglove-calls``, through the server's
``call``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from ..errors import NotRunningError, ParamError, describe
from ..host import Run
from ..params import Param, RunParams, iter_params
from .wsserver import Client

__all__: list[str] = []  # nothing public: the live view serves it

log = logging.getLogger("mujou_actors")

MAX_NAMES = 256
"""The most parameters one request (get, set, subscribe, unsubscribe) may name."""

MAX_PER_MESSAGE = 256
"""The most parameters one ``parameterValues`` message carries."""

POLL_EVERY = 0.5
"""Wall seconds between two looks at the values, while a client subscribes to some."""

CAPABILITIES = ("parameters", "parametersSubscribe")
"""The server capabilities of Foxglove's protocol that the panel serves."""

SETS_OFF = ("setting parameters is off (serve_foxglove(allow_params=True), "
            "--foxglove-params)")

# What json.loads makes of a JSON number, boolean or string: the only values a set may
# carry (a parameter is a bool, int, float or str; null would unset it, which none may).
_SCALARS = (bool, int, float, str)
_UNSENT = object()  # a subscription's value before its first update
_LISTED = 3  # refusals named in one status message; the rest counted

Call = Callable[..., Awaitable[Any]]


class ParamPanel:
    """Foxglove's parameter ops for one live view: get, set, subscribe, and the updates.

    Args:
        run (Run): the run served (a placed run's: its host).
        allow_set (bool): whether ``setParameters`` reaches `Run.set_param`.
        call (Call): ``await call(fn, *args)`` runs ``fn(*args)`` off the loop
            (the server's ``mujou-foxglove-calls`` thread) and gives its result.
    """

    def __init__(self, run: Run, allow_set: bool, call: Call) -> None:
        self._run = run
        self._allow_set = allow_set
        self._call = call
        # The declarations, from the host's nodes (a placed run's copies declare the same):
        # what each name is, to type an answer and to explain an unknown name.
        self._table = RunParams(run.nodes.items())
        self._params: dict[str, Param] = {path: p for path, _, p in
                                          iter_params(run.nodes.items())}
        # client -> {name: the value it was last sent}; only the loop's thread touches it
        self._subs: dict[Client, dict[str, Any]] = {}
        self._sending: dict[Client, asyncio.Future[None]] = {}
        self.counts = {"params_set": 0, "params_refused": 0}
        self.ops: dict[str, Callable[[Client, dict[str, Any]], Awaitable[None]]] = {
            "getParameters": self._get, "setParameters": self._set,
            "subscribeParameterUpdates": self._subscribe,
            "unsubscribeParameterUpdates": self._unsubscribe}

    @property
    def names(self) -> list[str]:
        """list[str]: the parameters' dotted paths, in the net's order."""
        return list(self._params)

    # -- the ops ------------------------------------------------------------------------
    async def _get(self, client: Client, op: dict[str, Any]) -> None:
        """``getParameters``: the named values now (none named: all), with the request's id."""
        names, request_id = self._names(op), _request_id(op)
        values = await self._values(client)
        if values is None:
            return
        unknown = [n for n in names if n not in values]
        if unknown:
            await self._status(client, 1, f"getParameters: {self._unknown(unknown)}")
        await self._send_values(client, {n: values[n] for n in names or values
                                         if n in values}, request_id)

    async def _set(self, client: Client, op: dict[str, Any]) -> None:
        """``setParameters``: each set checked, made if allowed; refusals said; values sent."""
        items, request_id = op["parameters"], _request_id(op)
        if not isinstance(items, list) or len(items) > MAX_NAMES:
            raise ValueError(f"parameters must be a list of at most {MAX_NAMES} items")
        sets, refused = self._checked(items)
        off = [] if self._allow_set else list(sets)  # a watcher may not change the robot
        if off:
            sets = {}
        done, late = await self._call(self._apply, sets) if sets else ({}, [])
        refused += late
        self.counts["params_set"] += len(done)
        self.counts["params_refused"] += len(refused) + len(off)
        whys = [why for _, why in refused]
        if off:
            whys.insert(0, f"{SETS_OFF}: {_listed(off)}")
        if whys:
            await self._refuse(client, whys)
        # The answer holds what the run holds: the value set, or for a refused one the
        # value now (a panel that showed the refused value shows the run's again).
        unchanged = [name for name, _ in refused] + off
        now = await self._values(client) if unchanged else {}
        if now is None:
            return
        await self._send_values(client, {**{n: now[n] for n in unchanged if n in now},
                                         **done}, request_id)

    async def _subscribe(self, client: Client, op: dict[str, Any]) -> None:
        """``subscribeParameterUpdates``: the named (none named: all) join the client's."""
        names = self._names(op) or list(self._params)
        unknown = [n for n in names if n not in self._params]
        subs = self._subs.setdefault(client, {})
        for name in names:
            if name in self._params:
                subs.setdefault(name, _UNSENT)  # a name subscribed already stays as it is
        if not subs:
            del self._subs[client]
        if unknown:
            await self._status(client, 1, f"subscribeParameterUpdates: "
                                          f"{self._unknown(unknown)}")

    async def _unsubscribe(self, client: Client, op: dict[str, Any]) -> None:
        """``unsubscribeParameterUpdates``: the named (none named: all) leave the client's."""
        names = self._names(op)
        subs = self._subs.get(client, {})
        for name in names or list(subs):
            subs.pop(name, None)
        if not subs:
            self._subs.pop(client, None)

    # -- what the ops share ---------------------------------------------------------------
    def _names(self, op: dict[str, Any]) -> list[str]:
        """The request's ``parameterNames`` (empty: all), checked: a list of str, bounded."""
        names = op.get("parameterNames") or []
        if not isinstance(names, list) or len(names) > MAX_NAMES \
                or not all(isinstance(n, str) for n in names):
            raise ValueError(f"parameterNames must be a list of at most {MAX_NAMES} str")
        return list(dict.fromkeys(names))

    def _checked(self, items: list[Any]) -> tuple[dict[str, Any], list[tuple[str, str]]]:
        """The sets a request asks for, each checked as JSON; and the refused, with why.

        What `Run.set_param` checks itself (the name, read-only, the type, the
        range, the choices) is left to it: one rule, one message.

        Raises:
            ValueError: an item that is no object with a str ``name``.
        """
        sets: dict[str, Any] = {}
        refused: list[tuple[str, str]] = []
        for item in items:
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                raise ValueError("each parameter must be an object with a str name")
            name = item["name"]
            why = _json_problem(item, self._params.get(name))
            if why is None:
                sets[name] = item["value"]
            else:
                refused.append((name, f"parameter {name[:128]!r}: {why}"))
        return sets, refused

    def _apply(self, sets: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[str, str]]]:
        """On ``mujou-foxglove-calls``: each set through `Run.set_param`, in order.

        Returns:
            tuple: the values set (as the parameters hold them), by name; the
            refused sets, ``(name, why)``.
        """
        done: dict[str, Any] = {}
        refused: list[tuple[str, str]] = []
        for name, value in sets.items():
            try:
                self._run.set_param(name, value)
            except (ParamError, NotRunningError) as exc:
                refused.append((name, str(exc)))
            else:  # the value as the node holds it (a float parameter's int made a float)
                done[name] = self._params[name].check(value)
        return done, refused

    async def _values(self, client: Client) -> dict[str, Any] | None:
        """`Run.params` off the loop; None (the client told) when the run cannot answer."""
        try:
            return await self._call(self._run.params)
        except Exception as exc:  # noqa: BLE001 - a placed run that has ended
            await self._status(client, 2, f"the parameters cannot be read: {describe(exc)}")
            return None

    def _unknown(self, names: list[str]) -> str:
        """Words for names the run has no parameter of (the first's error names those it has)."""
        try:
            self._table.resolve(names[0])
            first = f"no parameter {names[0]!r}"
        except ParamError as exc:
            first = str(exc)
        more = f" (and {len(names) - 1} more unknown)" if len(names) > 1 else ""
        return (first + more)[:512]

    async def _refuse(self, client: Client, whys: list[str]) -> None:
        """One error status for a request's refused sets: each (the first few) and its rule."""
        listed = "; ".join(why[:300] for why in whys[:_LISTED])
        more = f"; and {len(whys) - _LISTED} more" if len(whys) > _LISTED else ""
        text = f"setParameters refused, nothing changed for these: {listed}{more}"
        client.warn(text)  # the log has the client's share only; the client, every answer
        await self._status(client, 2, text, logged=False)

    async def _status(self, client: Client, level: int, text: str,
                      logged: bool = True) -> None:
        """A ``status`` message to the client (level 1 warning, 2 error); an error logged,
        within the client's share of warnings, unless ``logged`` is False."""
        if logged and level >= 2:
            client.warn(text)
        await client.ws.send(json.dumps({"op": "status", "level": level, "message": text}))

    async def _send_values(self, client: Client, values: dict[str, Any],
                           request_id: str | None) -> None:
        """``parameterValues`` of ``values``, `MAX_PER_MESSAGE` a message (at least one)."""
        entries = [self._entry(name, value) for name, value in values.items()]
        for start in range(0, max(len(entries), 1), MAX_PER_MESSAGE):
            message: dict[str, Any] = {"op": "parameterValues",
                                       "parameters": entries[start:start + MAX_PER_MESSAGE]}
            if request_id is not None:
                message["id"] = request_id
            await client.ws.send(json.dumps(message, allow_nan=False))

    def _entry(self, name: str, value: Any) -> dict[str, Any]:
        """One parameter of ``parameterValues``; a float's type said, so that ``1.0`` stays
        a float in a JavaScript client, where it reads as the number 1."""
        param = self._params.get(name)
        if param is not None and param.type is float:
            return {"name": name, "value": value, "type": "float64"}
        return {"name": name, "value": value}

    # -- the updates ------------------------------------------------------------------------
    async def poll(self) -> None:
        """Every `POLL_EVERY` s while a client subscribes: send each subscriber what changed.

        Runs on the loop until cancelled (the server's end).
        """
        while True:
            await asyncio.sleep(POLL_EVERY)
            if not self._subs:
                continue
            try:
                values = await self._call(self._run.params)
            except Exception as exc:  # noqa: BLE001 - a placed run that ended: the view ends
                log.debug("foxglove: the parameters cannot be read: %s", describe(exc))
                continue
            self.notify(values)

    def notify(self, values: dict[str, Any]) -> None:
        """Start sending each subscriber its subscribed values that changed since its last.

        A client whose previous update is still being written is skipped: it
        gets what changed at a later look (its last values are kept as sent).
        """
        for client, subs in self._subs.items():
            pending = self._sending.get(client)
            if pending is not None and not pending.done():
                continue
            changed = {name: values[name] for name, last in subs.items()
                       if name in values and (last is _UNSENT or values[name] != last)}
            if not changed:
                continue
            subs.update(changed)
            self._sending[client] = asyncio.ensure_future(self._update(client, changed))

    async def _update(self, client: Client, values: dict[str, Any]) -> None:
        with contextlib.suppress(Exception):  # a client gone: its end forgets it
            await self._send_values(client, values, None)

    def forget(self, client: Client) -> None:
        """A client's end: its subscriptions go, its update in flight is cancelled."""
        self._subs.pop(client, None)
        pending = self._sending.pop(client, None)
        if pending is not None:
            pending.cancel()


def _json_problem(item: dict[str, Any], param: Param | None) -> str | None:
    """Why a set's JSON cannot be a parameter's value (None: it may be; the run checks it)."""
    value, kind = item.get("value"), item.get("type")
    if value is None:  # missing, or null: Foxglove's "unset", which a node's parameter is not
        return "a parameter cannot be unset: give a value"
    if type(value) not in _SCALARS:
        return f"the value is a JSON {type(value).__name__}; a parameter is a bool, int, " \
               "float or str"
    if kind not in (None, "float64"):
        return f"type {str(kind)[:32]!r} is none of a run's (float64, or none)"
    if kind == "float64" and param is not None and param.type is not float:
        return f"type 'float64' is a float's; this parameter is {param.describe()['type']}"
    return None


def _listed(names: list[str]) -> str:
    """Names for a message: the first few, each cut, and how many more."""
    shown = ", ".join(repr(n[:128]) for n in names[:8])
    return shown + (f" and {len(names) - 8} more" if len(names) > 8 else "")


def _request_id(op: dict[str, Any]) -> str | None:
    """A request's optional ``id``: a str the answer carries back."""
    request_id = op.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise ValueError("id must be a str")
    return request_id
