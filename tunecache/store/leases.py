"""Who holds a benchmark lease, and whether that process still lives.

A lease row names its holder's host and pid (see :meth:`tunecache.store.store.Store.try_lease`). A holder
that died (kill -9, OOM) leaves its row behind; the lease is taken over at once only when the pid
provably means the same process space here, else when the row expires. What "the same process space"
is (hostname plus PID namespace) and how a pid is judged alive is this module's, so that the store's
SQL stays free of /proc.
"""

from __future__ import annotations

import os

from tunecache.problem.target import hostname


def process_namespace() -> str:
    """This process's PID namespace, as ``<pid-ns inode>.<boot id>``; "" where the OS has none.

    Containers with host networking share the hostname but not the PID space: a pid that does not
    exist here may be a live process next door. The inode names the namespace; the boot id keeps
    two machines (or two boots) apart, since the initial namespace has the same inode everywhere.
    """
    try:
        ino = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return ""  # no PID namespaces here (e.g. macOS): the hostname identifies the pid space
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip().replace("-", "")[:16]
    except OSError:
        boot = ""
    return f"{ino}.{boot}" if boot else str(ino)


def lease_host() -> str:
    """What a lease row records as its holder's host: the hostname and the PID namespace.

    A lease whose holder pid is gone is taken over at once only when its row names this exact
    string; otherwise (another container, another machine, a row of an older tunecache that wrote
    the bare hostname) it is taken over when it expires.
    """
    ns = process_namespace()
    suffix = f"#pidns={ns}" if ns else ""
    return hostname()[: 255 - len(suffix)] + suffix  # leases.host is String(255)


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` names a live process of this PID namespace (a zombie counts as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (killed, not yet reaped by its parent) is dead for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][:1] != "Z"
    except (OSError, IndexError):
        return True
