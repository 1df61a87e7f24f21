"""The report's fleet section: each host against its peers, overall and per kernel, with the
verdicts ``tunecache hosts`` prints (:mod:`tunecache.report.fleet`)."""

from __future__ import annotations

from typing import Any

from tunecache.report import fleet
from tunecache.report.html import escape, figure, spread, table

MAX_DOTS = 1500  # fleet plot: dots per host

MAX_KERNEL_ROWS = 500  # fleet: host x kernel verdict rows listed


def _evidence_table(worst: list[fleet.Evidence]) -> str:
    if not worst:
        return "<p>No key where it was slower.</p>"
    rows = [[w.kernel, w.key_json, w.target, f"{w.ratio:.2f}x", f"{w.host_ms:.4g}", f"{w.peers_ms:.4g}"] for w in worst]
    return table(["kernel", "key", "target", "ratio", "host ms", "peers ms"], rows)


def fleet_section(a: fleet.FleetAnalysis, plots: Any, max_keys: int) -> str:
    """The fleet's verdicts: the same :func:`tunecache.report.fleet.verdict` as ``tunecache hosts``."""
    if not a.hosts:
        return (
            "<p>No key was timed by more than one host yet (hosts record their own timings in the "
            "<code>measurements</code> table whenever they benchmark): nothing to compare.</p>"
        )
    out = [
        f"<p>{a.keys_compared} keys timed by more than one host. A key's ratio: the host's median time over "
        "the configs it shares with its peers, over the peers' median time on those configs; a host's ratio: "
        f"the median of its per-key ratios. Outlier: above {1 + a.threshold:.2f}x over at least {a.min_keys} "
        "keys, overall or on one kernel; fewer keys: too few to judge.</p>"
    ]
    if a.keys_compared >= max_keys:
        out.append(
            f'<p class="note">Sampled: the first {max_keys} keys in digest order (a hash: an unbiased sample).</p>'
        )
    for h in a.outliers:
        when = fleet.measured_text(h.first_measured, h.last_measured)
        if h.outlier:
            out.append(
                f'<p class="bad"><b>Outlier: {escape(h.host)}</b> ({escape(", ".join(h.gpus))}): '
                f"{escape(h.verdict.ratio_text())} over {h.keys} keys; slower by more than {a.threshold:.0%} on "
                f"{h.slower_share:.0%} of them; timings measured {escape(when)} UTC. "
                "Keys where it was slower, worst first:</p>"
            )
            out.append(_evidence_table(h.worst))
            if len(h.slow_kernels) > 1:
                names = ", ".join(k.kernel for k in h.slow_kernels)
                out.append(f"<p>{escape(h.host)} is an outlier on each of: {escape(names)}.</p>")
            continue
        for k in h.slow_kernels:
            out.append(
                f'<p class="bad"><b>Outlier on {escape(k.kernel)}: {escape(h.host)}</b>: '
                f"{escape(k.verdict.ratio_text())} over {k.verdict.keys} keys; timings measured "
                f"{escape(fleet.measured_text(k.first_measured, k.last_measured))} UTC. Worst keys:</p>"
            )
            out.append(_evidence_table(k.worst))
    for h in a.too_few:
        out.append(
            f'<p class="note"><b>Too few keys to judge: {escape(h.host)}</b>: {h.keys} of the {a.min_keys} keys needed '
            f"({escape(h.verdict.ratio_text())}; timings measured "
            f"{escape(fleet.measured_text(h.first_measured, h.last_measured))} UTC).</p>"
        )
    if not a.outliers and not a.too_few:
        out.append(
            f'<p class="good">No outlier: every host shared {a.min_keys}+ keys with its peers and none is more than '
            f"{a.threshold:.0%} slower, overall or on one kernel.</p>"
        )
    elif not a.outliers:
        out.append(f"<p>No outlier among the {len(a.hosts) - len(a.too_few)} hosts that could be judged.</p>")
    if a.excluded:
        out.append(
            "<p>Peers' baselines leave out the flagged hosts ("
            + escape(", ".join(sorted(a.excluded)))
            + ") wherever another host timed the same config: a slow peer would make healthy hosts look faster "
            "than 1.0x. A healthy host below 1.0x shared those keys with a flagged host only.</p>"
        )
    names = [h.host for h in a.hosts]
    dots = {n: spread(a.ratios[n], MAX_DOTS) for n in names}  # the medians and the table use every key
    if any(len(dots[n]) < len(a.ratios[n]) for n in names):
        out.append(f'<p class="note">The plot draws at most {MAX_DOTS} keys per host; its bars use them all.</p>')
    out.append(
        figure(
            plots.fleet_strip(
                names,
                [dots[n] for n in names],
                a.threshold,
                {h.host for h in a.outliers},
                [h.median_ratio for h in a.hosts],
            ),
            "fleet",
        )
    )
    rows = []
    for h in a.hosts:
        v = h.verdict
        slow = ", ".join(k.kernel for k in h.slow_kernels)
        rows.append(
            [
                h.host,
                ", ".join(h.gpus),
                v.keys,
                f"{v.ratio:.3f}x",
                f"{v.host_ms:.4g}",
                f"{v.peers_ms:.4g}",
                f"{h.slower_share:.0%}",
                fleet.measured_text(h.first_measured, h.last_measured),
                v.text(),
                slow,
            ]
        )
    headers = ["host", "GPU", "keys shared", "ratio", "host ms", "peers ms", "keys slower than threshold"]
    hosts_table = table([*headers, "measured (UTC)", "verdict", "outlier on kernels"], rows)
    out.append(f'<div id="fleet-hosts">{hosts_table}</div>')
    per_kernel = [(h, k) for h in a.hosts for k in h.kernels]
    krows = [
        [
            k.kernel,
            h.host,
            k.verdict.keys,
            f"{k.verdict.ratio:.3f}x",
            f"{k.verdict.host_ms:.4g}",
            f"{k.verdict.peers_ms:.4g}",
            fleet.measured_text(k.first_measured, k.last_measured),
            k.verdict.text(),
        ]
        for h, k in sorted(per_kernel, key=lambda hk: (hk[1].kernel, hk[0].host))[:MAX_KERNEL_ROWS]
    ]
    out.append(f"<details><summary>Verdicts per kernel and host ({len(per_kernel)})</summary>")
    if len(per_kernel) > len(krows):
        out.append(f'<p class="note">The first {len(krows)} of {len(per_kernel)} rows: use --kernel to see one.</p>')
    kheaders = ["kernel", "host", "keys", "ratio", "host ms", "peers ms", "measured (UTC)", "verdict"]
    out.append(table(kheaders, krows) + "</details>")
    return "".join(out)
