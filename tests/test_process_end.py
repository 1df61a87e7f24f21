"""What a process leaves when it ends (issue 27): its counts written to the store however it ends,
and, with ``TUNECACHE_SUMMARY``, one line saying what it did. Each case runs real processes."""

from __future__ import annotations

import re
import signal

import pytest
from poolprog import SIZES
from processes import run_json, run_json_stderr
from summaryprog import SIZES as SUMMARY_SIZES


@pytest.mark.parametrize(
    ("store", "method"), [("sqlite", "fork"), ("sqlite", "spawn"), ("postgresql", "fork")]
)  # PostgreSQL under spawn too would add only a slow start: the writes are the fork case's
def test_pool_workers_terminated_at_exit_have_their_counts_written(request, store, method):
    # `with Pool() as p` ends with terminate(): SIGTERM to every worker, whose atexit never runs
    # (a forked worker's never runs at all). Their hits, counters and coverage rows were lost:
    # `tunecache stats` said "kernels seen: 0" and gc took the problems they used for unused.
    url = request.getfixturevalue("sqlite_url" if store == "sqlite" else "pg_url")
    got, err = run_json_stderr(["poolprog.py", method, url], {"TUNECACHE_SUMMARY": "1"}, timeout=240)
    tuned, after_tune = got["tuned"], got["after_tune"]
    pids = tuned.pop("pids") + got["restarted"].pop("pids")  # the workers that ran a launch
    assert tuned["benchmarks"] > 0 and tuned["hits"] == 0
    assert after_tune["problems"] == len(SIZES)
    assert after_tune["kernels_seen"] == 1, got  # the workers' kernel_stats row
    assert after_tune["stats"] == {**tuned, "hits": 0}, got
    restarted, after = got["restarted"], got["after_restart"]
    assert restarted == {"hits": len(SIZES), "misses": 0, "benchmarks": 0}, got
    assert after["stats"] == {k: tuned[k] + restarted[k] for k in tuned}, got
    assert after["hit_counts"] == [1] * len(SIZES), got  # each problem's hit, once
    assert after["gc_would_delete"] == 0, got  # used since the cutoff: not unused
    assert got["restart_exitcodes"] == [-signal.SIGTERM]  # the workers still died of SIGTERM
    # each worker that launched said its line (the SIGTERM'd ones too), with its pid; the parent,
    # which launched nothing, none
    lines = summaries(err)
    assert sorted(int(ln["pid"] or 0) for ln in lines) == sorted(pids), err
    for k in ("hits", "benchmarks"):
        assert sum(int(ln[k]) for ln in lines) == tuned[k] + restarted[k], (k, err)


# ---- the summary line (TUNECACHE_SUMMARY) ---------------------------------------------------------

SUMMARY = re.compile(
    r"tunecache(?: \(pid (?P<pid>\d+)\))?: (?P<covered>\d+)(?: of (?P<seen>\d+))? kernels? covered, "
    r"(?P<hits>[\d,]+) hits?, (?P<benchmarks>[\d,]+) benchmarks?, (?P<preloaded>[\d,]+) preloaded "
    r"\((?P<skipped>[\d,]+) skipped[^)]*\), saved (?P<saved>[\d.]+) s, spent (?P<bench>[\d.]+) s benchmarking"
)


def summaries(stderr: str) -> list[dict]:
    """The summary lines on stderr, parsed; any other line that starts like one fails the test."""
    out = []
    for line in stderr.splitlines():
        m = SUMMARY.fullmatch(line)
        if m:
            out.append({k: v.replace(",", "") if v else v for k, v in m.groupdict().items()})
        else:
            assert not re.match(r"tunecache( \(pid \d+\))?: \d", line), f"a summary line that does not parse: {line}"
    return out


def agrees(line: dict, stats: dict) -> None:
    """The line says what the process counted."""
    assert int(line["covered"]) == stats["kernels_covered"]
    assert line["seen"] is None or int(line["seen"]) == stats["kernels_seen"]
    for k in ("hits", "benchmarks", "preloaded", "preload_skipped"):
        assert int(line["skipped" if k == "preload_skipped" else k]) == stats[k], (k, line, stats)
    assert float(line["saved"]) == pytest.approx(stats["saved_seconds"], abs=0.051)
    assert float(line["bench"]) == pytest.approx(stats["bench_seconds"], abs=0.051)


def test_the_summary_line_says_what_a_first_run_and_a_restart_did(sqlite_url):
    on = {"TUNECACHE_SUMMARY": "1"}
    first, err = run_json_stderr(["summaryprog.py", sqlite_url], on)
    [line] = summaries(err)
    agrees(line, first["stats"])
    assert line["pid"] is None  # the process itself: no pid
    assert int(line["benchmarks"]) > 0 and int(line["hits"]) == 0 and int(line["covered"]) == 1
    restart, err = run_json_stderr(["summaryprog.py", sqlite_url], on)
    [line] = summaries(err)
    agrees(line, restart["stats"])
    assert int(line["benchmarks"]) == 0 and int(line["hits"]) == len(SUMMARY_SIZES)
    assert float(line["saved"]) > 0  # the first run's tuning time, not spent again
    for off in ({}, {"TUNECACHE_SUMMARY": "0"}):  # off by default
        _, err = run_json_stderr(["summaryprog.py", sqlite_url], off)
        assert summaries(err) == [] and "covered" not in err, err


def test_a_forked_child_summarises_its_own_counts_not_its_parents(sqlite_url):
    run_json_stderr(["summaryprog.py", sqlite_url], {})  # tune, silently
    got, err = run_json_stderr(["summaryprog.py", sqlite_url, "fork"], {"TUNECACHE_SUMMARY": "1"})
    assert got["child_status"] == 0
    lines = summaries(err)
    assert len(lines) == 2, err  # one each: the child did not repeat the parent's line
    parent = next(ln for ln in lines if ln["pid"] is None)
    child = next(ln for ln in lines if ln["pid"] is not None)
    agrees(parent, got["stats"])
    assert int(child["pid"]) == got["child"]["pid"]
    # the child's line: what it did since the fork (one hit), not the parent's hits again
    own = {k: v - got["child"]["before"].get(k, 0) for k, v in got["child"]["stats"].items()}
    assert int(child["hits"]) == own["hits"] == 1, (child, own)
    assert int(child["benchmarks"]) == 0


TERM_PROGRAM = """
import json, multiprocessing, os, signal, sys, time
from tunecache.process import counters, processend
from tunecache.process import writeback

class Store:
    readonly = False
    def __init__(self, hang): self.hang = hang
    def __hash__(self): return id(self)
    def bump_stats(self, deltas): time.sleep(60 if self.hang else 0)
    def record_hits(self, hits): time.sleep(60 if self.hang else 0)

def program_handler(signum, frame):
    pass  # the program's own choice: ignore SIGTERM

def name(h):
    return {signal.SIG_DFL: "default", program_handler: "program"}.get(h, "tunecache")

def child(own_handler, q):
    writeback.FLUSH_DELAY_S = 600.0
    if own_handler:
        signal.signal(signal.SIGTERM, program_handler)
    counters.count("k", Store(hang=True), hits=1)  # queued for a store that never answers
    q.put(name(signal.getsignal(signal.SIGTERM)))
    time.sleep(60)

out = {}
counters.count("k", Store(hang=False), hits=1)  # queued in the main process, not a multiprocessing child
out["main"] = name(signal.getsignal(signal.SIGTERM))
ctx = multiprocessing.get_context("fork")
for own in (False, True):
    q = ctx.Queue()
    p = ctx.Process(target=child, args=(own, q))
    p.start()
    handler = q.get(timeout=60)
    t0 = time.monotonic()
    p.terminate()
    p.join(0.5 if own else processend.TERM_BUDGET_S + 5)
    out["own" if own else "default"] = {"handler": handler, "exitcode": p.exitcode,
                                        "seconds": time.monotonic() - t0}
    if p.exitcode is None:
        p.kill()
        p.join()
out["budget"] = processend.TERM_BUDGET_S
print(json.dumps(out))
"""


def test_sigterm_is_watched_only_in_a_multiprocessing_child_whose_handler_was_the_default():
    got = run_json(["-c", TERM_PROGRAM], timeout=120)
    assert got["main"] == "default"  # a main process's signals are not touched
    dflt = got["default"]
    assert dflt["handler"] == "tunecache"
    # its last words wait for a store that never answers: the watchdog ends them, and the worker
    # dies of SIGTERM as it would have, within the budget (plus scheduling slack)
    assert dflt["exitcode"] == -signal.SIGTERM, got
    assert dflt["seconds"] < got["budget"] + 2.0, got
    own = got["own"]
    assert own["handler"] == "program"  # the program's handler is left alone: it ignores SIGTERM
    assert own["exitcode"] is None, got  # and so the worker lived on (killed by the test)


ELSEWHERE_PROGRAM = """
import json, multiprocessing, os, signal, sys, threading, time
from tunecache.process import processend

def child(marker):
    processend.at_end("test-marker", lambda: open(marker, "w").write("said"), order=5)
    processend.arm()
    # the kernel hands a process-directed SIGTERM to any thread that does not block it: to another
    # thread whenever the main one blocks every signal for a moment (glibc does, inside each
    # pthread_create). Here it is handed to a thread outright, once the main one sleeps in a call.
    def elsewhere():
        time.sleep(0.5)
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)

    threading.Thread(target=elsewhere).start()
    time.sleep(60)

if __name__ == "__main__":
    out = {}
    for method in ("fork", "spawn"):
        marker = os.path.join(sys.argv[1], method)
        p = multiprocessing.get_context(method).Process(target=child, args=(marker,))
        p.start()
        p.join(30)
        out[method] = {"exitcode": p.exitcode, "said": os.path.exists(marker)}
        if p.exitcode is None:
            p.kill()
            p.join()
    print(json.dumps(out))
"""


def test_a_sigterm_another_thread_took_still_ends_the_worker_with_its_last_words(tmp_path):
    # A pool's terminate() hung for good (in CI; here 2 runs in 42, six at once): the SIGTERM went to one of
    # the worker's other threads, so Python's handler waited for the main thread, asleep in a call
    # (a task's sleep, or the lock of the task queue, which the terminating parent holds). Before
    # tunecache set a handler the default action killed the worker whichever thread took it.
    prog = tmp_path / "elsewhere.py"
    prog.write_text(ELSEWHERE_PROGRAM)
    got = run_json([str(prog), str(tmp_path)], timeout=200)
    for method in ("fork", "spawn"):
        assert got[method] == {"exitcode": -signal.SIGTERM, "said": True}, got


WAKEUP_PROGRAM = """
import json, multiprocessing, os, signal, socket, sys
from tunecache.process import processend

def name(h):
    return {signal.SIG_DFL: "default"}.get(h, "tunecache")

def child(own_fd, q):
    a, b = socket.socketpair()
    a.setblocking(False)
    if own_fd:  # the program's wakeup fd, as an asyncio loop with signal handlers sets it
        signal.set_wakeup_fd(a.fileno())
    processend.arm()
    got = {"handler": name(signal.getsignal(signal.SIGTERM))}
    held = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(held)
    got["wakeup"] = "program" if held == a.fileno() else ("none" if held == -1 else "tunecache")
    pid = os.fork()  # not a multiprocessing child: the watcher is not there, nor its handler
    if pid == 0:
        held = signal.set_wakeup_fd(-1)
        os._exit(10 * (name(signal.getsignal(signal.SIGTERM)) == "default") + (held == -1))
    got["forked"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    q.put(got)

if __name__ == "__main__":
    ctx = multiprocessing.get_context("fork")
    out = {}
    for own in (False, True):
        q = ctx.Queue()
        p = ctx.Process(target=child, args=(own, q))
        p.start()
        out["program" if own else "none"] = q.get(timeout=60)
        p.join(30)
    print(json.dumps(out))
"""


def test_the_sigterm_watch_leaves_a_programs_wakeup_fd_alone_and_stays_out_of_forks(tmp_path):
    prog = tmp_path / "wakeup.py"
    prog.write_text(WAKEUP_PROGRAM)
    got = run_json([str(prog)], timeout=120)
    # armed: tunecache's handler and wakeup fd; a child forked from it has neither (exit 11)
    assert got["none"] == {"handler": "tunecache", "wakeup": "tunecache", "forked": 11}, got
    # the program's wakeup fd (asyncio's): kept, and SIGTERM left at its default, whose action
    # reaches the process whichever thread takes it
    assert got["program"]["handler"] == "default" and got["program"]["wakeup"] == "program", got


ZERO_CODE = """
import json, sys
import torch, triton, triton.language as tl

@triton.autotune(configs=[triton.Config({"BLOCK": 16}), triton.Config({"BLOCK": 32})], key=["N"])
@triton.jit
def add(x, y, out, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + offs, tl.load(x + offs, mask=offs < N) + tl.load(y + offs, mask=offs < N), mask=offs < N)

for n in (16, 40):
    x, out = torch.arange(n, dtype=torch.float32), torch.empty(n)
    add[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, x, out, n)
    assert torch.equal(out, 2 * x)
print(json.dumps({"stats": sys.modules["tunecache"].stats()}))  # imported by the start-up hook alone
"""


def test_the_summary_line_of_a_zero_code_process(tmp_path, sqlite_url):
    # Only TUNECACHE_INSTALL=1: no handler on the "tunecache" logger, yet the line is on stderr.
    prog = tmp_path / "zero.py"
    prog.write_text(ZERO_CODE)
    env = {"TUNECACHE_URL": sqlite_url, "TUNECACHE_INSTALL": "1", "TUNECACHE_SUMMARY": "1"}
    first, err = run_json_stderr([str(prog)], env)
    [line] = summaries(err)
    agrees(line, first["stats"])
    assert int(line["benchmarks"]) == 4 and int(line["hits"]) == 0  # 2 configs x 2 keys
    restart, err = run_json_stderr([str(prog)], env)
    [line] = summaries(err)
    agrees(line, restart["stats"])
    assert int(line["benchmarks"]) == 0 and int(line["hits"]) == 2 and int(line["covered"]) == 1


def test_the_summary_line_names_why_the_preload_skipped_specs_counted_from_the_fork():
    """The line's skipped count comes with its reasons (``tunecache.preload_skips()``); a forked
    child's line names only the skips counted after the fork."""
    import os
    import subprocess
    import sys

    code = """
import os, sys
from tunecache.process import counters
counters.preload_skipped("unparseable")
counters.preload_skipped("unparseable")
counters.preload_skipped("options")
sys.stderr.flush()
pid = os.fork()
if pid == 0:
    counters.preload_skipped("other_triton")
    from tunecache.process import summary
    summary.say()
    os._exit(0)
os.waitpid(pid, 0)
"""
    env = {**os.environ, "TUNECACHE_SUMMARY": "1", "TUNECACHE_URL": "sqlite://"}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("tunecache")]
    assert len(lines) == 2, r.stderr
    child = next(ln for ln in lines if ln.startswith("tunecache (pid"))
    parent = next(ln for ln in lines if ln is not child)
    assert "3 skipped: 2 unparseable, 1 options" in parent, parent
    assert "1 skipped: 1 other_triton" in child and "unparseable" not in child, child
