"""The live view's parameters (Foxglove's Parameters panel), driven by a real WebSocket client.

The nets are tests/nets/param_nets.py's: a real-time ``sensor`` updating every
20 ms, so a set applies within one period; each wait is bounded (the client's
``recv`` timeouts, the node's ``applied`` event, `_until`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import mujou_actors as mujou
from mujou_actors.recording import paramview
from tests.nets.param_nets import make_net
from tests.test_foxglove import Client, _until

pytestmark = pytest.mark.timeout(60)


class ParamClient(Client):
    """A Foxglove client that also keeps the ``parameterValues`` and statuses it gets."""

    def __init__(self, port: int) -> None:
        super().__init__(port)
        self.values: list[dict[str, Any]] = []  # each parameterValues message
        self.levels: list[tuple[int, str]] = []  # (level, message) of each status

    def recv(self) -> None:
        frame = self.ws.recv(timeout=10)
        if not isinstance(frame, str):
            return  # the time: not these tests' business
        op = json.loads(frame)
        if op["op"] == "serverInfo":
            self.info = op
        elif op["op"] == "parameterValues":
            self.values.append(op)
        elif op["op"] == "status":
            self.levels.append((op["level"], op["message"]))

    def answer(self, request_id: str) -> dict[str, Any]:
        """The values of the parameterValues answers with this id, once one came."""
        def found() -> Any:
            return [m for m in self.values if m.get("id") == request_id]
        messages = self.recv_until(found, f"the answer {request_id}")
        return {p["name"]: p for m in messages for p in m["parameters"]}

    def update(self, condition: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        """The first update (parameterValues without an id) whose values satisfy ``condition``."""
        def found() -> Any:
            return next((m for m in self.values if "id" not in m and condition(
                {p["name"]: p["value"] for p in m["parameters"]})), None)
        message = self.recv_until(found, "a parameter update")
        return {p["name"]: p["value"] for p in message["parameters"]}


@pytest.fixture(autouse=True)
def _fast_updates(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(paramview, "POLL_EVERY", 0.05)


def _serve(allow_params: bool) -> Iterator[tuple[Any, Any, Any]]:
    net = make_net()
    run = mujou.run(net, timer="realtime")
    try:
        server = mujou.serve_foxglove(run, 0, allow_params=allow_params)
    except BaseException:
        run.stop()
        raise
    try:
        yield run, server, net["sensor"]
    finally:
        server.close()
        run.stop()
        run.join(timeout=20)


@pytest.fixture
def settable() -> Iterator[tuple[Any, Any, Any]]:
    yield from _serve(allow_params=True)


@pytest.fixture
def watched() -> Iterator[tuple[Any, Any, Any]]:
    yield from _serve(allow_params=False)


def test_the_parameters_are_read_by_their_paths_a_float_typed_float64(watched: Any) -> None:
    run, server, _ = watched
    client = ParamClient(server.port)
    client.recv_until(lambda: client.info, "the server's info")

    client.send({"op": "getParameters", "parameterNames": [], "id": "all"})
    every = client.answer("all")
    client.send({"op": "getParameters", "parameterNames": ["sensor.mode", "sensor.nope"],
                 "id": "two"})
    two = client.answer("two")

    assert {"parameters", "parametersSubscribe"} <= set(client.info["capabilities"])
    assert every == {
        "sensor.noise": {"name": "sensor.noise", "value": 0.01, "type": "float64"},
        "sensor.mode": {"name": "sensor.mode", "value": "fast"},
        "sensor.samples": {"name": "sensor.samples", "value": 3},
        "sensor.enabled": {"name": "sensor.enabled", "value": True}}
    assert two == {"sensor.mode": {"name": "sensor.mode", "value": "fast"}}
    (level, text), = client.levels
    assert level == 1 and "'sensor.nope'" in text and "has no parameter 'nope'" in text
    assert "['enabled', 'mode', 'noise', 'samples']" in text  # what it has
    client.ws.close()


def test_a_set_is_applied_answered_with_its_value_and_sent_to_subscribers(
        settable: Any) -> None:
    run, server, sensor = settable
    watcher = ParamClient(server.port)
    watcher.send({"op": "subscribeParameterUpdates", "parameterNames": ["sensor.noise"]})
    first = watcher.update(lambda v: True)  # the value now, at the first look
    setter = ParamClient(server.port)

    setter.send({"op": "setParameters", "id": "s1", "parameters": [
        {"name": "sensor.noise", "value": 1, "type": "float64"},  # an int: made a float
        {"name": "sensor.mode", "value": "slow"}]})
    answer = setter.answer("s1")
    assert sensor.applied.wait(10)
    _until(lambda: len(sensor.changes) == 2, "both sets applied")
    later = watcher.update(lambda v: v.get("sensor.noise") == 1.0)

    assert first == {"sensor.noise": 0.01}
    assert answer == {"sensor.noise": {"name": "sensor.noise", "value": 1.0, "type": "float64"},
                      "sensor.mode": {"name": "sensor.mode", "value": "slow"}}
    assert sorted(sensor.changes) == [("mode", "fast", "slow"), ("noise", 0.01, 1.0)]
    assert later == {"sensor.noise": 1.0}  # only what it subscribed
    assert run.params()["sensor.noise"] == 1.0 and run.params()["sensor.mode"] == "slow"
    assert setter.levels == [] and (server.stats().params_set,
                                    server.stats().params_refused) == (2, 0)
    watcher.ws.close()
    setter.ws.close()


@pytest.mark.parametrize("item, rule", [
    ({"name": "sensor.noise", "value": 1.5}, "1.5 is above the range's high bound 1.0"),
    ({"name": "sensor.noise", "value": "0.5"}, "'0.5' is not a float"),
    ({"name": "sensor.mode", "value": "medium"}, "is not one of the choices ['fast', 'slow']"),
    ({"name": "sensor.samples", "value": 5}, "is read-only"),
    ({"name": "sensor.enabled", "value": 1}, "is not a bool"),
    ({"name": "sensor.enabled", "value": [True]}, "the value is a JSON list"),
    ({"name": "sensor.mode"}, "cannot be unset"),
    ({"name": "sensor.mode", "value": None}, "cannot be unset"),
    ({"name": "sensor.samples", "value": 4, "type": "float64"}, "this parameter is int"),
    ({"name": "sensor.mode", "value": "QQ==", "type": "byte_array"}, "'byte_array' is none"),
    ({"name": "sensor.noize", "value": 0.5}, "has no parameter 'noize'"),
])
def test_a_refused_set_is_an_error_status_naming_the_parameter_and_its_rule(
        settable: Any, item: dict[str, Any], rule: str) -> None:
    run, server, sensor = settable
    before = run.params()
    client = ParamClient(server.port)

    client.send({"op": "setParameters", "id": "bad", "parameters": [item]})
    answer = client.answer("bad")

    (level, text), = client.levels
    assert level == 2 and f"'{item['name']}'" in text and rule in text, text
    assert text.startswith("setParameters refused, nothing changed for these: ")
    # the answer says what the run holds: the value now (none for no such parameter)
    assert answer == ({} if item["name"] == "sensor.noize" else
                      {item["name"]: {**answer[item["name"]], "value": before[item["name"]]}})
    assert run.params() == before and sensor.changes == []
    assert (server.stats().params_set, server.stats().params_refused) == (0, 1)
    client.ws.close()


def test_setting_is_off_unless_allowed_and_reading_is_not(watched: Any) -> None:
    run, server, sensor = watched
    client = ParamClient(server.port)

    client.send({"op": "setParameters", "id": "s", "parameters": [
        {"name": "sensor.noise", "value": 0.5}, {"name": "sensor.mode", "value": "slow"}]})
    answer = client.answer("s")

    (level, text), = client.levels
    assert level == 2 and "setting parameters is off" in text and "--foxglove-params" in text
    assert "'sensor.noise'" in text and "'sensor.mode'" in text
    assert {n: p["value"] for n, p in answer.items()} == {"sensor.noise": 0.01,
                                                          "sensor.mode": "fast"}
    assert run.params()["sensor.noise"] == 0.01 and sensor.changes == []
    assert server.stats().params_refused == 2
    client.ws.close()


def test_an_unsubscribed_parameter_is_no_longer_sent(settable: Any) -> None:
    run, server, sensor = settable
    client = ParamClient(server.port)
    client.send({"op": "subscribeParameterUpdates", "parameterNames": ["sensor.noise"]})
    client.update(lambda v: v == {"sensor.noise": 0.01})

    client.send({"op": "unsubscribeParameterUpdates", "parameterNames": ["sensor.noise"]})
    client.send({"op": "getParameters", "parameterNames": [], "id": "sync"})
    client.answer("sync")  # the unsubscribe is handled: the requests are taken in order
    run.set_param("sensor.noise", 0.3)
    assert sensor.applied.wait(10)
    # A later look sends the new subscription's first value; had noise still been
    # subscribed, its change would be in that same message.
    client.send({"op": "subscribeParameterUpdates", "parameterNames": ["sensor.mode"]})
    update = client.update(lambda v: "sensor.mode" in v)

    assert update == {"sensor.mode": "fast"}
    assert [m for m in client.values if "id" not in m and any(
        p["name"] == "sensor.noise" and p["value"] == 0.3 for p in m["parameters"])] == []
    client.ws.close()


def test_a_request_naming_too_many_parameters_is_refused(settable: Any) -> None:
    run, server, _ = settable
    client = ParamClient(server.port)

    client.send({"op": "getParameters", "id": "many",
                 "parameterNames": [f"p{i}" for i in range(paramview.MAX_NAMES + 1)]})
    client.send({"op": "setParameters", "id": "many", "parameters": [
        {"name": "sensor.noise", "value": 0.5}] * (paramview.MAX_NAMES + 1)})
    client.recv_until(lambda: len(client.levels) == 2, "two refusals")

    assert all(level == 2 and f"at most {paramview.MAX_NAMES}" in text
               for level, text in client.levels)
    assert client.values == [] and run.params()["sensor.noise"] == 0.01
    client.ws.close()


def test_an_answer_of_many_parameters_comes_in_messages_of_max_per_message(
        settable: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    run, server, _ = settable
    monkeypatch.setattr(paramview, "MAX_PER_MESSAGE", 3)
    client = ParamClient(server.port)

    client.send({"op": "getParameters", "parameterNames": [], "id": "all"})
    client.recv_until(lambda: len(client.values) == 2, "two messages")

    assert [len(m["parameters"]) for m in client.values] == [3, 1]
    assert {m["id"] for m in client.values} == {"all"}
    client.ws.close()


# -- a placed run, served from its host ----------------------------------------------------


def test_a_placed_runs_parameters_are_read_and_set_in_their_group() -> None:
    from tests.test_placed import placed_run

    run = placed_run({"sensor": "a"}, None, factory=make_net)
    try:
        server = mujou.serve_foxglove(run, 0, allow_params=True)
        with server:
            client = ParamClient(server.port)
            client.send({"op": "getParameters", "parameterNames": ["sensor.noise"],
                         "id": "g"})
            got = client.answer("g")
            client.send({"op": "subscribeParameterUpdates", "parameterNames": []})
            client.send({"op": "setParameters", "id": "s", "parameters": [
                {"name": "sensor.noise", "value": 0.25},
                {"name": "sensor.samples", "value": 9}]})
            answer = client.answer("s")
            update = client.update(lambda v: v.get("sensor.noise") == 0.25)
            client.ws.close()
            params = run.params()
    finally:
        run.stop()
        run.join(timeout=20)

    assert run.groups["a"] == ["sensor"]
    assert got == {"sensor.noise": {"name": "sensor.noise", "value": 0.01, "type": "float64"}}
    assert {n: p["value"] for n, p in answer.items()} == {"sensor.noise": 0.25,
                                                          "sensor.samples": 3}
    (level, text), = client.levels
    assert level == 2 and "'sensor.samples'" in text and "read-only" in text
    assert update["sensor.noise"] == 0.25 and params["sensor.noise"] == 0.25
