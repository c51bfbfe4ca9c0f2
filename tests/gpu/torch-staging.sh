#!/usr/bin/env bash
# tests/gpu/torch-staging.sh - ringd.torch's CUDA staging on a real GPU.
#
# Runs the suite's client_python_torch_cuda_* tests (tests/test-client-
# torch.c): 2 nodes x 2 trainers (etcd, UCX on loopback) training on the
# GPU through DistributedOptimizer, the gradients copied on a side stream
# into buckets page-locked with cudaHostRegister (and cast to bf16 on the
# device first), the replicas bitwise identical at every step and within
# tolerance of one CPU process; and a trainer killed and one joining with
# the elastic.State's CUDA tensors staged through the state region.
# Needs build/ (tests/gpu/run.sh builds it first) and a /usr/bin/python3
# whose torch sees a GPU. Exit status: 0 ok, 1 failed, 77 skipped (and why).
set -uo pipefail
cd "$(dirname "$0")/../.."
if ! why=$(/usr/bin/python3 -c 'import torch
assert torch.cuda.is_available(), \
    "torch %s: torch.cuda.is_available() is False" % torch.__version__' \
    2>&1); then
    echo "torch-staging: skipped: ${why##*$'\n'}"
    exit 77
fi
out=$(build/ringd-tests 'client_python_torch_cuda_*' 2>&1)
rc=$?
printf '%s\n' "$out"
if [ "$rc" -ne 0 ]; then
    exit 1
fi
# A test that skipped (no etcd, say) did not check anything.
if printf '%s\n' "$out" | grep -q '# SKIP'; then
    echo "torch-staging: a CUDA test skipped"
    exit 1
fi
echo "torch-staging: ok"
