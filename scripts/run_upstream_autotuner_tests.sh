#!/usr/bin/env bash
# Issue 37: Triton's own test_autotuner.py, run twice with pytest: plain, then with tunecache's
# start-up hook on (TUNECACHE_INSTALL=1, a throwaway SQLite store and Triton cache). Prints both
# summaries; exits 1 if the hooked run fails a test that the plain run passes (a tunecache bug),
# 2 if a run could not be made (nothing collected, or the hook did not install tunecache).
#
#   scripts/run_upstream_autotuner_tests.sh            # on a GPU machine (device "cuda")
#   scripts/run_upstream_autotuner_tests.sh --cpu      # this CPU machine: TRITON_INTERPRET=1, device "cpu"
#   scripts/run_upstream_autotuner_tests.sh [--cpu] [-- PYTEST ARGS...]   # e.g. -- -k restore
#
# Environment: PYTHON (default python3), UPSTREAM_TEST (default .upstream/test_autotuner.py),
# OUT (a folder: both runs' logs and JUnit XML are copied there, as the device's $OUT).
#
# The upstream file is third-party code and is NOT in git: it lives, git-ignored, in .upstream/ (add
# "/.upstream/" to .git/info/exclude; the device tool carries it when `carry` names ".upstream").
# Where it comes from (the public-code index of the search tool: read_file with this repo, commit
# and path gives it back, 18219 characters, sha256 87a282b500c74f5011da216626e4b12248a792bb19615053891a80a76105f977):
#   repo   peter941221/triton (a fork of triton-lang/triton)
#   commit 576fd024ea1d89fc90b4c396fab93bc246b97ae6
#   path   python/test/unit/runtime/test_autotuner.py
# Why that version for Triton 3.6.0: the v3.6.0 tag's file could not be had (triton-lang/triton is
# too big to fetch; its stored version is a later main). Of the ~30 stored copies, this is the one
# that uses exactly what 3.6.0's autotuner has: it tests AutotunerError's "No valid autotuner configs
# after pruning" (absent from 3.4.0), and none of what came after 3.6.0: the default pre/post hooks
# skipping None (test_reset_to_zero[src_is_none], test_restore_with_none: 3.6.0's hooks call
# kwargs[name].zero_()/.clone() on None), knobs.autotuning.listener, a fractional top_k kept at >= 1,
# is_rubin, test_dtype_cache_results. Newer copies (triton-lang/triton main, triton-lang/triton-windows
# at b5375536 on 3.7.0, intel/intel-xpu-backend-for-triton, njriasan/triton) have those; older ones
# (anthropics/triton, htyu/triton-1) lack test_prune_all_configs' AutotunerError or use N_STAGES=100.
#
# The GPU machine uses this checkout from source: tunecache is laid out here in a throwaway site
# folder as an install would lay it (tunecache/, with migrations/ and kernels/ as
# tunecache.migrations and tunecache.kernels, _tunecache_startup.py and tunecache-install.pth), and the
# hooked run processes that folder with site.addsitedir before pytest starts: the .pth line the
# interpreter runs at start in a real install (a folder on PYTHONPATH never runs its .pth files).
# Dependencies missing from the interpreter (sqlalchemy, alembic, mako, orjson, platformdirs) are
# installed from the carried .whl/ folder, as for the other GPU runs (docs/benchmarks/).
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
TEST=${UPSTREAM_TEST:-$ROOT/.upstream/test_autotuner.py}
DEVICE=cuda
if [[ ${1:-} == --cpu ]]; then
    DEVICE=cpu
    shift
fi
if [[ ${1:-} == -- ]]; then shift; fi
EXTRA=("$@")

if [[ ! -f $TEST ]]; then
    echo "no upstream test file at $TEST: see the comment at the top of $0 for where to get it" >&2
    exit 2
fi

TMP=$(mktemp -d -t upstream-autotuner.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
RUN=$TMP/run SITE=$TMP/site DEPS=$TMP/deps
mkdir -p "$RUN" "$SITE/tunecache" "$DEPS"

# --- dependencies -------------------------------------------------------------------------------
if ! "$PY" -c 'import sqlalchemy, alembic, orjson, platformdirs, filelock' 2>/dev/null; then
    shopt -s nullglob
    wheels=()
    for name in sqlalchemy alembic mako orjson platformdirs filelock; do
        wheels+=("$ROOT"/.whl/"$name"-*.whl "$ROOT"/.whl/"${name^}"-*.whl)
    done
    shopt -u nullglob
    if ((${#wheels[@]} == 0)); then
        echo "tunecache's dependencies are missing and $ROOT/.whl has no wheels for them" >&2
        exit 2
    fi
    "$PY" -m pip install --quiet --no-deps --no-index --target "$DEPS" "${wheels[@]}" || exit 2
fi

# --- tunecache from this checkout, laid out as installed ----------------------------------------
cp -R "$ROOT/tunecache/." "$SITE/tunecache/"
for link in migrations kernels; do  # a source tree may link them (the GPU runs do): the folders replace them
    if [[ -L $SITE/tunecache/$link ]]; then rm "$SITE/tunecache/$link"; fi
done
cp -R "$ROOT/migrations" "$SITE/tunecache/migrations"
cp -R "$ROOT/kernels" "$SITE/tunecache/kernels"
cp "$ROOT/_tunecache_startup.py" "$ROOT/tunecache-install.pth" "$SITE/"
find "$SITE" -name __pycache__ -prune -exec rm -rf {} +

# --- the upstream file, with the fixtures its own conftest gives ----------------------------------
cp "$TEST" "$RUN/test_autotuner.py"
printf '[pytest]\n' >"$RUN/pytest.ini"
cat >"$RUN/conftest.py" <<'EOF'
"""The fixtures of Triton's python/test/conftest.py that test_autotuner.py uses (device,
fresh_knobs); in the hooked run, a check that tunecache's start-up hook installed it, and what
tunecache saw of each test's kernels."""
import os

import pytest

HOOKED = os.environ.get("UPSTREAM_EXPECT_TUNECACHE") == "1"
_seen = {}

if os.environ.get("TRITON_INTERPRET") == "1":
    # CPU only (--cpu): triton.testing.do_bench needs a GPU driver ("0 active drivers"), so the
    # tests' own do_bench (which calls it) gets a wall-clock one, in both runs alike. A test that
    # passes no do_bench still reaches the driver's benchmarker in the plain run.
    import time

    import triton.testing

    def _cpu_do_bench(fn, warmup=25, rep=100, grad_to_none=None, quantiles=None, return_mode="mean"):
        times = []
        for _ in range(3):
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
        ms = sorted(times)[1]
        return [ms] * len(quantiles) if quantiles else ms

    triton.testing.do_bench = _cpu_do_bench


def pytest_addoption(parser):
    parser.addoption("--device", action="store", default=os.environ.get("UPSTREAM_DEVICE", "cuda"))


@pytest.fixture
def device(request):
    return request.config.getoption("--device")


@pytest.fixture
def fresh_knobs():
    from triton._internal_testing import _fresh_knobs_impl

    fresh_function, reset_function = _fresh_knobs_impl()
    try:
        yield fresh_function()
    finally:
        reset_function()


def pytest_report_header(config):
    import triton

    lines = [f"triton {triton.__version__} ({os.path.dirname(triton.__file__)}), device {config.getoption('--device')}"]
    if "tunecache" in __import__("sys").modules:
        import tunecache
        from tunecache.tuner import basepatch

        lines.append(f"tunecache {os.path.dirname(tunecache.__file__)}: Triton's Autotuner patched: {basepatch.patched()}")
    return lines


def pytest_sessionstart(session):
    import sys

    import triton  # noqa: F401  (the start-up hook installs tunecache as Triton is imported)

    if HOOKED:
        from tunecache.tuner import basepatch

        if not basepatch.patched():
            pytest.exit("TUNECACHE_INSTALL=1 but tunecache's start-up hook did not patch Triton's Autotuner", returncode=3)
    elif "tunecache" in sys.modules:
        pytest.exit("the plain run imported tunecache", returncode=3)


@pytest.fixture(autouse=True)
def _tunecache_counts(request):
    if not HOOKED:
        yield
        return
    import tunecache

    before = tunecache.stats()
    yield
    after = tunecache.stats()
    _seen[request.node.nodeid] = {k: after[k] - before[k] for k in ("hits", "misses", "benchmarks") if after[k] != before[k]}


def pytest_terminal_summary(terminalreporter):
    if not HOOKED:
        return
    import tunecache

    terminalreporter.section("what tunecache saw (counter deltas per test)")
    for nodeid, delta in _seen.items():
        terminalreporter.write_line(f"{nodeid}: {delta or 'nothing (no tuned launch reached tunecache)'}")
    cov = tunecache.coverage()
    terminalreporter.write_line(f"coverage(): {len(cov)} kernel names, "
                                f"{sum(1 for v in cov.values() if v.get('covered'))} covered")
EOF

# --- the two runs ---------------------------------------------------------------------------------
# Inherited TUNECACHE_* settings would make the runs depend on the caller's environment.
unset_tc=()
while IFS= read -r name; do unset_tc+=(-u "$name"); done < <(compgen -e | grep '^TUNECACHE_' || true)
common=(env "${unset_tc[@]}" -u UPSTREAM_EXPECT_TUNECACHE UPSTREAM_DEVICE="$DEVICE" PYTHONDONTWRITEBYTECODE=1)
if [[ $DEVICE == cpu ]]; then common+=(TRITON_INTERPRET=1); fi
pytest_args=(-p no:cacheprovider -rfEsx -q "${EXTRA[@]}")

cd "$RUN" || exit 2
echo "=== plain: Triton's Autotuner ($TEST)"
"${common[@]}" TRITON_CACHE_DIR="$TMP/triton-plain" PYTHONPATH="$DEPS" \
    "$PY" -m pytest "${pytest_args[@]}" --junitxml="$TMP/plain.xml" test_autotuner.py 2>&1 | tee "$TMP/plain.log"
plain_rc=${PIPESTATUS[0]}

echo
echo "=== hooked: TUNECACHE_INSTALL=1 through tunecache-install.pth (tunecache from $ROOT)"
"${common[@]}" UPSTREAM_EXPECT_TUNECACHE=1 TUNECACHE_INSTALL=1 TUNECACHE_URL="sqlite:///$TMP/store.sqlite3" \
    TRITON_CACHE_DIR="$TMP/triton-hooked" PYTHONPATH="$SITE:$DEPS" \
    "$PY" -c 'import site, sys; site.addsitedir(sys.argv[1]); import pytest; sys.exit(pytest.main(sys.argv[2:]))' \
    "$SITE" "${pytest_args[@]}" --junitxml="$TMP/hooked.xml" test_autotuner.py 2>&1 | tee "$TMP/hooked.log"
hooked_rc=${PIPESTATUS[0]}

if [[ -n ${OUT:-} ]]; then
    mkdir -p "$OUT" && cp "$TMP"/plain.log "$TMP"/hooked.log "$OUT"/ && cp "$TMP"/*.xml "$OUT"/ 2>/dev/null
fi

echo
echo "=== comparison (pytest exit codes: plain $plain_rc, hooked $hooked_rc)"
"$PY" - "$TMP/plain.xml" "$TMP/hooked.xml" <<'EOF'
import sys
import xml.etree.ElementTree as ET


def outcomes(path):
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    got = {}
    for case in root.iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        tags = {child.tag for child in case}
        got[name] = "failed" if tags & {"failure", "error"} else "skipped" if "skipped" in tags else "passed"
    return got


plain, hooked = outcomes(sys.argv[1]), outcomes(sys.argv[2])
if not plain or hooked is None:
    print("a run produced no results: see its log above")
    sys.exit(2)
for label, got in (("plain", plain), ("hooked", hooked)):
    counts = {k: sum(1 for v in got.values() if v == k) for k in ("passed", "failed", "skipped")}
    print(f"{label:7s} {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped (of {len(got)})")
both = sorted(n for n in plain if plain[n] == "failed" and hooked.get(n) == "failed")
broken = sorted(n for n in plain if plain[n] != "failed" and hooked.get(n) == "failed")
missing = sorted(n for n in plain if n not in hooked)
only_plain = sorted(n for n in plain if plain[n] == "failed" and hooked.get(n) not in (None, "failed"))
differ = sorted(n for n in plain if n in hooked and plain[n] != hooked[n] and n not in broken and n not in only_plain)
for title, names in (("failed in both runs (not tunecache's doing)", both),
                     ("failed only with the hook (tunecache breaks them)", broken),
                     ("missing from the hooked run", missing),
                     ("failed only in the plain run", only_plain),
                     ("other differences (plain -> hooked)", differ)):
    if names:
        print(f"{title}:")
        for n in names:
            extra = f"  ({plain[n]} -> {hooked.get(n)})" if title.startswith("other") else ""
            print(f"  {n}{extra}")
sys.exit(1 if broken or missing else 0)
EOF
