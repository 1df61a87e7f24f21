"""Issue 29: ``tunecache report --compare OTHER``: which winners changed per key, how much faster or
slower each key got (both times), per kernel; OTHER a store URL, a SQLite file or an export file;
a bad OTHER is a usage error with nothing written."""

from __future__ import annotations

import hashlib
import html
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from tunecache.cli import main
from tunecache.problem.configidentity import config_hash_of
from tunecache.problem.identity import canonical_key, problem_digest
from tunecache.problem.model import ConfigResult, Problem
from tunecache.problem.target import Target
from tunecache.report import compare
from tunecache.store.opening import open_store

BEFORE_T = Target("cuda", "sm90", "NVIDIA H200", 132, 232448, 32, "12080", "570.86.15", "12.8", "3.4")
NOW_T = Target("cuda", "sm90", "NVIDIA H200", 132, 232448, 32, "13000", "580.159.04", "13.0", "3.6")  # upgraded
EVIL = "<script>alert(1)</script>"

# (kernel, bucket) -> config -> ms, before and now. A key missing from one side is only on the other.
BEFORE = {
    ("models.k1", 1): {"c16": 1.0, "c32": 2.0},
    ("models.k1", 2): {"c16": 2.0, "c32": 3.0},  # now: c32 wins and it is faster
    ("models.k1", 3): {"c16": 3.0, "c32": 5.0},  # now: same winner, 1.5x slower
    ("models.k1", 4): {"c16": 4.0, "c32": 6.0},  # now: 3% faster: noise, not flagged
    ("models.k2", 1): {"c16": 8.0, "c32": 9.0},  # now: same winner, 2x faster
    ("models.k2", 2): {"c16": 1.0, "c32": 4.0},
    ("models.k2", 5): {"c16": 1.0, "c32": 4.0},  # only before
}
NOW = {
    ("models.k1", 1): {"c16": 1.0, "c32": 2.0},
    ("models.k1", 2): {"c16": 2.0, "c32": 1.6},
    ("models.k1", 3): {"c16": 4.5, "c32": 5.0},
    ("models.k1", 4): {"c16": 3.88, "c32": 6.0},
    ("models.k2", 1): {"c16": 4.0, "c32": 9.0},
    ("models.k2", 2): {"c16": 1.0, "c32": 4.0},
    ("models.k1", 9): {"c16": 1.0, "c32": 4.0},  # only now
}


def key_json(kernel: str, b: int) -> str:
    return canonical_key(["B", "tag"], [b, EVIL if (kernel, b) == ("models.k1", 3) else "x"])


def cfg(ch: str) -> dict:
    maxnreg = 128 if ch == "c32" else None  # shown, so that two configs differing only there tell apart
    return {
        "kwargs": {"BLOCK": int(ch[1:])},
        "num_warps": 4,
        "num_stages": 2,
        "num_ctas": 1,
        "maxnreg": maxnreg,
        "pre_hook": None,
    }


def fill(url: str, target: Target, table: dict) -> None:
    s = open_store(url)
    for (kernel, b), times in table.items():
        kj = key_json(kernel, b)
        src = hashlib.sha256(kernel.encode()).hexdigest()
        p = Problem(problem_digest(src, target, kj), kernel, src, target, kj, batch_bucket=b)
        s.put(p, [ConfigResult(config_hash_of(cfg(ch)), cfg(ch), median_ms=ms, host="h") for ch, ms in times.items()])
    s.close()


def expected(change: float = compare.DEFAULT_CHANGE) -> dict:
    """The changed keys, computed here from the tables: (kernel, key) -> (ratio, winner before, now)."""
    out = {}
    for k in BEFORE.keys() & NOW.keys():
        wb, wn = min(BEFORE[k], key=BEFORE[k].get), min(NOW[k], key=NOW[k].get)
        ratio = NOW[k][wn] / BEFORE[k][wb]
        if wb != wn or abs(ratio - 1) > change:
            out[(k[0], key_json(*k))] = (ratio, wb, wn, BEFORE[k][wb], NOW[k][wn])
    return out


@pytest.fixture
def stores(store_url, tmp_path) -> tuple[str, str]:
    """(now: SQLite or PostgreSQL, before: a SQLite file's path)."""
    before = tmp_path / "before.sqlite3"
    fill(f"sqlite:///{before}", BEFORE_T, BEFORE)
    fill(store_url, NOW_T, NOW)
    return store_url, str(before)


def run_compare(now_url: str, other: str, out: Path, *extra: str):
    return CliRunner().invoke(main, ["--url", now_url, "report", "-o", str(out), "--compare", other, "--json", *extra])


def check(j: dict, page: str) -> None:
    want = expected()
    got = {(c["kernel"], c["key"]): c for c in j["changed"]}
    assert set(got) == set(want)  # unchanged keys (k1/1, k1/4, k2/2) are not flagged
    for k, (ratio, wb, wn, ms_b, ms_n) in want.items():
        c = got[k]
        assert c["ratio"] == pytest.approx(ratio, rel=1e-3)
        assert c["before"]["ms"] == pytest.approx(ms_b) and c["now"]["ms"] == pytest.approx(ms_n)
        assert c["winner_changed"] == (wb != wn)
        assert c["before"]["config"] == compare.config_text(json.dumps(cfg(wb)))
        assert c["now"]["config"] == compare.config_text(json.dumps(cfg(wn)))
        assert c["status"] == ("faster" if ratio < 0.95 else "slower")
    assert j["matched"] == len(BEFORE.keys() & NOW.keys()) and j["only_now"] == 1 and j["only_before"] == 1
    assert j["winners_changed"] == sum(w[1] != w[2] for w in want.values())
    kernels = {k["kernel"]: k for k in j["kernels"]}
    for name in ("models.k1", "models.k2"):
        mine = {k: v for k, v in want.items() if k[0] == name}
        assert kernels[name]["faster"] == sum(v[0] < 0.95 for v in mine.values())
        assert kernels[name]["slower"] == sum(v[0] > 1.05 for v in mine.values())
    # The page: its own section; every changed key listed with both times, no unchanged one; escaped.
    section = page[page.index('<div id="compare-keys">') :]
    section = section[: section.index("</div>")]
    rows = [
        [html.unescape(c) for c in re.findall(r"<td>(.*?)</td>", r)] for r in re.findall(r"<tr>(.*?)</tr>", section)
    ]
    listed = {(r[0], r[2]): r for r in rows[1:]}
    assert set(listed) == set(want)
    for k, (ratio, _, _, ms_b, ms_n) in want.items():
        assert listed[k][4] == f"{ratio:.2f}x" and listed[k][5] == f"{ms_b:.4g}" and listed[k][6] == f"{ms_n:.4g}"
    assert EVIL not in page and html.escape(EVIL) in section


def test_compare_with_a_sqlite_store_lists_changed_winners_and_ratios(stores, tmp_path):
    now_url, before = stores
    out = tmp_path / "r.html"
    r = run_compare(now_url, before, out)
    assert r.exit_code == 0, r.output
    check(json.loads(r.output)["compare"], out.read_text())
    # Text mode says the totals in one line.
    r = CliRunner().invoke(main, ["--url", now_url, "report", "-o", str(out), "--compare", f"sqlite:///{before}"])
    want = expected().values()
    assert r.exit_code == 0, r.output
    assert (
        f"compared with sqlite:///{before}: {len(BEFORE.keys() & NOW.keys())} keys in both, "
        f"{sum(w[1] != w[2] for w in want)} winners changed, {sum(w[0] < 0.95 for w in want)} faster, "
        f"{sum(w[0] > 1.05 for w in want)} slower (by more than 5%); 1 only now, 1 only before"
    ) in r.output


def test_compare_takes_the_reports_filters(stores, tmp_path):
    """--kernel selects the keys on both sides; --since only this store's (the other's are older)."""
    now_url, before = stores
    r = run_compare(now_url, before, tmp_path / "r.html", "--kernel", "k2", "--since", "1h")
    assert r.exit_code == 0, r.output
    j = json.loads(r.output)["compare"]
    want = {k for k in expected() if k[0] == "models.k2"}
    assert {(c["kernel"], c["key"]) for c in j["changed"]} == want and want
    assert [k["kernel"] for k in j["kernels"]] == ["models.k2"]
    assert j["matched"] == sum(k[0] == "models.k2" for k in BEFORE.keys() & NOW.keys())


def test_compare_with_an_export_file(stores, tmp_path):
    now_url, before = stores
    export = tmp_path / "before.jsonl"
    r = CliRunner().invoke(main, ["--url", f"sqlite:///{before}", "export", str(export)])
    assert r.exit_code == 0, r.output
    out = tmp_path / "r.html"
    r = run_compare(now_url, str(export), out)
    assert r.exit_code == 0, r.output
    check(json.loads(r.output)["compare"], out.read_text())


@pytest.mark.parametrize("kind", ["missing path", "not an export", "missing sqlite url", "bad url"])
def test_a_bad_other_is_a_usage_error_and_nothing_is_written(sqlite_url, tmp_path, kind):
    fill(sqlite_url, NOW_T, NOW)
    junk = tmp_path / "junk.txt"
    junk.write_text("this is not an export\n")
    other = {
        "missing path": str(tmp_path / "nope.jsonl"),
        "not an export": str(junk),
        "missing sqlite url": f"sqlite:///{tmp_path / 'absent.sqlite3'}",
        "bad url": "nosuchdb://host/x",
    }[kind]
    before = set(tmp_path.iterdir())
    out = tmp_path / "r.html"
    r = CliRunner().invoke(main, ["--url", sqlite_url, "report", "-o", str(out), "--compare", other])
    assert r.exit_code == 2, r.output
    assert "--compare" in r.output and "Traceback" not in r.output
    assert set(tmp_path.iterdir()) == before  # no page, no store created at OTHER
