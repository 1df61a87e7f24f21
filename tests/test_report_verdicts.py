"""Issue 29: the fleet verdicts, the same on the page and from ``tunecache hosts`` (text and JSON):
a host with too few keys, a host slow on one kernel of four, timings older than ``--since``, and
the ``hosts`` table with cloud-length host names."""

from __future__ import annotations

import datetime as dt
import html
import json
import re
import statistics

import pytest
from click.testing import CliRunner

from tunecache.cli import main
from tunecache.problem.identity import problem_digest
from tunecache.problem.model import ConfigResult, Problem, utcnow
from tunecache.problem.target import Target
from tunecache.report import fleet, report
from tunecache.store.opening import open_store

H200 = Target("cuda", "sm90", "NVIDIA H200", 132, 232448, 32, "13000", "580.159.04", "13.0", "3.6")
CONFIGS = {"c16": 1.0, "c32": 1.5, "c64": 3.0}  # each config's time, x the key's size


def key_json(kernel: str, b: int) -> str:
    return json.dumps([["B", b], ["kernel", kernel]])


def put_host(s, host: str, kernel: str, keys: range, factor: float, when: dt.datetime | None = None) -> None:
    """``host`` times ``keys`` of ``kernel``, every config ``factor`` times the reference."""
    for b in keys:
        kj = key_json(kernel, b)
        p = Problem(problem_digest("src-" + kernel, H200, kj), kernel, "src-" + kernel, H200, kj, batch_bucket=b)
        rows = [
            ConfigResult(ch, {"kwargs": {"BLOCK": ch}, "num_warps": 4}, median_ms=b * t * factor, host=host)
            for ch, t in CONFIGS.items()
        ]
        for r in rows:
            r.measured_at = when
        s.put(Problem(**{**p.__dict__, "host": host, "configs": []}), rows)


def page_of(url: str, **filters) -> str:
    return report.render(open_store(url), report.Filters(**filters))


def page_verdicts(page: str) -> dict[str, str]:
    """host -> the verdict column of the page's fleet table."""
    table = page[page.index('<div id="fleet-hosts">') :]
    table = table[: table.index("</div>")]
    head = [html.unescape(h) for h in re.findall(r"<th>(.*?)</th>", table)]
    out = {}
    for row in re.findall(r"<tr>(.*?)</tr>", table)[1:]:
        cells = [html.unescape(c) for c in re.findall(r"<td>(.*?)</td>", row)]
        out[cells[0]] = cells[head.index("verdict")]
    return out


def cli_hosts(url: str, *args: str) -> tuple[int, list[str], int, dict]:
    """``hosts``: exit code, text lines, exit code with --json, the JSON."""
    r = CliRunner().invoke(main, ["--url", url, "hosts", *args])
    j = CliRunner().invoke(main, ["--url", url, "hosts", "--json", *args])
    assert r.exception is None or isinstance(r.exception, SystemExit), r.output
    return r.exit_code, r.output.splitlines(), j.exit_code, json.loads(j.output)


def text_table(lines: list[str]) -> dict[str, dict[str, str]]:
    """The ``hosts`` table: host -> column -> value (columns are two spaces or more apart)."""
    i = next(n for n, ln in enumerate(lines) if ln.startswith("HOST "))
    head = re.split(r"\s{2,}", lines[i].strip())
    out = {}
    for ln in lines[i + 1 :]:
        cells = re.split(r"\s{2,}", ln.strip())
        if len(cells) != len(head):
            break
        out[cells[0]] = dict(zip(head, cells))
    return out


def _text(page: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", " ", page))


def test_a_host_slow_on_too_few_keys_is_too_few_to_judge_on_page_and_cli(sqlite_url):
    """1.5x slower on all 6 of its keys: neither an outlier nor "No outlier" in green."""
    s = open_store(sqlite_url)
    put_host(s, "gpu-a", "models.k1", range(1, 21), 1.0)
    put_host(s, "gpu-b", "models.k1", range(1, 21), 1.02)
    put_host(s, "gpu-c", "models.k1", range(1, 7), 1.5)
    s.close()
    page = page_of(sqlite_url)
    text = _text(page)
    assert "No outlier: every host" not in text and 'class="good">No outlier' not in page
    assert "Too few keys to judge: gpu-c" in text and "6 of the 10 keys needed" in text
    ratio = 1.5 / statistics.median([1.0, 1.02])  # over its peers' median
    assert f"median of per-key ratios {ratio:.2f}x" in text  # its figures are shown, not hidden
    code, lines, jcode, j = cli_hosts(sqlite_url)
    assert code == jcode == 0  # not an outlier: cron is not paged
    table = text_table(lines)
    assert table["gpu-c"]["VERDICT"] == "too few keys (6 of 10 needed)"
    assert table["gpu-c"]["KEYS"] == "6" and table["gpu-c"]["RATIO"] == f"{ratio:.3f}x"
    hosts = {h["host"]: h for h in j["hosts"]}
    assert hosts["gpu-c"]["verdict"] == "too few keys" and hosts["gpu-c"]["keys"] == 6
    assert hosts["gpu-c"]["min_keys"] == 10 and j["too_few_keys"] == ["gpu-c"] and j["outliers"] == []
    assert hosts["gpu-c"]["gpus"] == ["NVIDIA H200"]
    # The page and the CLI say the same of every host.
    assert page_verdicts(page) == {h: row["VERDICT"] for h, row in table.items()}
    assert page_verdicts(page)["gpu-a"] == "ok"
    # With a lower bar the same host is judged, on both.
    page = report.render(open_store(sqlite_url), min_keys=5)
    code, lines, _, j = cli_hosts(sqlite_url, "--min-keys", "5")
    assert code == 1 and text_table(lines)["gpu-c"]["VERDICT"] == "OUTLIER" and j["outliers"] == ["gpu-c"]
    assert page_verdicts(page) == {h: row["VERDICT"] for h, row in text_table(lines).items()}
    assert "Outlier: gpu-c" in _text(page)


def test_a_host_slow_on_one_kernel_of_four_is_flagged_for_that_kernel(store_url):
    """1.35x on every key of one kernel, 1.0x on three others: ok overall, outlier on that kernel."""
    kernels = [f"models.k{i}" for i in range(1, 5)]
    s = open_store(store_url)
    for k in kernels:
        for host in ("gpu-a", "gpu-b"):
            put_host(s, host, k, range(1, 11), 1.0)
        put_host(s, "gpu-c", k, range(1, 11), 1.35 if k == "models.k3" else 1.0)
    s.close()
    page = page_of(store_url)
    text = _text(page)
    assert "Outlier on models.k3: gpu-c" in text
    assert "median of per-key ratios 1.35x" in text
    code, lines, jcode, j = cli_hosts(store_url)
    assert code == jcode == 1  # found: cron pages on it
    table = text_table(lines)
    assert table["gpu-c"]["VERDICT"] == "ok; OUTLIER on 1 kernel"
    assert any(ln.startswith("gpu-c: OUTLIER on models.k3: median of per-key ratios 1.35x") for ln in lines)
    assert page_verdicts(page) == {h: row["VERDICT"].split(";")[0] for h, row in table.items()}
    c = next(h for h in j["hosts"] if h["host"] == "gpu-c")
    assert j["outliers"] == ["gpu-c"] and c["verdict"] == "ok" and c["outlier_kernels"] == ["models.k3"]
    per_kernel = {k["kernel"]: k for k in c["kernels"]}
    assert set(per_kernel) == set(kernels)
    assert per_kernel["models.k3"]["verdict"] == "outlier" and per_kernel["models.k3"]["keys"] == 10
    assert per_kernel["models.k3"]["ratio"] == pytest.approx(1.35)
    assert [per_kernel[k]["verdict"] for k in kernels if k != "models.k3"] == ["ok"] * 3
    # Evidence: keys of k3 only (where it was slower), worst first, with both times.
    worst = per_kernel["models.k3"]["worst"]
    assert worst and all(w["kernel"] == "models.k3" and w["ratio"] > 1 for w in worst)
    assert [w["ratio"] for w in worst] == sorted((w["ratio"] for w in worst), reverse=True)
    for w in worst:
        assert w["host_ms"] / w["peers_ms"] == pytest.approx(w["ratio"], rel=1e-3)
    # The healthy hosts' baselines leave gpu-c out on k3: they read 1.0x there, not 1/1.35.
    a = next(h for h in j["hosts"] if h["host"] == "gpu-a")
    assert {k["kernel"]: k["ratio"] for k in a["kernels"]}["models.k3"] == pytest.approx(1.0)
    assert j["peers_exclude"] == {"gpu-c": ["models.k3"]}
    # The host's ms are the medians of its per-key times, the peers' those of theirs.
    times = sorted(b * CONFIGS["c32"] * 1.35 for b in range(1, 11))
    assert per_kernel["models.k3"]["host_ms"] == pytest.approx(statistics.median(times))


def test_timings_measured_before_since_do_not_flag_a_host(store_url):
    """gpu-b's 1.5x timings are 30 days old; gpu-a and gpu-c time the same keys today (so every
    problem was updated today: filtering on problem time would keep the old timings)."""
    old = utcnow() - dt.timedelta(days=30)
    s = open_store(store_url)
    put_host(s, "gpu-b", "models.k1", range(1, 13), 1.5, when=old)
    put_host(s, "gpu-a", "models.k1", range(1, 13), 1.0)
    put_host(s, "gpu-c", "models.k1", range(1, 13), 1.0)
    s.close()
    # Without --since the old timings count, and their dates are shown.
    page = page_of(store_url)
    code, lines, _, j = cli_hosts(store_url)
    assert code == 1 and j["outliers"] == ["gpu-b"] and page_verdicts(page)["gpu-b"] == "OUTLIER"
    assert text_table(lines)["gpu-b"]["MEASURED (UTC)"] == f"{old:%Y-%m-%d %H:%M}"
    assert f"timings measured {old:%Y-%m-%d %H:%M} UTC" in _text(page)
    b = next(h for h in j["hosts"] if h["host"] == "gpu-b")
    assert b["first_measured"][:16] == b["last_measured"][:16] == old.isoformat()[:16]
    # Since 7 days: gpu-b has no timing left; nobody is flagged, on the page or by the CLI.
    page = page_of(store_url, since=utcnow() - dt.timedelta(days=7))
    code, lines, jcode, j = cli_hosts(store_url, "--since", "7d")
    assert code == jcode == 0 and j["outliers"] == [], lines
    assert set(text_table(lines)) == set(page_verdicts(page)) == {"gpu-a", "gpu-c"}
    assert page_verdicts(page) == {"gpu-a": "ok", "gpu-c": "ok"}
    assert "gpu-b" not in _text(page[page.index("Fleet") : page.index('<div id="fleet-hosts">')])


def test_hosts_table_stays_aligned_with_cloud_length_host_names(sqlite_url):
    names = [
        "ip-10-0-12-34.us-west-2.compute.internal.example-cluster-a",
        "gpu-b",
        "gke-prod-a3-highgpu-8g-pool-7f3c2e1a-9xk2.c.project.internal",
    ]
    s = open_store(sqlite_url)
    for n, host in enumerate(names):
        put_host(s, host, "models.k1", range(1, 13), 1.0 + 0.3 * (n == 1))
    s.close()
    code, lines, _, j = cli_hosts(sqlite_url)
    head = next(ln for ln in lines if ln.startswith("HOST "))
    rows = [ln for ln in lines if ln.split(" ")[0] in names]
    assert len(rows) == 3 and {r.split(" ")[0] for r in rows} == set(names)
    gpu, verdict = head.index("GPU"), head.index("VERDICT")
    keys_end = head.index("KEYS") + len("KEYS")  # a right-aligned column
    for r in rows:
        assert r[gpu:].startswith("NVIDIA H200"), (head, r)
        assert r[verdict:].startswith(("OUTLIER", "ok")), (head, r)
        assert r[keys_end - 2 : keys_end] == "12" and r[keys_end] == " ", (head, r)
    assert text_table(lines)["gpu-b"]["VERDICT"] == "OUTLIER" and code == 1
    assert {h["host"] for h in j["hosts"]} == set(names)


def test_evidence_lists_only_keys_where_the_host_was_slower_worst_first():
    """A host faster than its peers on most keys and slower on a few: its evidence is those few,
    worst first, each ratio its two times' quotient; a key where it was faster is never evidence."""
    factors = [0.5, 0.6, 0.7, 0.8, 1.3, 1.1, 1.6, 0.9]  # gpu-c's time over its peers' on each key
    keys = []
    for i, f in enumerate(factors):
        rows = [("gpu-a", "c1", 2.0), ("gpu-b", "c1", 2.0), ("gpu-c", "c1", 2.0 * f)]
        meta = {"digest": f"d{i}", "kernel": "k", "key_json": f"[{i}]", "target": "H200"}
        keys.append(fleet.pack(meta, rows))
    a = fleet.judge(keys, min_keys=3)
    c = next(h for h in a.hosts if h.host == "gpu-c")
    want = sorted((f for f in factors if f > 1), reverse=True)
    assert [round(e.ratio, 6) for e in c.worst] == want
    assert all(e.host_ms / e.peers_ms == pytest.approx(e.ratio) for e in c.worst)
    assert c.verdict.status == "ok" and c.verdict.ratio == pytest.approx(statistics.median(factors))
