"""A warm start for the tests' child Python processes: forked from one that already imported torch.

Most of the suite's CPU went into child processes importing torch and Triton again (1.6 s of CPU
each, 4 s of wall on a busy 2-core machine), for tests whose point is a *restart* (a process with
no tunecache state), not the interpreter's own start-up. Here a server per pytest process (one per
xdist worker) imports torch and other third-party libraries once, never tunecache nor Triton; each
child is forked from it and runs its program exactly as ``python ARGV`` would, in the caller's
environment, working directory and stdio. What a child gets from the server and a fresh ``exec``
would not: those libraries already imported, Python's hash seed (every child shares one).

``Popen``-compatible: :func:`popen` starts ``python -S tests/warmpool.py launch SOCK PID ARGV...`` (a
20 ms interpreter with no site, no torch) that hands its stdin/stdout/stderr, environment, working
directory and argv to the server, forwards the signals it gets to the child, and exits with the
child's status, so ``subprocess.run``'s capture, timeouts and return codes work unchanged. When the
launcher dies (``kill()``, a timeout), the child is killed. A program the server could change
runs as a fresh ``exec`` instead (:func:`warm_enough`), and ``TUNECACHE_TEST_FRESH=1`` makes every
child fresh (to check that the pool hides nothing), or, in the child's env, that child.
``popen(..., inductor=True)`` forks from a second server that also imported torch._dynamo and
Inductor's remote caches (:data:`INDUCTOR_PRELOAD`), for the torch.compile tests' hosts. See
docs/testing.md.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# Imported by the server, once: what the children import anyway, and keep no state of tunecache's.
# Not Triton: what triton.language builds at import depends on TRITON_INTERPRET, which a child
# program may change before its own import (binaries_roundtrip.py compiles for sm90 for real).
PRELOAD = ("torch", "numpy", "sqlalchemy", "click", "orjson", "filelock")
# Variables read when those libraries are imported or Python starts: a child with another value
# for one of them (or with tunecache's start-up hook asked for) starts fresh.
_AT_START = ("PYTHON", "TORCH", "OMP_", "MKL_", "LD_")
_SAME_ANYWHERE = ("PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "PYTHONIOENCODING")
# What tunecache-install.pth reads at start: ``os.environ.get(NAME) or ...`` (so does
# _tunecache_startup, and tunecache.settings later), so "" starts exactly as unset does (no hook
# imported): a child given "" is as warm as one without it. Any other value, "0" included (the .pth
# line then imports the hook), starts fresh.
_HOOK = ("TUNECACHE_INSTALL", "TUNECACHE_INDUCTOR")
# The torch.compile tests' host programs (tests/inductor_lease_prog.py, inductor_put_prog.py) import
# these first thing: 1.3 s of CPU more than torch alone, in every host. Importing them reads more than
# torch does: Triton (TRITON_INTERPRET...), Inductor's config (TORCHINDUCTOR_*), and dynamo's package
# cache takes its directory from TORCHINDUCTOR_CACHE_DIR there (torch 2.13: ``DynamoCache``). So a
# child of this server is warm only with the server's whole environment but what is read at run time
# (:func:`_import_env`), and gets the server's TORCHINDUCTOR_CACHE_DIR, a directory of this process
# (:func:`inductor_cache_dir`), fresh or warm: a host that never compiles writes nothing there. Its
# working directory is the server's too (torch._dynamo.config's debug_dir_root is the cwd at import).
INDUCTOR_PRELOAD = (*PRELOAD, "torch._dynamo", "torch._inductor.remote_cache")
# Read only by tunecache (imported by the child itself), or set by pytest per test.
_RUN_TIME = ("TUNECACHE_", "PYTEST_CURRENT_TEST")
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def _start_env(env: dict[str, str]) -> dict[str, str]:
    return {
        k: v
        for k, v in env.items()
        if (k.startswith(_AT_START) and k not in _SAME_ANYWHERE) or (k in _HOOK and v != "")
    }


def warm_enough(argv: list[str], env: dict[str, str], server_env: dict[str, str] | None = None) -> bool:
    """Whether ``python ARGV`` in ``env`` behaves the same forked from the server: a script, ``-c`` or
    ``-m`` (no interpreter flags), no ``sitecustomize`` of its own (``site`` runs at start-up, never in
    a fork), and the values the server started with (``server_env``; this process's environment for
    a server not started yet) for what is read at start-up."""
    if "1" in (os.environ.get("TUNECACHE_TEST_FRESH"), env.get("TUNECACHE_TEST_FRESH")) or not argv:
        return False
    if argv[0].startswith("-") and argv[0] not in ("-c", "-m"):
        return False
    if _site_hooks(env):
        return False
    return _start_env(env) == _start_env(dict(os.environ) if server_env is None else server_env)


def _import_env(env: dict[str, str]) -> dict[str, str]:
    """What of ``env`` a child of the Inductor server must share with it: all but what is read at run
    time (``PYTHONPATH`` is the child's own, as in any warm child)."""
    return {
        k: v for k, v in env.items() if k not in _SAME_ANYWHERE and (not k.startswith(_RUN_TIME) or k.startswith(_HOOK))
    }


def _site_hooks(env: dict[str, str]) -> bool:
    """Whether ``env``'s PYTHONPATH holds a module that ``site`` imports at start-up (a fork never does)."""
    dirs = filter(None, env.get("PYTHONPATH", "").split(os.pathsep))
    return any(os.path.exists(os.path.join(d, f"{m}.py")) for d in dirs for m in ("sitecustomize", "usercustomize"))


_inductor_dir: str | None = None


def inductor_cache_dir() -> str:
    """The TORCHINDUCTOR_CACHE_DIR of the Inductor server and its children: this process's, removed at its end."""
    global _inductor_dir
    if _inductor_dir is None:
        import atexit
        import shutil
        import tempfile

        _inductor_dir = tempfile.mkdtemp(prefix="tc-warm-inductor-")
        atexit.register(shutil.rmtree, _inductor_dir, ignore_errors=True)
    return _inductor_dir


class _Server:
    """This process's server (or its Inductor server): started at first use, ended with this process."""

    def __init__(self, inductor: bool = False) -> None:
        import subprocess
        import tempfile

        self.dir = tempfile.mkdtemp(prefix="tc-warm-")
        self.path = os.path.join(self.dir, "s")
        self.env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": inductor_cache_dir()} if inductor else dict(os.environ)
        self.cwd = os.getcwd()
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "serve", self.path, str(os.getpid()), *(["inductor"] if inductor else [])],
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=open(os.path.join(self.dir, "log"), "w"),  # noqa: SIM115
        )
        import atexit

        atexit.register(self.stop)

    def stop(self) -> None:
        import shutil

        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


_servers: dict[bool, _Server] = {}  # by ``inductor``


def popen(argv: list[str], env: dict[str, str], *, inductor: bool = False, **kw):  # noqa: ANN003, ANN201
    """``subprocess.Popen([python, *argv], env=env, **kw)``, forked from the warm server when
    :func:`warm_enough`, else a fresh interpreter. With ``inductor``, from the server that imported
    :data:`INDUCTOR_PRELOAD` too, and TORCHINDUCTOR_CACHE_DIR is :func:`inductor_cache_dir`."""
    import subprocess

    server = _servers.get(inductor)
    if server is not None and server.proc.poll() is not None:
        server = None
    warm = warm_enough(argv, env, server.env if server is not None else None)
    if inductor:
        env = {**env, "TORCHINDUCTOR_CACHE_DIR": inductor_cache_dir()}
        base = server.env if server is not None else {**os.environ, "TORCHINDUCTOR_CACHE_DIR": inductor_cache_dir()}
        hooked = any(k.startswith(_HOOK) for k in env) or _site_hooks(env)  # run at start-up, never in a fork
        cwd = os.path.abspath(kw.get("cwd") or os.getcwd())  # dynamo's debug_dir_root is the cwd at import
        same_cwd = cwd == (server.cwd if server is not None else os.getcwd())
        warm = warm and not hooked and same_cwd and _import_env(env) == _import_env(base)
    if not warm:
        return subprocess.Popen([sys.executable, *argv], env=env, **kw)
    if server is None:
        server = _servers[inductor] = _Server(inductor)
    launcher = [sys.executable, "-S", __file__, "launch", server.path, str(server.proc.pid)]
    return subprocess.Popen([*launcher, *argv], env=env, **kw)


# ---- the launcher (python -S warmpool.py launch SOCK PID ARGV...) -----------------------------


def _readline(s: socket.socket) -> str:
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = s.recv(1)
        if not chunk:
            raise EOFError
        buf += chunk
    return buf.decode()


def launch(path: str, server: int, argv: list[str]) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    while True:  # the server imports torch first: minutes on a busy machine
        try:
            s.connect(path)
            break
        except (FileNotFoundError, ConnectionRefusedError):
            try:
                os.kill(server, 0)
            except ProcessLookupError:
                sys.exit(f"warmpool: the server ({server}) ended before it listened at {path}")
            select.select([], [], [], 0.05)
    msg = json.dumps({"argv": argv, "env": dict(os.environ), "cwd": os.getcwd()}).encode()
    socket.send_fds(s, [len(msg).to_bytes(8, "big") + msg], [0, 1, 2])
    int(_readline(s))  # the child's pid: it runs
    for sig in _FORWARDED:
        signal.signal(sig, lambda n, _f: s.sendall(f"{n}\n".encode()))
    while True:
        try:
            status = int(_readline(s))
            break
        except InterruptedError:
            continue
        except EOFError:
            sys.exit("warmpool: the server ended before the child")
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(os.waitstatus_to_exitcode(status))


# ---- the server (python warmpool.py serve SOCK PARENT_PID) --------------------------------------


def serve(path: str, parent: int, inductor: bool = False) -> None:
    import importlib

    for name in INDUCTOR_PRELOAD if inductor else PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    import gc

    gc.freeze()  # the children's collections never touch (and so never copy) these objects
    base_env = dict(os.environ)
    base_path = list(sys.path[1:])  # without this file's directory
    for p in filter(None, base_env.get("PYTHONPATH", "").split(os.pathsep)):
        if p in base_path:
            base_path.remove(p)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # supervisors are reaped by the kernel
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path + ".tmp")
    os.rename(path + ".tmp", path)  # launchers connect only once it listens
    srv.listen(64)
    while True:
        if not select.select([srv], [], [], 1.0)[0]:
            if os.getppid() != parent:
                os._exit(0)  # the pytest process is gone
            continue
        conn, _ = srv.accept()
        data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
        size = int.from_bytes(data[:8], "big")
        data = data[8:]
        while len(data) < size:
            data += conn.recv(size - len(data))
        if os.fork() == 0:
            srv.close()
            _supervise(conn, json.loads(data), fds, base_path)  # returns only in the child program
            return
        conn.close()
        for fd in fds:
            os.close(fd)


def _supervise(conn: socket.socket, msg: dict, fds: list[int], base_path: list[str]) -> None:
    """In a fork of the server: fork the child, tell the launcher its pid, forward its signals, kill
    the child if the launcher dies, and send its wait status."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    pid = os.fork()
    if pid == 0:
        conn.close()
        _become(msg, fds, base_path)
        return
    for fd in fds:
        os.close(fd)
    pidfd = os.pidfd_open(pid)
    try:
        conn.sendall(f"{pid}\n".encode())
        buf = b""
        while True:
            ready = select.select([conn, pidfd], [], [])[0]
            if pidfd in ready:
                break
            chunk = conn.recv(64)
            if not chunk:  # the launcher died: so does its child
                os.kill(pid, signal.SIGKILL)
                break
            buf += chunk
            *sigs, buf = buf.split(b"\n")
            for sig in sigs:
                os.kill(pid, int(sig))
    except OSError:
        os.kill(pid, signal.SIGKILL)
    _, status, usage = os.wait4(pid, 0)
    account = msg["env"].get("TUNECACHE_TEST_POOL_CPU")
    if account:  # tests/profiling.py: the child's CPU, which no process above this one is told of;
        # written before the launcher learns that the child ended, so it counts to the test that ran it
        with open(account, "a") as f:
            f.write(f"{usage.ru_utime + usage.ru_stime:.3f}\n")
    try:
        conn.sendall(f"{status}\n".encode())
    except OSError:
        pass
    os._exit(0)


def _become(msg: dict, fds: list[int], base_path: list[str]) -> None:
    """Turn this fork into ``python ARGV`` as the launcher would have run it; returns to run it at
    top level, so that an exception or ``sys.exit`` ends the process as Python's own start would."""
    import random
    import types

    for i, fd in enumerate(fds):
        os.dup2(fd, i)
        os.close(fd)
    os.chdir(msg["cwd"])
    os.environ.clear()
    os.environ.update(msg["env"])
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    random.seed()  # as a fresh interpreter's
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    if os.environ.get("PYTHONUNBUFFERED"):
        sys.stdout.reconfigure(write_through=True)
        sys.stderr.reconfigure(write_through=True)
    argv = msg["argv"]
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    if argv[0] == "-c":
        first, sys.argv = "", ["-c", *argv[2:]]
        code = compile(argv[1], "<string>", "exec")
    elif argv[0] == "-m":
        first, sys.argv = os.getcwd(), argv[1:]
        code = None
    else:
        script = os.path.abspath(argv[0])
        first, sys.argv = os.path.dirname(script), argv
        main.__file__ = script  # absolute, as Python (3.9+) sets it
        main.__cached__ = None
        try:
            with open(script, "rb") as f:
                source = f.read()
        except OSError as e:
            print(f"{sys.executable}: can't open file {script!r}: [Errno {e.errno}] {e.strerror}", file=sys.stderr)
            os._exit(2)
        code = compile(source, argv[0], "exec")
    sys.path[:] = [first, *extra, *base_path]
    if "multiprocessing.process" in sys.modules:  # imported by the server, in its directory
        sys.modules["multiprocessing.process"].ORIGINAL_DIR = os.getcwd()
    global _program
    _program = (main, code, argv)


_program: tuple | None = None


def _run_program() -> None:
    """Run the child's program at top level: its exit, exception or end is Python's own, teardown
    included (SQLite closes its connections and checkpoints its WAL there: a child that skipped
    it left a store a read-only reader could not open)."""
    import runpy

    main, code, argv = _program
    if code is None:
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.modules["__main__"] = main
        exec(code, main.__dict__)


if __name__ == "__main__":
    if sys.argv[1] == "launch":
        launch(sys.argv[2], int(sys.argv[3]), sys.argv[4:])
    else:
        serve(sys.argv[2], int(sys.argv[3]), sys.argv[4:] == ["inductor"])
        if _program is not None:  # this is a child: run its program, at top level
            _run_program()
