"""Resident memory of this process: now, and the peak since the last reset.

On Linux the high-water mark is reset (``/proc/self/clear_refs``) and read from ``VmHWM``;
elsewhere it is ``ru_maxrss``, the peak since the process started.
"""

from __future__ import annotations

import re
import sys
from typing import Optional


def _status_mb(field_name: str) -> Optional[float]:
    """A field of /proc/self/status in MB (Linux), else None."""
    try:
        with open("/proc/self/status") as f:
            match = re.search(rf"^{field_name}:\s+(\d+) kB", f.read(), re.M)
    except OSError:
        return None
    return int(match.group(1)) / 1024 if match else None


def _max_rss_mb() -> float:
    try:
        import resource
    except ImportError:  # Windows
        return 0.0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024  # bytes on macOS, kB elsewhere


def reset_peak_rss() -> bool:
    """Reset the process's peak-RSS mark (Linux); False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_mb() -> float:
    return _status_mb("VmHWM") or _max_rss_mb()


def rss_mb() -> float:
    """Resident memory now (Linux); elsewhere the peak so far, which grows as models load."""
    return _status_mb("VmRSS") or _max_rss_mb()


def memory_method() -> str:
    if reset_peak_rss() and _status_mb("VmHWM") is not None:
        return "peak RSS of the process during the runs (VmHWM, reset before each run)"
    if _max_rss_mb():
        return "peak RSS of the process since it started (ru_maxrss)"
    return "not measured on this platform"
