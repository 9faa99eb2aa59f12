"""The private kernel of mujou_actors: what runs a net, below the public API.

Nothing here is public: its names and modules may change in any version.
``mujou_actors.run`` builds on it and drives it; nothing in it imports
``mujou_actors.run`` back. The public modules above it (node, ports, net,
supervisor, run, ...) say *what* a net is and what a run promises; the
modules here carry it out, each importing only those listed before it:

* `compiled`: which modules a compiled build compiles, and the guard that loads
  them from their sources when the build is stale (run here, before any of them);
* `keys`: the ``(t_ns, delta)`` keys of the schedule and the stamps of deliveries;
* `workers`: how many worker threads, and their timer slack;
* `mailbox`: a node's mailbox (plain data) and the control envelopes;
* `actor`: the runtime record of one node, and the one place that calls user code
  (hooks, ``state_dict``, ``load_state_dict``), always inside the node's context;
* `protocols`: `KernelListener`, what the dispatcher tells whoever drives it;
* `calendar`: the ready queue, and its rule of which entries are live;
* `policy`: simulated and real time as objects whose decisions the dispatcher acts on;
* `sends`: the ``send`` installed on each Output;
* `dispatcher`: the lock, the threads' loops, claiming and finishing hooks, the phases;
* `cuts`: a kernel's state at a consistent cut, taken and loaded;
* `kernel`: a dispatcher for some of a net's nodes that a driver steps one delta
  cycle at a time (deliveries in, sends out): what a group process runs.
"""

from pathlib import Path

from . import compiled

__all__ = ["BUILD"]

# Before any compiled module can be imported: an edited source never loses to
# the extension module built from its old text (see compiled.py).
BUILD = compiled.install(__name__, Path(__file__).parent)
"""Which build of the kernel runs in this process (`compiled.Build`): ``str(BUILD)``
reads e.g. ``compiled (mypyc 2.4.1: keys, mailbox, actor)`` or ``python (not compiled)``."""
