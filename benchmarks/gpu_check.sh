#!/usr/bin/env bash
# The GPU checks in one run, for a machine with an NVIDIA GPU and torch already installed
# (stoker from this checkout, no install): the `gpu` tests, `stoker bench --device cuda`, the
# first batch on the GPU, and the quick bench on that machine's cores. Logs go to $OUT (or
# ./gpu_check_out).
# Usage: bash benchmarks/gpu_check.sh [QUICK_WORKLOADS...]   (default: jpeg)
set -uo pipefail
out="${OUT:-gpu_check_out}"
mkdir -p "$out"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
workloads=("${@:-jpeg}")
{
  nvidia-smi -L; nproc; python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.is_available())'
} 2>&1 | tee "$out/machine.txt"
timeout 180 python3 -m pytest -q -p no:cacheprovider -m gpu -o addopts="" \
  tests/test_device_gpu.py tests/bench/test_gpu_bench.py 2>&1 | tee "$out/gpu_tests.txt"
timeout 120 python3 -m stoker.cli bench --device cuda 2>&1 | tee "$out/gpu_bench.txt"
for w in large jpeg; do  # the first batch on the GPU: auto against torch nw=0 (+ .to(cuda))
  timeout 150 python3 benchmarks/first_batch.py "$w" auto torch0 --runs 3 --device cuda 2>&1 \
    | tee -a "$out/first_batch_device.txt"
done
for w in ${workloads[@]}; do
  timeout 200 python3 -m stoker.cli bench --quick -w "$w" --json "$out/quick_$w.json" 2>&1 \
    | tee "$out/quick_$w.txt"
done
