#!/usr/bin/env bash
# tests/gpu/run.sh - build the CUDA library and check it on a real GPU.
#
# Builds build/libringd_cuda.so (CUDA=1) and build/gpu_check, then runs the
# CUDA kernels against the CPU kernels (bitwise) and the cuBLAS helpers
# against a double-precision CPU computation, and prints device bandwidth
# next to a device-to-device copy. Needs a GPU and its driver; CI has none
# and does not run it. Exit status: 0 ok, 1 mismatch, 77 no GPU.
set -euo pipefail
cd "$(dirname "$0")/../.."
make -j"$(nproc)" CUDA=1 build/libringd_core.a build/libringd_cuda.so >/dev/null
cc -std=c11 -O2 -g -Wall -Wextra -Werror -D_GNU_SOURCE -I. \
    -o build/gpu_check tests/gpu/gpu_check.c build/libringd_core.a \
    -ldl -lm -pthread
command -v nvidia-smi >/dev/null && nvidia-smi -L || true
exec build/gpu_check "$PWD/build/libringd_cuda.so"
