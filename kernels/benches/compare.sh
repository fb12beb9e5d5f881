#!/usr/bin/env bash
# Runs our sgemm benchmark and numpy's in the same session and prints the ratio.
# Usage: kernels/benches/compare.sh [python]   (python defaults to python3; it needs numpy:
# `python3 -m venv /tmp/np && /tmp/np/bin/pip install numpy`, then pass /tmp/np/bin/python).
set -euo pipefail
cd "$(dirname "$0")/../.."
py="${1:-python3}"
# Like for like: one thread each (plait runs one matmul thread per rank).
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}"
ours=$(cargo bench -q -p kernels --bench sgemm 2>/dev/null | grep 'GFLOP/s')
theirs=$("$py" kernels/benches/sgemm_numpy.py)
echo "$ours"
echo "$theirs"
a=$(sed -E 's/.*: ([0-9.]+) GFLOP.*/\1/' <<<"$ours")
b=$(sed -E 's/.*: ([0-9.]+) GFLOP.*/\1/' <<<"$theirs")
awk -v a="$a" -v b="$b" 'BEGIN { printf "ours / numpy = %.2f\n", a / b }'
