"""One OpenBLAS code path for golden files (shared by test_pendulum_golden.py and
replay_pendulum.py --golden).

numpy's bundled OpenBLAS chooses its kernels by the processor when it is loaded
(``DYNAMIC_ARCH``): on a processor with AVX-512 it takes the SkylakeX kernels,
which round a small matrix product differently in the last bit from the AVX2
(Haswell) kernels. ``OPENBLAS_CORETYPE`` names the kernels to take instead
(OpenBLAS's own setting, read once as the library loads).
"""

from __future__ import annotations

import os
import sys


def _has_avx2_fma() -> bool:
    """Whether this processor runs the Haswell kernels (Linux: /proc/cpuinfo's flags)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return {"avx2", "fma"} <= flags
    except OSError:
        pass
    return False


def pin_openblas() -> bool:
    """Set ``OPENBLAS_CORETYPE=Haswell`` (unless set already) before numpy is imported.

    Returns:
        bool: whether OpenBLAS will use the setting: numpy not imported yet, and
        this processor has AVX2 and FMA (elsewhere the Haswell kernels cannot run:
        nothing is set).
    """
    if "numpy" in sys.modules or not _has_avx2_fma():
        return "OPENBLAS_CORETYPE" in os.environ and "numpy" not in sys.modules
    os.environ.setdefault("OPENBLAS_CORETYPE", "Haswell")
    return True
