"""Record the inverted pendulum, replay it, and find where a changed controller diverges.

The main job (``inverted_pendulum.py``: MuJoCo physics at 500 Hz, a noisy
sensor, an LQR controller at 100 Hz, a recorder) in three steps, on the
simulated timer:

1. **record** it to an MCAP file (``mujou.run(record=...)``): every message of
   every Output, with the time and delta cycle it was sent at;
2. **replay** it with the physics replaced by its recording: MuJoCo does not
   run, the recorded states are sent at their recorded keys, and the sensor,
   the controller and the recorder compute exactly what they computed (the
   same fingerprint, bit for bit, whatever ``--workers``);
3. **change the controller** (its gain scaled by ``--gain-scale``) and check
   it against the recording with ``mujou.testing.assert_replay_matches``:
   the physics replayed, the new controller's commands on the recorded
   trajectory differ, and the assertion names the first divergence (port,
   time, index, the two values). The physics keeps its recorded trajectory
   (an open loop): this asks what the new controller would have commanded.

Run it from the repository root::

    python examples/replay_pendulum.py                  # 10 s, gain x 1.1
    python examples/replay_pendulum.py --duration 2 --gain-scale 0.9 --keep run.mcap

``--golden PATH`` only records (a golden file for ``test_pendulum_golden.py``,
the regression test as users write it) and exits. It records with
``MKL_CBWR=COMPATIBLE`` and ``ATEN_CPU_CAPABILITY=default`` (set them in the
shell too: torch may read the second as it is imported), as that test reruns,
so that the file compares bit for bit on any x86 machine.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

from _numerics import pin_openblas

if "--golden" in sys.argv:  # before numpy is first imported (torch imports it)
    pin_openblas()

import torch  # noqa: E402

import mujou_actors as mujou  # noqa: E402
from mujou_actors.recording import mcapfile  # noqa: E402
from mujou_actors.testing import assert_replay_matches  # noqa: E402

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
import inverted_pendulum as ip  # noqa: E402

SEED = 0


def record(path: str, duration: float, workers: int | None) -> str:
    """Step 1: run the pendulum, every Output recorded to ``path``; its fingerprint."""
    net = ip.make_net(seed=SEED)
    run = mujou.run(net, timer="simulated", duration=duration, seed=SEED, workers=workers,
                    record=path)
    run.join()
    rec = run.stats().recording
    assert rec is not None
    print(f"recorded     {duration:g} s to {path}: {rec.recorded} messages, "
          f"{rec.bytes:,} bytes, {rec.dropped} dropped")
    return ip.fingerprint(net.recorder.trajectory())


def replay(path: str, duration: float, workers: int | None) -> str:
    """Step 2: the same net with its physics replayed from ``path``; its fingerprint."""
    net = ip.make_net(seed=SEED)
    started = time.perf_counter()
    run = mujou.run(net, timer="simulated", duration=duration, workers=workers,
                    replay=mujou.Replay(path, replace=["physics"]))
    run.join()
    wall = time.perf_counter() - started
    print(f"replayed     physics from the file: {duration / wall:.1f}x real time, "
          f"{run.stats().nodes['physics'].updates} wakeups of its stand-in")
    return ip.fingerprint(net.recorder.trajectory())


def changed_controller(path: str, scale: float, workers: int | None) -> str | None:
    """Step 3: the controller's gain scaled; the first divergence, or None if none."""
    net = ip.make_net(seed=SEED)
    net.controller.gain = net.controller.gain * scale
    try:
        assert_replay_matches(path, net, replace=["physics"], workers=workers)
    except AssertionError as exc:
        recorded = torch.cat([r.message for r in mcapfile.read(path)
                              if r.topic == "controller.command"])
        now = net.recorder.trajectory()["u"]
        print(f"gain x {scale:g}   the new commands differ from the recorded ones by up to "
              f"{float((now - recorded).abs().max()):.4f} (command units)")
        return str(exc)
    return None


def main(argv: list[str] | None = None) -> int:
    """Record, replay, compare; 0 when the replay is identical and the change is found."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=10.0,
                        help="seconds of the run's timer (default: 10)")
    parser.add_argument("--gain-scale", type=float, default=1.1,
                        help="the changed controller's gain, times the LQR's (default: 1.1)")
    parser.add_argument("--workers", type=int, default=None,
                        help="worker threads (default: mujou's choice)")
    parser.add_argument("--keep", metavar="PATH", help="write the recording here (kept)")
    parser.add_argument("--golden", metavar="PATH",
                        help="only record a golden file to PATH (for test_pendulum_golden.py)")
    args = parser.parse_args(argv)

    if args.golden:
        # Before the net's first tensor operation, as test_pendulum_golden.py does.
        os.environ.setdefault("MKL_CBWR", "COMPATIBLE")
        os.environ.setdefault("ATEN_CPU_CAPABILITY", "default")
        if os.environ.get("OPENBLAS_CORETYPE") != "Haswell":
            print("OPENBLAS_CORETYPE=Haswell is not set (this processor has no AVX2): the "
                  "golden file may not compare on other machines", file=sys.stderr)
        record(args.golden, args.duration, args.workers)
        return 0
    with tempfile.TemporaryDirectory() as folder:
        path = args.keep or os.path.join(folder, "pendulum.mcap")
        recorded = record(path, args.duration, args.workers)
        replayed = replay(path, args.duration, args.workers)
        same = replayed == recorded
        print(f"fingerprints {recorded} recorded, {replayed} replayed: "
              f"{'identical' if same else 'DIFFERENT'}")
        divergence = changed_controller(path, args.gain_scale, args.workers)
        if divergence is None:
            print(f"gain x {args.gain_scale:g}   no divergence: the rerun matches the recording")
        else:
            print(divergence.replace("\n", "\n  | ").join(["  | ", ""]))
    return 0 if same and (divergence is not None) == (args.gain_scale != 1.0) else 1


if __name__ == "__main__":
    sys.exit(main())
