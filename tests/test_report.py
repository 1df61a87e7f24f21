"""``tunecache report`` and ``tunecache hosts``: a store with known figures, the page's content, the
outlier analysis, and the page opened in a real headless Chromium."""

from __future__ import annotations

import html
import json
import os
import re
from html.parser import HTMLParser

import builders
import pytest
from chromium import Chromium, find_chromium
from click.testing import CliRunner
from realcli import tc

from tunecache.cli import main
from tunecache.problem.identity import problem_digest
from tunecache.problem.model import ConfigResult, Problem
from tunecache.problem.target import Target
from tunecache.report import fleet, labels, report
from tunecache.store.opening import open_store
from tunecache.store.schema import measurements

H200 = Target("cuda", "sm90", "NVIDIA H200", 132, 232448, 32, "13000", "580.159.04", "13.0", "3.6")
KERNEL = "models.mla.decode_kernel"
KEYS = 30
SLOW = 1.20  # the slow host's factor on every key


def cfg(block: int, stages: int = 2) -> dict:
    return {"kwargs": {"BLOCK_T": block}, "num_warps": 4, "num_stages": stages}


def times(bucket: int) -> dict[str, float]:
    """Known figures: c16 wins buckets 1..15, c32 wins 16..30, c64 is 2-3x off everywhere."""
    return {
        "c16": 0.1 * bucket + (0.0 if bucket <= 15 else 1.0),
        "c32": 0.1 * bucket + 0.5,
        "c64": 0.1 * bucket + 2.0,
    }


def fill(url: str, factor_b: float, keys: int = KEYS) -> None:
    """Host gpu-a tunes every key; host gpu-b then times the same keys ``factor_b`` times as long."""
    s = open_store(url)
    for b in range(1, keys + 1):
        key = json.dumps([["B", b], ["q.dtype", "torch.bfloat16"]])
        p = Problem(problem_digest("src1", H200, key), KERNEL, "src1", H200, key, batch_bucket=b, tuning_seconds=2.0)
        for host, f in (("gpu-a", 1.0), ("gpu-b", factor_b)):
            rows = [
                ConfigResult(h, cfg(int(h[1:])), median_ms=t * f, samples=50, host=host) for h, t in times(b).items()
            ]
            rows.append(
                ConfigResult(
                    "c128",
                    cfg(128, 4),
                    status="out_of_resources",
                    failure={"resource": "shared memory", "required": 262144, "limit": 232448},
                    host=host,
                )
            )
            rows.append(
                ConfigResult("c8", cfg(8, 1), status="compile_error", failure={"message": "tl.dot needs 16"}, host=host)
            )
            s.put(Problem(**{**p.__dict__, "host": host, "configs": []}), rows)
    s.record_hits({problem_digest("src1", H200, json.dumps([["B", 1], ["q.dtype", "torch.bfloat16"]])): 7})
    s.close()


@pytest.fixture
def skewed(store_url: str) -> str:
    fill(store_url, SLOW)
    return store_url


def test_the_store_keeps_every_hosts_timing_of_an_identical_problem(sqlite_url):
    """configs keeps one row per config (the first host's); measurements keeps each host's."""
    fill(sqlite_url, SLOW, keys=1)
    s = open_store(sqlite_url)
    p = s.find_problems(with_configs=True)[0]
    assert {c.host for c in p.configs} == {"gpu-a"}  # what configs alone could show
    with s.snapshot("t") as conn:
        rows = conn.execute(measurements.select()).mappings().all()
    got = {(r["host"], r["config_hash"]): r["median_ms"] for r in rows}
    assert got == {(h, c): t * (SLOW if h == "gpu-b" else 1.0) for h in ("gpu-a", "gpu-b") for c, t in times(1).items()}
    s.delete(kernel=KERNEL)  # invalidate/gc take a problem's measurements with it
    with s.snapshot("t") as conn:
        assert conn.execute(measurements.select()).all() == []


def test_peer_median_flags_a_host_20_percent_slower_even_with_two_hosts():
    ks = []
    for i in range(KEYS):
        ratios, t, peers, _ = fleet.compare_key([("a", "c1", 1.0 + i), ("b", "c1", (1.0 + i) * SLOW), ("a", "c2", 3.0)])
        ks.append(fleet.KeyComparison(f"d{i}", "k", "[]", "H200", ratios, t, peers))
    a = fleet.analyse(ks)
    assert [h.host for h in a.outliers] == ["b"]
    b = a.outliers[0]
    assert b.keys == KEYS and b.median_ratio == pytest.approx(SLOW) and b.slower_share == 1.0
    assert fleet.analyse(ks, threshold=0.25).outliers == []  # 20% is within a 25% threshold
    assert fleet.analyse(ks[:9], min_keys=10).outliers == []  # too few keys is no evidence


def test_hosts_exits_1_on_the_skewed_store_and_names_the_slow_host(skewed):
    r = CliRunner().invoke(main, ["--url", skewed, "hosts"])
    assert r.exit_code == 1, r.output
    assert "gpu-b" in r.output and "OUTLIER" in r.output and "1.20" in r.output
    j = CliRunner().invoke(main, ["--url", skewed, "hosts", "--json"])
    assert j.exit_code == 1
    out = json.loads(j.output)
    assert out["outliers"] == ["gpu-b"] and out["keys_compared"] == KEYS
    worst = out["hosts"][0]["worst"][0]
    assert worst["ratio"] == pytest.approx(SLOW) and worst["kernel"] == KERNEL
    assert CliRunner().invoke(main, ["--url", skewed, "hosts", "--threshold", "0.3"]).exit_code == 0


def test_hosts_exits_0_on_an_even_store(store_url):
    fill(store_url, 1.02)  # 2%: noise, not a slow GPU
    r = CliRunner().invoke(main, ["--url", store_url, "hosts"])
    assert r.exit_code == 0, r.output
    assert "OUTLIER" not in r.output and "30 keys" in r.output


def test_hosts_with_one_host_has_nothing_to_compare(sqlite_url):
    s = open_store(sqlite_url)
    with s.snapshot("t") as conn:
        assert conn.execute(measurements.select()).all() == []
    r = CliRunner().invoke(main, ["--url", sqlite_url, "hosts"])
    assert r.exit_code == 0 and "nothing to compare" in r.output


def test_a_miss_names_the_last_host_that_missed(sqlite_url, monkeypatch):
    """The misses row keeps the host of the latest miss (it kept the first: the page named a host that
    may since have been fixed)."""
    s = open_store(sqlite_url)
    p = Problem(problem_digest("src1", H200, "[]"), KERNEL, "src1", H200, "[]")
    for host in ("first-host", "last-host"):
        monkeypatch.setenv("TUNECACHE_HOST_ID", host)
        s.record_miss(p, "capture")
    (row,) = s.list_misses()
    assert row["host"] == "last-host" and row["count"] == 2


def _text(page: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", " ", page))


def test_report_names_the_outlier_the_winners_and_the_failure_reasons(skewed, tmp_path):
    out = tmp_path / "r.html"
    r = CliRunner().invoke(main, ["--url", skewed, "report", "-o", str(out)])
    assert r.exit_code == 0, r.output
    page = out.read_text()
    text = _text(page)
    assert "Outlier: gpu-b" in text and "median of per-key ratios 1.20x" in text
    assert "gpu-a" in text  # the peer, not an outlier
    # Winners per key, in key order (numeric), labelled by the one field that varies (B); the
    # constant one said once: c16 up to bucket 15, c32 from 16.
    assert "Every key has q.dtype=torch.bfloat16" in text and "tuning key: B (values)" in text
    rows = re.findall(r"<tr><td>(\d+)</td><td>([^<]*)</td><td>([^<]*)</td></tr>", page)
    assert len(rows) == KEYS
    for bucket, winner, ms in rows:
        b = int(bucket)
        best = min(times(b), key=times(b).get)
        assert winner == labels.config_label(cfg(int(best[1:]))), (b, winner)
        assert float(ms) == pytest.approx(times(b)[best], rel=1e-3)
    assert [int(b) for b, _, _ in rows] == sorted(int(b) for b, _, _ in rows)
    # Failures with their reasons: OutOfResources with what it needs and the limit.
    assert "shared memory: needs 262144, limit 232448" in text
    assert "tl.dot needs 16" in text and "compile_error" in text
    # Plots: one heat map and one winner line per group, fleet, time saved; all inline SVG.
    assert page.count('<figure class="plot"') == page.count("<svg") == 4
    assert "Drawn:" not in text and "left out" not in text  # 30 keys fit
    # Time saved: 7 hits x 2 s on bucket 1.
    assert "14.0" in text


def test_report_samples_a_large_store_and_says_so(sqlite_url, tmp_path, monkeypatch):
    fill(sqlite_url, SLOW)
    monkeypatch.setattr(report, "MAX_KEYS", 8)
    monkeypatch.setattr(report, "MAX_CONFIGS", 2)
    page = report.render(open_store(sqlite_url))
    text = _text(page)
    assert "Drawn: 8 of 30 keys" in text and "(22 left out" in text
    assert "2 of 5 configs drawn" in text and "(3 left out)" in text
    buckets = [int(b) for b in re.findall(r"<tr><td>(\d+)</td><td>", page)]
    assert len(buckets) == 8 and buckets[0] == 1 and buckets[-1] == KEYS  # spread over every bucket


def test_report_filters_by_kernel_and_target(skewed, tmp_path):
    s = open_store(skewed)
    none = report.render(s, report.Filters(kernel="other_kernel"))
    assert "No problems match" in none and "nothing to compare" in _text(none)
    by_name = report.render(s, report.Filters(kernel="decode_kernel", target="sm90"))
    assert "Outlier: gpu-b" in _text(by_name)


def test_report_loads_nothing_from_outside(skewed, tmp_path):
    page = report.render(open_store(skewed))
    # No script, no link, no external reference: every src/href/url() is absent or a data: URI.
    assert "<script" not in page and "<link" not in page
    for ref in re.findall(r"""(?:src|href)\s*=\s*["']([^"']+)""", page) + re.findall(r"url\(([^)]+)\)", page):
        assert ref.startswith(("data:", "#")), ref


@pytest.mark.skipif(
    find_chromium() is None and not os.environ.get("CI"), reason="no chromium (scripts/test installs it)"
)
def test_report_in_headless_chromium(skewed, tmp_path):
    """A real browser: the page loads with no console error, every plot has a size, no request leaves
    the file (inline data: images are the SVGs' own rasters), and a screenshot is taken."""
    path = tmp_path / "report.html"
    report.write_report(open_store(skewed), str(path))
    shot = tmp_path / "report.png"
    with Chromium() as browser:
        got = browser.open_page(path, screenshot=shot)
    assert got["console_errors"] == []
    assert len(got["plot_sizes"]) == 4
    assert all(w > 50 and h > 50 for w, h in got["plot_sizes"]), got["plot_sizes"]
    assert got["requests"][0] == path.resolve().as_uri()
    outside = [u for u in got["requests"] if u != got["url"] and not u.startswith("data:")]
    assert outside == []
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    # Height of the PNG (IHDR): the whole page, not one viewport.
    assert int.from_bytes(png[20:24], "big") > 900


def test_browser_test_sees_console_errors_and_outside_requests(tmp_path):
    """The browser check can fail: a page with a script error and a remote image is caught."""
    if find_chromium() is None and not os.environ.get("CI"):
        pytest.skip("no chromium")
    bad = tmp_path / "bad.html"
    bad.write_text(
        '<html><body><figure class="plot"><svg width="0" height="0"></svg></figure>'
        '<img src="http://127.0.0.1:9/x.png"><script>console.error("boom"); undefinedFn()</script></body></html>'
    )
    with Chromium(timeout=30) as browser:
        got = browser.open_page(bad)
    assert any("boom" in e for e in got["console_errors"])
    assert any("undefinedFn" in e or "Uncaught" in e for e in got["console_errors"])
    assert "http://127.0.0.1:9/x.png" in got["requests"]
    assert got["plot_sizes"] == [[0, 0]]


# Store text is a user's: a kernel's name, a key's values, a config's, a host's. None of it is markup
# (HTML) nor TeX (matplotlib reads $...$ as math: mangled, or a crash on math it cannot parse).
HOSTILE = "--><script>alert(1)</script><img src=x onerror=alert(2)>"
EVIL_KERNEL = f"evil.k{HOSTILE}$x$"
EVIL_HOST = "gpu-$x^$"  # math that does not parse: matplotlib raises while drawing it
EVIL_KEY = "a$b$c"


class _Tags(HTMLParser):
    """The elements and attributes a browser would make of a page."""

    def __init__(self, page: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, list[tuple[str, str | None]]]] = []
        self.feed(page)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, attrs))


def _svg_texts(page: str) -> list[str]:
    """Every text the SVGs draw, one string per <text> element, as the browser reads it."""
    return [html.unescape(re.sub(r"<[^>]+>", "", t)) for t in re.findall(r"<text\b[^>]*>(.*?)</text>", page, re.S)]


def test_report_draws_and_escapes_store_text_verbatim(sqlite_url, tmp_path):
    s = open_store(sqlite_url)
    key = json.dumps([["N", 7], ["tag", EVIL_KEY]])
    p = Problem(problem_digest("src9", H200, key), EVIL_KERNEL, "src9", H200, key, tuning_seconds=1.0)
    for host, f in ((EVIL_HOST, 1.0), ("gpu-b", 1.5)):
        rows = [
            ConfigResult(h, {**cfg(b), "kwargs": {"BLOCK_T": b, "MODE": "p$y$q"}}, median_ms=b * f, host=host)
            for h, b in (("c16", 16), ("c32", 32))
        ]
        s.put(Problem(**{**p.__dict__, "host": host, "configs": []}), rows)
    s.record_miss(p, "capture")
    s.close()
    out = tmp_path / "r.html"
    r = tc("--url", sqlite_url, "report", "--min-keys", "1", "-o", str(out))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    page = out.read_text()
    # HTML: the payload is text, never a tag or an attribute.
    tags = _Tags(page).tags
    assert [t for t, _ in tags if t in ("script", "img")] == []
    assert [(t, a) for t, attrs in tags for a, _ in attrs if a.startswith("on")] == []
    assert html.escape(EVIL_KERNEL) in page and EVIL_KERNEL in _text(page)
    # SVG: each label drawn as the very string stored (no TeX: no $ dropped, no glyphs split).
    texts = _svg_texts(page)
    assert EVIL_KERNEL.split(".", 1)[1] in texts  # time saved, one bar per kernel (its shortest unique name)
    titles = [html.unescape(t) for t in re.findall(r"<title>([^<]*)</title>", page)]
    assert any(t.startswith(f"{EVIL_KERNEL}: saved") for t in titles)  # its full name on hover
    assert EVIL_HOST in texts  # fleet, one row per host
    assert f"N=7 tag={EVIL_KEY}" in texts  # heat map and winner line columns
    assert "BLOCK_T=16 MODE=p$y$q w4 s2" in texts  # heat map rows
    assert f"k{HOSTILE}$x$ N=7 tag={EVIL_KEY}"[:80] in [t[:80] for t in texts]  # misses


# ---- a fleet's store: 60+ kernels, 150+ keys of one kernel, 10 hosts ------------------------------


def _store_counts(url: str) -> dict[str, float]:
    """The summary's figures, counted here in SQL straight from the tables (not by the report's code)."""
    s = open_store(url)
    q = {
        "kernels": "SELECT COUNT(DISTINCT kernel) FROM problems",
        "keys": "SELECT COUNT(*) FROM problems",
        "hosts": "SELECT COUNT(*) FROM (SELECT host FROM problems UNION SELECT host FROM configs "
        "UNION SELECT host FROM measurements) h",
        "GPUs": "SELECT COUNT(DISTINCT device_name) FROM problems",
        "configs failed": "SELECT COUNT(*) FROM configs WHERE status IN "
        "('out_of_resources', 'compile_error', 'runtime_error')",
        "keys with no working config": "SELECT COUNT(*) FROM problems p WHERE NOT EXISTS "
        "(SELECT 1 FROM configs c WHERE c.digest = p.digest AND c.status = 'ok')",
        "open misses": "SELECT COUNT(DISTINCT digest) FROM misses",
        "time spent tuning": "SELECT SUM(p.tuning_seconds * COALESCE(m.n, 1)) FROM problems p LEFT JOIN "
        "(SELECT digest, COUNT(DISTINCT host) n FROM measurements GROUP BY digest) m ON m.digest = p.digest",
        "time saved": "SELECT SUM(hit_count * tuning_seconds) FROM problems",
        "groups": "SELECT COUNT(*) FROM (SELECT DISTINCT kernel, source_hash, target_digest FROM problems) g",
    }
    with s.snapshot("t") as conn:
        out = {k: float(conn.exec_driver_sql(v).scalar_one()) for k, v in q.items()}
    s.close()
    return out


_PROBE = """({
  summary: Object.fromEntries([...document.querySelectorAll('#summary td[data-key]')]
    .map(td => [td.dataset.key, td.textContent])),
  links: [...document.querySelectorAll('a[href^="#"]')].map(a => a.getAttribute('href').slice(1)),
  missing: [...document.querySelectorAll('a[href^="#"]')]
    .filter(a => !document.getElementById(a.getAttribute('href').slice(1))).map(a => a.getAttribute('href')),
  index: document.querySelectorAll('.index a').length,
  overflow: document.documentElement.scrollWidth,
  figures: [...document.querySelectorAll('figure.plot')].map(f => {
    const r = f.getBoundingClientRect(); return [f.dataset.title, r.right, f.scrollWidth > f.clientWidth]}),
})"""


def _number(text: str) -> float:
    return float(text.split()[0].replace(",", ""))


@pytest.mark.skipif(
    find_chromium() is None and not os.environ.get("CI"), reason="no chromium (scripts/test installs it)"
)
def test_report_of_a_fleet_store_in_chromium(sqlite_url, tmp_path):
    """60+ kernels, the wide kernel's 168 keys, 10 hosts: every group reachable from the index, the
    summary equal to the store's own counts, a note wherever rows are left out, keys in numeric order,
    config labels unique in every group, nothing wider than the 1400 px window but inside its own box."""
    builders.report_store(sqlite_url)
    want = _store_counts(sqlite_url)
    assert want["kernels"] >= 60 and want["hosts"] >= 10
    path = tmp_path / "report.html"
    report.write_report(open_store(sqlite_url), str(path))
    page = path.read_text()
    with Chromium() as browser:
        got = browser.open_page(path, probe=_PROBE)
    assert got["console_errors"] == []
    assert [u for u in got["requests"] if u != got["url"] and not u.startswith("data:")] == []
    p = got["probe"]
    # The index: one link per group, every link's anchor in the page.
    assert p["missing"] == [] and p["index"] == want["groups"]
    # The summary: the store's counts.
    s = p["summary"]
    for k in ("kernels", "keys", "hosts", "GPUs", "configs failed", "keys with no working config", "open misses"):
        assert _number(s[k]) == want[k], (k, s[k], want[k])
    for k in ("time spent tuning", "time saved"):
        assert _number(s[k]) == pytest.approx(want[k], abs=0.06), (k, s[k], want[k])
    assert "hits x the key's tuning seconds" in _text(page)  # the definition, next to the number
    # A note wherever rows were left out, with the count and how to see them.
    text = " ".join(_text(page).split())
    n_groups = int(want["groups"])
    assert f"Heat maps drawn for the {report.MAX_GROUPS} largest of {n_groups} groups" in text
    assert f"Drawn: {report.MAX_KEYS} of 168 keys" in text and "(120 left out" in text
    assert text.count("Not drawn: draw it with tunecache report --kernel") == n_groups - report.MAX_GROUPS
    n_k = int(want["kernels"])
    bars = report.MAX_SAVED_BARS
    assert f"The plot draws the {bars} kernels that saved most of {n_k} ({n_k - bars} left out of the plot" in text
    assert f"The {report.MAX_OVER_TIME} kernels that saved most of {n_k} ({n_k - report.MAX_OVER_TIME} left out" in text
    assert f"The {report.MAX_MISSES} most frequent of 50 missed keys (10 left out" in text
    # Keys in numeric order (B, then N), labelled by the two fields that vary; dtype said once.
    wide = page[page.index(f"{builders.WIDE_KERNEL} &middot;") :]
    wide = wide[: wide.index("<h3", 10)]
    assert "Every key has q.dtype=torch.bfloat16" in _text(wide) and "tuning key: B, N" in _text(wide)
    keys = [tuple(map(int, k)) for k in re.findall(r"<tr><td>B=(\d+) N=(\d+)</td>", wide)]
    assert len(keys) == len(set(keys)) > 30 and keys == sorted(keys)
    assert keys[0] == (1, 128) and keys[-1][0] == 160  # spread over all of them, first and last B
    # Config labels unique within each drawn group: one label per config row of its heat map.
    for fig in re.findall(r'<figure class="plot" data-title="heatmap [^"]*">(.*?)</figure>', page, re.S):
        firsts = {html.unescape(t).split("\n")[0] for t in re.findall(r"<title>([^<]*)</title>", fig)}
        firsts = {f for f in firsts if not f.startswith(("stored winner", "key "))}
        assert len(firsts) == 5, firsts  # the store's 5 configs, 3 of them "BLOCK=64 w4 s3"
    assert "BLOCK=64 w4 s3 maxnreg=128 num_ctas=1" in text and "BLOCK=64 w4 s3 maxnreg=None num_ctas=2" in text
    # Hover text: exact ms, config, key and host in every timed cell.
    assert re.search(r"<title>BLOCK=\S+ w\d s3 [^<]*\nkey B=1 N=128 q.dtype=torch.bfloat16\n[\d.]+ ms = [\d.]+x", page)
    # The grey column explained: every config failed for N=16384.
    assert re.search(r"Every config failed for \d+ drawn key\(s\), a grey column: B=\d+ N=16384,", text)
    # Every status in the heat maps' legend, pruned included; the white cells said too.
    legend = _svg_texts(page)
    assert {"OOR: out of resources", "pr: pruned", "not timed for that key"} <= set(legend)
    # Misses: the same-named kernels apart, the last host to miss, readable keys, UTC without microseconds.
    assert "alpha.attn.decode" in text and "beta.attn.decode" in text
    assert "miss-last" in text and "miss-first" not in text
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", text) and not re.search(r":\d\d\.\d{6}", text)
    assert '[["N"' not in page
    # Layout at 1400 px: no horizontal page scroll; wide figures scroll inside their own box.
    assert p["overflow"] <= 1400, p["overflow"]
    assert all(right <= 1400 for _, right, _ in p["figures"]), p["figures"]


LONG = "B=4096 N=131072 q.dtype=torch.bfloat16 kv.dtype=torch.float8_e4m3fn"[:60]  # labels.py's longest


@pytest.mark.parametrize("n", [1, 2, 5, 40])
def test_every_figure_is_laid_out_whatever_its_labels_length(n):
    """A few rows with long labels (a kernel with 2 configs, keys with dtypes) collapsed the plot:
    matplotlib gave up its layout and `tunecache report` printed its UserWarning to the terminal."""
    import warnings
    from datetime import datetime, timedelta

    from tunecache.report import plots

    keys = [f"{LONG[:-3]}{i:03d}" for i in range(n)]
    configs = [f"BLOCK_M={16 << i} BLOCK_N=64 num_warps=4 num_stages=3 maxnreg=None"[:60] for i in range(min(n, 3))]
    day = datetime(2026, 12, 1)
    figures = {
        "heatmap": lambda: plots.heatmap(
            configs, keys, [[1.0 + 0.1 * j] * n for j in range(len(configs))], [0] * n, {(0, 0): "out_of_resources"}
        ),
        "winner_line": lambda: plots.winner_line(keys, [0.01 * (1 + i) ** 2 for i in range(n)], ["c1", "c2"] * n),
        "saved_bars": lambda: plots.saved_bars(keys, [1.0] * n, [2.0] * n),
        "saved_over_time": lambda: plots.saved_over_time(
            {k: ([day, day + timedelta(days=1)], [1.0, 2.0]) for k in keys[:3]}
        ),
        "miss_bars": lambda: plots.miss_bars(keys, {r: [1] * n for r in plots.MISS_REASONS}),
        "fleet_strip": lambda: plots.fleet_strip(keys, [[1.0, 1.1]] * n, 0.1, {keys[0]}, [1.05] * n),
    }
    collapsed = []
    for name, draw in figures.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            svg = draw()
        assert svg.startswith("<svg"), name
        collapsed += [name for w in caught if "constrained_layout not applied" in str(w.message)]
    assert collapsed == [], collapsed


def test_no_heat_map_label_overlaps_another_on_a_large_store(monkeypatch):
    """Issue 44.5: with the most keys a heat map draws, each cell's status code ("OOR") was wider than
    its cell, so a config that failed on adjacent keys drew one run of overlapping codes. Every text
    of the figure (codes, tick labels, legend, colour bar) laid out as the page's SVG is, none
    overlapping another, and each code inside its cell."""
    import matplotlib.text
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from tunecache.report import plots

    drawn, real = [], plots._svg
    monkeypatch.setattr(plots, "_svg", lambda fig, titles=None: (drawn.append(fig), real(fig, titles))[1])
    nk, nc = report.MAX_KEYS, report.MAX_CONFIGS
    keys = [f"B={1 << (i % 12)} N={128 * (1 + i // 12)}" for i in range(nk)]
    configs = [f"BLOCK_M={16 << (i % 5)} BLOCK_N={32 << (i % 3)} w{4 << (i % 2)} s{2 + i % 3} #{i}" for i in range(nc)]
    statuses = [*plots.FAILED_CODES, "unheard_of"]
    failed = {(i, j): "out_of_resources" for i in range(nc - 6, nc - 3) for j in range(nk)}  # too big on every key
    failed.update({(i, j): statuses[(i + j) % len(statuses)] for i in range(nc - 3, nc) for j in range(nk)})
    rel = [[1.0 + 0.02 * ((i * 7 + j) % 50) for j in range(nk)] for i in range(nc)]
    plots.heatmap(configs, keys, rel, [j % (nc - 6) for j in range(nk)], failed)
    (fig,) = drawn
    FigureCanvasAgg(fig)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    texts = list(
        {id(t): t for t in fig.findobj(matplotlib.text.Text) if t.get_visible() and t.get_text().strip()}.values()
    )
    boxes = [(t.get_text().replace("\n", " ")[:24], t.get_window_extent(renderer)) for t in texts]
    overlaps = [
        (a, b)
        for n, (a, ba) in enumerate(boxes)
        for b, bb in boxes[n + 1 :]
        if min(ba.x1, bb.x1) - max(ba.x0, bb.x0) > 0.5 and min(ba.y1, bb.y1) - max(ba.y0, bb.y0) > 0.5
    ]
    assert overlaps == [], overlaps[:10]
    ax = fig.axes[0]
    codes = [t for t in ax.texts if t.get_text()]
    assert len(codes) == len(failed)
    for t in codes:
        x, y = t.get_position()
        (x0, y0), (x1, y1) = ax.transData.transform([(x - 0.5, y - 0.5), (x + 0.5, y + 0.5)])
        box = t.get_window_extent(renderer)
        assert min(x0, x1) <= box.x0 and box.x1 <= max(x0, x1), (t.get_text(), box, (x0, x1))
        assert min(y0, y1) <= box.y0 and box.y1 <= max(y0, y1), (t.get_text(), box, (y0, y1))
