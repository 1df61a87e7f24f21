#!/usr/bin/env bash
# The GPU runs that issues 35-37 still need, each part one device call (the device tool's run):
#
#   run(command="bash scripts/gpu_verify.sh launch", carry=[".whl", ".upstream"])        # ~3 min
#   run(command="bash scripts/gpu_verify.sh max-autotune", carry=[".whl"])               # ~4 min
#   run(command="bash scripts/gpu_verify.sh library", carry=[".whl"])                    # ~6 min
#   run(command="bash scripts/gpu_verify.sh one-host-per-gpu", carry=[".whl"], kind=...)  # 4+ GPUs
#
# launch        issue 37: Triton 3.6's own test_autotuner.py plain and under the start-up hook, the hit
#               path in and out of a CUDA graph capture (tests/test_gpu.py), the launch overhead beside
#               plain @jit and stock (bench_gpu.py's overhead phase); issue 36: the sparse kernel's
#               rolling upgrade (a fresh host of either version compiles nothing it could be served)
# max-autotune  issue 35: four torch.compile hosts in max-autotune-no-cudagraphs, cold then warm, beside
#               four stock hosts started together (the same contention), checked against the targets
# library       issue 48: fla-core's restart against its second call and the floor, then profiled
# one-host-per-gpu  issues 35/36: default mode and the sparse kernel with one host per GPU (--gpus), so
#               that the ratios against a lone stock start carry no contention for one GPU
#
# Before the first call, here: ../shared/tools/device-wheels.sh fla-core einops cryptography cffi
# pycparser (the wheels into .whl/), and for `launch` .upstream/test_autotuner.py (where it comes from:
# scripts/run_upstream_autotuner_tests.sh). Each part writes one log per step and a tarball of the raw
# outputs to $OUT (the device tool brings back at most 8 files); record them in docs/gpu-runs and
# the figures in docs/benchmarks/ (the page of their subject, and a row of the index's table). Each
# step has its own time limit, so a slow one cannot eat the call's 10 minutes; a step's exit code is
# the last line of its log.
set -uo pipefail

part=${1:?usage: scripts/gpu_verify.sh launch|max-autotune|library|one-host-per-gpu}
OUT=${OUT:-/tmp/gpu-verify-out}
RAW=/tmp/gpu-verify-raw
mkdir -p "$OUT" "$RAW"
cd "$(dirname "$0")/.."

# The device machine's interpreter lacks tunecache's pure-Python dependencies: the carried wheels,
# into a site folder; tunecache from this checkout, laid out as an install lays it.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 2
ln -sfn ../migrations tunecache/migrations
ln -sfn ../kernels tunecache/kernels
python3 -m compileall -q -j 16 /tmp/site tunecache kernels scripts  # as pip does: no host pays for it
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/device.txt" 2>&1

step() {  # step NAME SECONDS COMMAND...: its output to $OUT/NAME.log (the tail) and $RAW
    local name=$1 limit=$2
    shift 2
    echo "=== $name ($limit s): $*"
    timeout "$limit" "$@" > "$RAW/$name.log" 2>&1
    echo "exit $?" >> "$RAW/$name.log"
    tail -n 40 "$RAW/$name.log" | tee "$OUT/$name.log"
}

case $part in
launch)
    step upstream 120 env OUT="$RAW/upstream" scripts/run_upstream_autotuner_tests.sh
    step capture 150 env TUNECACHE_TEST_GPU=1 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k "hit_path or capture or target_info or restart or out_of_resources"
    step overhead 90 env TC_BENCH_PHASES=overhead python3 scripts/bench_gpu.py all --out "$RAW/overhead"
    step upgrade 180 python3 scripts/bench_rollout.py "$RAW/upgrade" --workloads sparse --scenarios upgrade \
        --no-stock --buckets 64,16,8,1 --check
    ;;
max-autotune)
    step max-autotune 500 python3 scripts/bench_rollout.py "$RAW/max-autotune" --workloads inductor \
        --modes max-autotune-no-cudagraphs --scenarios cold,warm --seq 512 --stock-fleet --timeout 200 \
        --check --check-times
    ;;
library)
    # Issue 48, part 3: fla-core's restart, its first pass against its second call and against the
    # floor (every winner in place before the first pass), three rounds side by side, then a
    # profiled restart and a profiled floor: what the first pass still sets up.
    step library 560 python3 scripts/bench_library.py --out "$RAW/library" --no-pth --repeat 3 --timeout 150 \
        --profile --phases stock-cold,tunecache-first,tunecache-restart,tunecache-restart-floor,tunecache-restart-profiled,tunecache-restart-floor-profiled
    cp "$RAW/library/bench_library.json" "$OUT/" 2>/dev/null
    ;;
one-host-per-gpu)
    gpus=$(nvidia-smi -L | wc -l)
    step default-per-gpu 280 python3 scripts/bench_rollout.py "$RAW/default" --workloads inductor --modes default \
        --scenarios cold,warm --hosts "$gpus" --gpus "$gpus" --timeout 200 --check --check-times
    step sparse-per-gpu 280 python3 scripts/bench_rollout.py "$RAW/sparse" --workloads sparse \
        --scenarios cold,warm --hosts "$gpus" --gpus "$gpus" --check --check-times
    ;;
*)
    echo "unknown part: $part (launch, max-autotune, library or one-host-per-gpu)" >&2
    exit 2
    ;;
esac
tar czf "$OUT/raw.tar.gz" -C "$RAW" .
