#!/usr/bin/env python
"""Peak memory of ``tunecache import`` (issue 13, item 9): bounded by the work, not by the file.

Two files: a hostile one (:func:`hostile_files.write_spec_bomb`: valid launch-spec lines of ~4 MiB
each that gzip shrinks ~1000:1; 300 of them are a ~1.2 MB ``.jsonl.gz`` holding 1.2 GB of lines)
and the export of N generated problems (scripts/bench_exchange.py's workload, default 100,000 x 12
config rows). Each is imported with ``--dry-run`` and for real into a fresh SQLite store (the
hostile file with ``--launch-specs --trust-unsigned`` too: it is unsigned), by the real command in
its own process, which reports its own peak RSS (VmHWM) as it exits.

With ``--before REV`` the same runs use the ``tunecache`` package of git revision REV too (from
``git archive``, imported ahead of the installed one), side by side with the working tree's:

    python scripts/bench_import_memory.py --before HEAD~1                  # full size
    python scripts/bench_import_memory.py --before HEAD~1 --problems 5000  # quick

``--inductor-mib N`` measures ``tunecache export --inductor`` instead (issue 35, item 5): a store
on SQLite and one on the local PostgreSQL, each holding N MiB of torch.compile entries (1 MiB
each, random bytes), exported by the real command; the peak RSS of an export of the same store
without ``--inductor`` is the baseline, so the difference is what the entries cost:

    python scripts/bench_import_memory.py --before HEAD~1 --inductor-mib 256
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # hostile_files
sys.path.insert(0, str(ROOT / "scripts"))  # bench_exchange, benchkit

from benchkit import SCRIPTS, procs, records, stores  # noqa: E402

# The real command; prints the process's own peak RSS as it exits (benchkit.memory) and which
# tunecache it ran.
_WRAPPER = (
    "import atexit, os, sys\n"
    "if os.environ.get('BENCH_TUNECACHE_TREE'):  # before the editable install's finder\n"
    "    sys.meta_path = [f for f in sys.meta_path if 'editable' not in getattr(f, '__module__', '')]\n"
    "    sys.path.insert(0, os.environ['BENCH_TUNECACHE_TREE'])\n"
    "import tunecache\n"
    "sys.path.append(os.environ['BENCH_SCRIPTS'])\n"
    "from benchkit.memory import peak_rss_mb\n"
    "atexit.register(lambda: sys.stderr.write('PEAK_MB %f %s\\n' % (peak_rss_mb(), tunecache.__file__)))\n"
    "from tunecache.cli import main\n"
    "main(prog_name='tunecache')\n"
)


def run_import(code: Path | None, url: str, path: Path, flags: list[str]) -> tuple[float, float, str]:
    """(peak RSS MB, seconds, output) of one ``tunecache import``; ``code`` is a tree holding tunecache."""
    return run_cli(code, url, ["import", str(path), *flags])


def run_cli(code: Path | None, url: str, argv: list[str]) -> tuple[float, float, str]:
    """(peak RSS MB, seconds, output) of one ``tunecache ARGV``; ``code`` is a tree holding tunecache."""
    env = procs.child_env(BENCH_SCRIPTS=str(SCRIPTS))
    if code is not None:
        env["BENCH_TUNECACHE_TREE"] = str(code)
    done = procs.run(procs.python("-c", _WRAPPER, "--url", url, *argv), env=env)
    done.check(f"tunecache {argv[0]} ({code or 'working tree'})")
    mb, used = next(line.split()[1:3] for line in done.stderr.splitlines() if line.startswith("PEAK_MB "))
    expected = str(code) if code is not None else str(ROOT)
    if not used.startswith(expected):
        raise SystemExit(f"ran {used}, not the tunecache of {expected}")
    return float(mb), done.wall_s, done.stdout.strip()


def print_table(first: list[str], names: list[str], rows: list[list[str]]) -> None:
    """The side-by-side table: ``first`` columns, then one per code tree."""
    align = "l" + "r" * (len(first) - 2) + "l" + "r" * len(names)
    print("\n".join(records.table([*first, *names], rows, align=align)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--problems", type=int, default=100_000)
    ap.add_argument("--specs", type=int, default=300, help="hostile launch-spec lines (~4 MiB each)")
    ap.add_argument("--before", metavar="REV", help="also measure the tunecache of this git revision")
    ap.add_argument("--inductor-mib", type=int, metavar="N", help="measure export --inductor of N MiB of entries")
    args = ap.parse_args()
    if args.inductor_mib:
        inductor_export(args.inductor_mib, args.before)
        return

    from bench_exchange import fill
    from hostile_files import write_spec_bomb

    from tunecache.exchange import export
    from tunecache.store.opening import open_store

    with tempfile.TemporaryDirectory(prefix="tunecache-bench-mem-") as tmp:
        work = Path(tmp)
        codes: list[tuple[str, Path | None]] = []
        if args.before:
            codes.append((f"before ({args.before})", stores.package_of(args.before, work / "before")))
        codes.append(("after (working tree)", None))
        bomb = work / "hostile.jsonl.gz"
        raw = write_spec_bomb(bomb, args.specs)
        # The file is unsigned: its launch specs are imported only with --trust-unsigned (since the
        # trust layer; a --before revision older than that flag refuses it).
        spec_modes = [["--dry-run"], [], ["--launch-specs", "--trust-unsigned"]]
        files = [(f"hostile: {args.specs} spec lines", bomb, raw, spec_modes)]
        src = f"sqlite:///{work / 'src.sqlite3'}"
        t0 = time.perf_counter()
        fill(src, args.problems)
        big = work / "export.jsonl"
        export(open_store(src), big)
        files.append((f"export of {args.problems:,} problems", big, big.stat().st_size, [["--dry-run"], []]))
        print(f"setup {time.perf_counter() - t0:.0f}s", file=sys.stderr)
        rows = []
        for label, path, size, modes in files:
            for flags in modes:
                row = [label, f"{path.stat().st_size / 1e6:.1f} / {size / 1e6:.0f}", " ".join(["import", *flags])]
                for name, code in codes:
                    url = f"sqlite:///{work / f'dst-{len(rows)}-{len(row)}.sqlite3'}"
                    open_store(url).close()  # the schema (same head for both), out of the measurement
                    mb, s, out = run_import(code, url, path, flags)
                    print(f"{label} | {row[2]} | {name}: {mb:.0f} MB, {s:.1f}s: {out}", file=sys.stderr)
                    row.append(f"{mb:.0f} MB ({s:.1f} s)")
                rows.append(row)
        print_table(["file", "file MB (gz / lines)", "command"], [n for n, _ in codes], rows)


def fill_inductor(url: str, mib: int) -> None:
    """``mib`` torch.compile entries of 1 MiB (random bytes: what gzip cannot shrink), unsigned."""
    from tunecache.problem.model import InductorEntry
    from tunecache.store.opening import open_store

    target = {"backend": "cuda", "arch": "sm90", "device_name": "NVIDIA H200", "driver_version": "13000"}
    target |= {"driver_release": "580.159.04", "torch_version": "2.11.0", "triton_version": "3.6"}
    s = open_store(url)
    for i in range(mib):
        s.put_inductor(
            InductorEntry("fx_graph", f"pt2:fx-graph-v1::bench-{i}:c1", "ab" * 32, os.urandom(1 << 20), target)
        )
    s.close()


def inductor_export(mib: int, before: str | None) -> None:
    """Peak RSS of ``export --inductor`` of ``mib`` MiB of entries, SQLite and PostgreSQL, before/after."""
    from bench_exchange import PG_URL

    from tunecache.store.opening import open_store

    os.environ["TUNECACHE_TRUST_STORE"] = "yes"  # the export writes the entries it trusts: all of them
    with tempfile.TemporaryDirectory(prefix="tunecache-bench-mem-") as tmp:
        work = Path(tmp)
        codes: list[tuple[str, Path | None]] = []
        if before:
            codes.append((f"before ({before})", stores.package_of(before, work / "before")))
        codes.append(("after (working tree)", None))
        pg, drop = stores.pg_database(PG_URL)
        try:
            rows = []
            for backend, url in (("SQLite", f"sqlite:///{work / 'src.sqlite3'}"), ("PostgreSQL", pg)):
                open_store(url).close()
                t0 = time.perf_counter()
                fill_inductor(url, mib)
                print(f"{backend}: filled {mib} MiB in {time.perf_counter() - t0:.0f}s", file=sys.stderr)
                for flags in ([], ["--inductor"]):
                    row = [backend, f"{mib} MiB", " ".join(["export", *flags])]
                    for name, code in codes:
                        out = work / "out.jsonl"
                        mb, sec, _ = run_cli(code, url, ["export", str(out), *flags])
                        print(f"{backend} | {row[2]} | {name}: {mb:.0f} MB, {sec:.1f}s", file=sys.stderr)
                        row.append(f"{mb:.0f} MB ({sec:.1f} s)")
                        out.unlink()
                    rows.append(row)
        finally:
            drop()
        print_table(["store", "entries", "command"], [n for n, _ in codes], rows)


if __name__ == "__main__":
    main()
