#!/bin/bash
# Runs the backend tests with the CUDA backend required, on a GPU machine without cargo.
#
# Here (any machine with Rust):
#   cargo test -p runtime --features cuda --test backend --no-run   # prints the test binary
#   mkdir -p .gpu && strip -o .gpu/backend target/debug/deps/backend-<hash>
#   cp runtime/scripts/cuda_device_check.sh .gpu/
# There:  bash .gpu/cuda_device_check.sh
# cudarc (built for CUDA 12.8) loads libcublas.so by its unversioned name among others; a
# CUDA 13 install may only have libcublas.so.13, so the script links it under that name.
cd "$(dirname "$0")" || exit 1
nvidia-smi -L
CUBLAS=$(ldconfig -p | grep -o '/[^ ]*libcublas\.so[.0-9]*' | head -1)
[ -z "$CUBLAS" ] && CUBLAS=$(find / -xdev -name 'libcublas.so*' 2>/dev/null | grep -v Lt | head -1)
echo "cublas: $CUBLAS"
mkdir -p /tmp/culib && ln -sf "$CUBLAS" /tmp/culib/libcublas.so
export LD_LIBRARY_PATH="/tmp/culib:$(dirname "$CUBLAS"):$LD_LIBRARY_PATH"
PLAIT_REQUIRE_CUDA=1 timeout 240 ./backend --nocapture --test-threads 1 2>&1
echo "rc=$?"
