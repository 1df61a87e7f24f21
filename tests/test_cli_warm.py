"""``tunecache warm MODULE`` as a newcomer runs it (issue 26): from the directory that holds the
module, on kernels that know nothing of tunecache, in a real process (what the user sees on stderr,
the exit code, what lands in the store)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from realcli import one_line_error, tc

# Plain ``@triton.autotune`` with Triton's own benchmarker, and a library's Autotuners (libmod: its
# own subclass, one built directly, ``from triton import autotune``): none of them names tunecache.
PLAIN = """
    import torch, triton
    import triton.language as tl
    import libmod

    @triton.autotune(configs=[triton.Config({"BLOCK": b}) for b in (16, 32)], key=["N"])
    @triton.jit
    def plain_add(x, y, out, N, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < N
        tl.store(out + offs, tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m), mask=m)

    def warmup(progress=None):
        for n in (32, 64):
            x, y, out = torch.arange(n, dtype=torch.float32), torch.ones(n), torch.empty(n)
            plain_add[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, out, n)
            assert torch.equal(out, x + 1)
            assert libmod.run_all(n)
            if progress:
                progress(n)
"""

# The console script's sys.path: no current directory on it (unlike ``python -m``, which adds it).
SCRIPT_PATH = {"PYTHONSAFEPATH": "1"}


def write(tmp_path: Path, name: str, source: str) -> None:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))


def kernels_in(url: str) -> dict[str, int]:
    r = tc("--url", url, "ls", "--json")
    assert r.returncode == 0, r.stderr
    out: dict[str, int] = {}
    for row in json.loads(r.stdout):
        out[row["kernel"]] = out.get(row["kernel"], 0) + 1
    return out


def test_warm_installs_for_plain_and_library_autotuners_of_a_module_in_the_current_directory(tmp_path, sqlite_url):
    write(tmp_path, "plainwarm", PLAIN)
    r = tc("--url", sqlite_url, "warm", "plainwarm", cwd=tmp_path, env=SCRIPT_PATH)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    assert "warmed plainwarm" in r.stdout and "0 configs benchmarked" not in r.stdout, r.stdout
    tuned = kernels_in(sqlite_url)
    assert tuned.get("plainwarm.plain_add") == 2, tuned  # plain @triton.autotune: tuned into the store
    assert {"libmod.lib_kernel", "libmod._twice", "libmod.plain"} <= set(tuned), tuned  # a library's own
    # A second warm of the same module is served by the store: nothing benchmarked again.
    r = tc("--url", sqlite_url, "warm", "plainwarm", "--json", cwd=tmp_path, env=SCRIPT_PATH)
    assert r.returncode == 0, r.stderr[-3000:]
    stats = json.loads(r.stdout)["stats"]
    assert stats["benchmarks"] == 0 and stats["hits"] >= 8, stats


def test_warm_of_a_module_that_fails_to_import_is_one_line_naming_it(tmp_path, sqlite_url):
    write(tmp_path, "brokenimport", 'raise RuntimeError("weights not found at /models/x")\n')
    line = one_line_error(tc("--url", sqlite_url, "warm", "brokenimport", cwd=tmp_path, env=SCRIPT_PATH))
    assert "brokenimport" in line and "RuntimeError" in line and "weights not found" in line, line
    write(tmp_path, "badsyntax", "def warmup(:\n")
    line = one_line_error(tc("--url", sqlite_url, "warm", "badsyntax", cwd=tmp_path, env=SCRIPT_PATH))
    assert "badsyntax" in line and "SyntaxError" in line, line
    line = one_line_error(tc("--url", sqlite_url, "warm", "no_such_module_xyz", cwd=tmp_path, env=SCRIPT_PATH))
    assert "no_such_module_xyz" in line, line


def test_warm_whose_warmup_raises_is_one_line_naming_the_module_and_the_error(tmp_path, sqlite_url):
    write(tmp_path, "badwarm", 'def warmup():\n    raise RuntimeError("CUDA out of memory")\n')
    line = one_line_error(tc("--url", sqlite_url, "warm", "badwarm", cwd=tmp_path, env=SCRIPT_PATH))
    assert "badwarm" in line and "warmup()" in line and "RuntimeError: CUDA out of memory" in line, line
