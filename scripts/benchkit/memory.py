"""A process's own peak memory."""

from __future__ import annotations

import resource


def peak_rss_mb() -> float:
    """This process's peak RSS (VmHWM), in MB. Not ``ru_maxrss`` where /proc has it: Linux carries
    that over from the forking parent across exec, so a child of a large parent would report the
    parent's size."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
