"""Write ``tunecache report`` for a store (or an export file) and a PNG screenshot of it, taken by
headless Chromium (Debian's ``chromium``) over the DevTools pipe of tests/chromium.py.

    python scripts/report_screenshot.py --url sqlite:////path/store.sqlite3 -o docs/report.html --png docs/report.png
    python scripts/report_screenshot.py --export h200.jsonl.gz -o docs/report.html --png docs/report.png

An export file carries no per-host measurements: its report has no fleet section (use --url on
the store itself for that); it is imported into a temporary SQLite store first. Exits 1 if the
page logs a console error, a plot renders with no size, or the page requests anything outside itself.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from benchkit import gates  # noqa: E402
from chromium import Chromium  # noqa: E402

from tunecache.exchange import import_  # noqa: E402
from tunecache.report.report import Filters, write_report  # noqa: E402
from tunecache.store.opening import open_store  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--url", help="store URL")
    src.add_argument("--export", type=Path, help="an export file (tunecache export), imported into a temporary store")
    ap.add_argument("-o", "--output", type=Path, default=Path("report.html"))
    ap.add_argument("--png", type=Path, default=Path("report.png"))
    ap.add_argument("--kernel")
    ap.add_argument("--target")
    ap.add_argument("--width", type=int, default=1400)
    ap.add_argument("--title", help="the page's title (say where the store comes from)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = args.url or f"sqlite:///{Path(tmp) / 'store.sqlite3'}"
        store = open_store(url, create=args.export is not None)
        if args.export is not None:
            import_(store, args.export)
        summary = write_report(
            store, str(args.output), Filters(kernel=args.kernel, target=args.target), title=args.title
        )
        store.close()
    with Chromium() as browser:
        got = browser.open_page(args.output, width=args.width, screenshot=args.png)
    outside = [u for u in got["requests"] if u != got["url"] and not u.startswith("data:")]
    empty = [s for s in got["plot_sizes"] if not (s[0] > 0 and s[1] > 0)]
    print(f"wrote {args.output} ({summary['bytes']} bytes, {summary['plots']} plots) and {args.png}")
    gate = gates.Gate("FAIL")
    for what, bad in (("console errors", got["console_errors"]), ("requests outside", outside), ("empty plots", empty)):
        gate.expect(not bad, f"{what}: {bad}")
    gate.enforce()
    return 0


if __name__ == "__main__":
    sys.exit(main())
