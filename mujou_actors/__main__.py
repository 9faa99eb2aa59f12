"""``python -m mujou_actors``: the same as the ``mujou`` command."""

from mujou_actors.cli import main

main(prog_name="mujou")
