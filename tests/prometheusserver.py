"""A private Prometheus server on loopback, for the metrics tests (tests/test_metrics.py).

``Prometheus(targets, rule_files).start()`` writes a scrape configuration into a fresh directory
under /tmp (its own TSDB there too), starts Debian's ``prometheus`` on a free loopback port,
scraping each target every second, and waits until it is ready; ``query`` asks its HTTP API;
``stop()`` ends that one process and removes the directory. ``ensure_installed()`` installs the
package when it is missing (``apt-get``, as root), as CI runs on a fresh machine; elsewhere it
raises, and the test fails rather than skips.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import debianpkg
from debianpkg import free_port


def ensure_installed() -> str:
    """The prometheus binary; installs Debian's package when it is missing. Raises RuntimeError."""
    return debianpkg.ensure_installed("prometheus")


def promtool() -> str:
    """Debian's promtool (it comes with the prometheus package)."""
    ensure_installed()
    path = debianpkg.found("promtool")
    if not path:
        raise RuntimeError("promtool not found beside prometheus")
    return path


class Prometheus:
    """One private Prometheus scraping ``targets`` (``host:port``) every second."""

    def __init__(self, targets: list[str], rule_files: list[Path] = ()) -> None:
        self.binary = ensure_installed()
        self.targets = targets
        self.rule_files = [str(p) for p in rule_files]
        self.port = free_port()
        self.base = Path(tempfile.mkdtemp(prefix="tunecache-prometheus-", dir="/tmp"))
        self.log = self.base / "prometheus.log"
        self.proc: subprocess.Popen | None = None

    def _write_config(self) -> Path:
        cfg = self.base / "prometheus.yml"
        cfg.write_text(
            json.dumps(  # JSON is YAML
                {
                    "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                    "rule_files": self.rule_files,
                    "scrape_configs": [
                        {"job_name": "tunecache", "scrape_timeout": "1s", "static_configs": [{"targets": self.targets}]}
                    ],
                },
                indent=1,
            )
        )
        return cfg

    def start(self, timeout: float = 60.0) -> Prometheus:
        cmd = [
            self.binary,
            f"--config.file={self._write_config()}",
            f"--storage.tsdb.path={self.base / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--log.level=warn",
        ]
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"prometheus not ready in {timeout:.0f} s: {self.log.read_text()[-2000:]}")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def api(self, path: str, **params: str) -> Any:
        """``GET /api/v1/PATH?params``: its ``data`` (raises on an error status)."""
        q = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{q}", timeout=10) as r:
            body = json.loads(r.read())
        if body.get("status") != "success":
            raise RuntimeError(f"prometheus {path}: {body}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's vector: ``[{"metric": {...}, "value": [t, "v"]}, ...]``."""
        return self.api("query", query=expr)["result"]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        shutil.rmtree(self.base, ignore_errors=True)
