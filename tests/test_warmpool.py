"""The tests' warm pool (tests/warmpool.py) runs a child as ``python ARGV`` would, and runs it fresh
wherever a fork could differ: what is read at start-up, compared with what the server started with,
and a ``sitecustomize`` that only an interpreter's start runs."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import warmpool

PROBE = "import json, os, sys; print(json.dumps({'torch': 'torch' in sys.modules, 'cwd': os.getcwd(), 'argv': sys.argv[1:], 'x': os.environ.get('TC_X'), 'site': 'sitecustomize' in sys.modules and hasattr(sys.modules['sitecustomize'], 'MARK')})); sys.exit(3)"  # noqa: E501


def _probe(env: dict[str, str], cwd: str) -> tuple[dict, int]:
    p = warmpool.popen(["-c", PROBE, "a", "b"], env, stdout=subprocess.PIPE, text=True, cwd=cwd)
    out, _ = p.communicate(timeout=120)
    return json.loads(out), p.returncode


def test_a_pooled_child_runs_as_python_would_with_the_callers_env_cwd_argv_and_exit(tmp_path):
    got, rc = _probe({**os.environ, "TC_X": "given"}, str(tmp_path))
    assert got == {"torch": True, "cwd": str(tmp_path), "argv": ["a", "b"], "x": "given", "site": False}
    assert rc == 3


def test_a_start_up_variable_the_server_did_not_start_with_runs_fresh(tmp_path, monkeypatch):
    _probe(dict(os.environ), str(tmp_path))  # the server is up, started with this environment
    monkeypatch.setenv("TORCH_TC_TEST_ONLY", "1")  # changed here after the server started
    got, _ = _probe(dict(os.environ), str(tmp_path))
    assert got["torch"] is False, "forked from a server that started without the variable"
    monkeypatch.delenv("TORCH_TC_TEST_ONLY")
    assert _probe(dict(os.environ), str(tmp_path))[0]["torch"] is True


@pytest.mark.parametrize("value, warm", [("", True), ("0", False)])
def test_an_empty_hook_switch_is_unset_and_any_other_value_runs_fresh(tmp_path, value, warm):
    got, _ = _probe({**os.environ, "TUNECACHE_INSTALL": value}, str(tmp_path))
    assert got["torch"] is warm


def test_a_sitecustomize_on_the_childs_path_runs_fresh_and_is_run(tmp_path):
    (tmp_path / "sitecustomize.py").write_text("MARK = 1\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    got, _ = _probe(env, str(tmp_path))
    assert got["torch"] is False and got["site"] is True
