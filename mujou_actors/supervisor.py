"""Seeds of the run (the supervisor's snapshots and restarts build on this module).

Per-node seeds are derived from the run's seed and the node's path with
BLAKE2b, so they are the same in every process and on every Python version
(unlike ``hash()``, which is salted per process).
"""

from __future__ import annotations

import hashlib

__all__ = ["derive_seed"]


def derive_seed(run_seed: int, path: str) -> int:
    """The seed of the node at ``path`` in a run seeded with ``run_seed``.

    Args:
        run_seed (int): ``mujou.run(seed=...)``.
        path (str): the node's dotted path (``""`` for the root).

    Returns:
        int: a seed in ``[0, 2**63)``; different paths give unrelated seeds.
    """
    digest = hashlib.blake2b(
        f"{run_seed}\x00{path}".encode(), digest_size=8, person=b"mujou-seed"
    ).digest()
    return int.from_bytes(digest, "little") >> 1
