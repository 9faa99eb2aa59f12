"""A worker count is refused alike wherever it is taken (issue 28: the same bug elsewhere).

``mujou.run(workers=)`` (one process or placed), ``Kernel(workers=)`` and a
placed group's server all ask `_checks.check_workers`: a value that is not an
int (a float, a bool, a str) is a TypeError, an int below 1 a ValueError, and
each message names ``workers`` and what was expected.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

import mujou_actors as mujou
from mujou_actors._runtime.kernel import Kernel
from mujou_actors.distributed.group import GroupServer
from tests.placed_support import make_net

pytestmark = pytest.mark.timeout(60)

EXPECTED = "workers must be an int >= 1 (worker threads)"

BAD = [(1.5, TypeError), (2.0, TypeError), (True, TypeError), (False, TypeError),
       ("2", TypeError), (0, ValueError), (-3, ValueError)]


def _group(workers: Any) -> None:
    GroupServer(group="g", factory="tests.placed_support:make_net", net_kwargs=b"",
                nodes=["sim"], seed=None, workers=workers, address="ipc:///nonexistent",
                host_pid=0)


# What takes a worker count, and how its message starts.
TAKERS = {
    "mujou.run": ("mujou.run", lambda w: mujou.run(make_net(), timer="simulated",
                                                   duration=0.01, workers=w)),
    "placed mujou.run": ("mujou.run", lambda w: mujou.run(make_net, timer="simulated",
                                                          duration=0.01,
                                                          placement={"sim": "a"}, workers=w)),
    "Kernel": ("Kernel", lambda w: Kernel(make_net(), workers=w)),
    "group server": ("placed group 'g'", _group),
}


@pytest.mark.parametrize(("value", "error"), BAD, ids=repr)
@pytest.mark.parametrize("taker", list(TAKERS))
def test_a_bad_worker_count_is_refused_alike_naming_workers_and_what_was_expected(
        taker: str, value: Any, error: type[Exception]) -> None:
    prefix, start = TAKERS[taker]

    with pytest.raises(error) as caught:
        start(value)

    assert type(caught.value) is error
    text = str(caught.value)
    assert text.startswith(f"{prefix}: {EXPECTED}"), text
    assert f"got {value!r}" in text


def test_none_is_mujou_runs_choice_and_nowhere_else() -> None:
    run = mujou.run(make_net(), timer="simulated", duration=0.01, workers=None)
    run.join()

    with pytest.raises(TypeError, match=re.escape(f"Kernel: {EXPECTED}, got None")):
        Kernel(make_net(), workers=None)  # type: ignore[arg-type]


def test_a_group_server_refuses_a_timer_it_does_not_serve() -> None:
    from mujou_actors.distributed.grouprt import RealTimeGroupServer

    kwargs = dict(group="g", factory="tests.placed_support:make_net", net_kwargs=b"",
                  nodes=["sim"], seed=None, workers=1, address="ipc:///nonexistent",
                  host_pid=0)
    with pytest.raises(ValueError, match=r"placed group 'g': GroupServer serves the "
                                         r"'simulated' timer, not 'realtime'"):
        GroupServer(timer="realtime", **kwargs)
    with pytest.raises(ValueError, match=r"RealTimeGroupServer serves the 'realtime' timer, "
                                         r"not 'simulated'"):
        RealTimeGroupServer(timer="simulated", **kwargs)
