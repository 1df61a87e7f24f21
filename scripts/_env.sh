# Sourced by scripts/test and scripts/demo: create or reuse a venv with tunecache installed.
# TUNECACHE_VENV (default .venv) picks the venv; TRITON_VERSION pins Triton (default: newest allowed).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
VENV=${TUNECACHE_VENV:-$ROOT/.venv}
PY=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
  echo "==> creating $VENV" >&2
  "$PY" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip -q --disable-pip-version-check)
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "==> installing torch (CUDA machine)" >&2
    "${PIP[@]}" install torch
  else
    # Never a multi-GB CUDA build on a CPU machine: the CPU build (on this disk, or from the
    # index named by PIP_EXTRA_INDEX_URL / PIP_FIND_LINKS elsewhere).
    echo "==> installing the CPU build of torch" >&2
    "${PIP[@]}" install "torch==${TORCH_CPU_VERSION:-2.13.0}"
  fi
fi
extras=${TUNECACHE_EXTRAS:-test}
# The stamp names what was installed (the extras and the pinned Triton): a venv already holding it
# is not reinstalled at every start (a no-op pip install takes 15-50 s on a busy 2-core machine).
stamp="$VENV/.tunecache-installed"
# The .pth start-up hook is copied into site-packages at install: a change to it (or to setup.py,
# which ships it) needs a reinstall as much as a change of pyproject.toml does.
want="extras=$extras triton=${TRITON_VERSION:-any}"
stale=""
for f in pyproject.toml setup.py tunecache-install.pth; do [ "$f" -nt "$stamp" ] && stale=1; done
if [ ! -f "$stamp" ] || [ -n "$stale" ] || [ "$(cat "$stamp")" != "$want" ]; then
  # One editable install at a time in this checkout: scripts/test makes its three venvs at once, and
  # each install writes tunecache.egg-info here.
  exec 9>"$ROOT/.venv-install.lock"
  flock 9
  echo "==> installing tunecache[$extras] (editable)" >&2
  if [ -n "${TRITON_VERSION:-}" ]; then
    "${PIP[@]}" install -e ".[$extras]" "triton==$TRITON_VERSION"
  else
    "${PIP[@]}" install -e ".[$extras]"
  fi
  echo "$want" >"$stamp"
  flock -u 9
  exec 9>&-
fi
export PATH="$VENV/bin:$PATH"
