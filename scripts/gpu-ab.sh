#!/usr/bin/env bash
# An A/B of two builds on a GPU machine (through `device`, carrying .gpu):
# makes the 2B-4T-shaped IQ2_BN model in the lease if missing, runs
# scripts/gpu-check.sh (CHECK=0 skips it), then alternates .gpu/tern-base and
# .gpu/tern on tg128 (ROUNDS rounds, -r 5 each) and pp512 once each, and
# with PROFILE=1 prints where a token goes. Before the call:
#   cp .gpu/tern .gpu/tern-base   # the build before the change
#   scripts/gpu-build.sh          # the build after it
# .gpu also needs make_bitnet_gguf.py, llama3-tiktoken-tokenizer.model and
# the gguf wheel (the device has numpy; the wheel installs with --no-deps).
set -u
cd "$(dirname "$0")/.."
M=${MODELS:-/tmp/models}
OUT=${OUT:-/tmp}
mkdir -p "$M"
MODELS=$M scripts/gpu-model.sh IQ2_BN &
if [ "${CHECK:-1}" = 1 ]; then
    scripts/gpu-check.sh > "$OUT/check.log" 2>&1
    echo "gpu-check rc=$?"
    grep -E 'test result|FAILED|panicked|GEMV' "$OUT/check.log" | head -40
fi
wait
for _ in $(seq "${ROUNDS:-3}"); do
    for b in tern-base tern; do
        echo -n "$b tg128 "
        .gpu/$b bench -m "$M/IQ2_BN.gguf" -ngl 99 -p 0 -n 128 -r 5 2>&1 | grep tg128 | awk -F'|' '{print $(NF-1)}'
    done
done
for b in tern-base tern; do
    echo -n "$b pp512 "
    .gpu/$b bench -m "$M/IQ2_BN.gguf" -ngl 99 -p 512 -n 0 -r 5 2>&1 | grep pp512 | awk -F'|' '{print $(NF-1)}'
done
if [ "${PROFILE:-0}" = 1 ]; then
    TERN_CUDA_PROFILE=1 .gpu/tern bench -m "$M/IQ2_BN.gguf" -ngl 99 -p 0 -n 32 -r 1 --profile 2>&1 | grep -A12 'CUDA0 by op'
fi
