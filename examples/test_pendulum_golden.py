"""A golden-file regression test of the inverted pendulum, as a user writes one.

``golden/pendulum.mcap`` is a recording of the pendulum (1 s, simulated timer,
seed 0), made once with::

    python examples/replay_pendulum.py --duration 1 --golden examples/golden/pendulum.mcap

and kept with the tests. Each test reruns the net and compares every message
of every recorded Output with the file, bit for bit; a change to the physics,
the sensor or the controller fails with the first message that differs. When
a change is meant to change the results, record the file again.

Run it with pytest::

    pytest examples/test_pendulum_golden.py
"""

from __future__ import annotations

import os
import sys

# MKL and torch pick their CPU kernels by the processor (AVX-512, AVX2, another
# vendor's generic path), and they round differently: a golden file recorded on one
# machine would differ in the last bit on another. COMPATIBLE is MKL's one code path
# for every x86 processor (Intel's "conditional numerical reproducibility"), and
# "default" torch's kernels without explicit vector instructions; both must be set
# before the first tensor operation of the process, so set them here, at the top of
# the test module, and record the golden file with them too.
os.environ.setdefault("MKL_CBWR", "COMPATIBLE")
os.environ.setdefault("ATEN_CPU_CAPABILITY", "default")
# numpy's OpenBLAS (it computes the controller's gain) also picks its kernels by the
# processor: its AVX-512 ones (SkylakeX, on an AMD EPYC with AVX-512 too) round the gain
# otherwise than the AVX2 ones (Haswell) the file was recorded with. Haswell's run on
# every x86 processor with AVX2 and FMA; set before numpy is first imported.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _numerics import pin_openblas  # noqa: E402

pin_openblas()

from mujou_actors.testing import assert_replay_matches  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
import inverted_pendulum as ip  # noqa: E402

GOLDEN = os.path.join(HERE, "golden", "pendulum.mcap")


def test_the_pendulum_runs_as_recorded() -> None:
    assert_replay_matches(GOLDEN, ip.make_net(seed=0))


def test_the_sensor_and_controller_on_the_recorded_physics_for_any_worker_count() -> None:
    for workers in (1, 2):
        assert_replay_matches(GOLDEN, ip.make_net(seed=0), replace=["physics"], workers=workers)
