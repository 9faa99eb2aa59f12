"""Recordings and views of a run: MCAP recording and replay, crash capsules, the Foxglove views.

The part of the package that writes what a run did and reads it back
(docs/architecture.md, "Modules"): `recorder` (``mujou.run(record=...)``),
`replay` (``mujou.run(replay=...)``), `capsule` (``record_on_failure``),
`mcapfile` (the files: the mujou profile of MCAP, its writer and bounded
readers), `view` (messages as JSON for Foxglove), `liveview` (a running
net served to Foxglove), `recview` and `playback` (a recording's views and its
playback, with no node run) and `checks` (``mujou.testing``'s comparisons of a
rerun with a recording or a crash capsule).

Nothing here is imported when the package is: each module is imported by the
run, the CLI or a test when it is used. The public names are the package's own
(``mujou.Recording``, ``mujou.Capsule``, ``mujou.serve_foxglove``...).
"""
