#!/usr/bin/env bash
# GPU benchmarks of the 2B-4T-shaped model, run on a GPU machine (through
# `device`) with the binaries from scripts/gpu-build.sh. Makes the model and
# its TQ2_0, IQ2_BN and I2_S files if missing (scripts/gpu-model.sh), and
# runs `tern bench -ngl 99`.
#   MODELS=/tmp/models TYPES="TQ2_0 IQ2_BN I2_S" REPS=10
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tern=${TERN:-$root/.gpu/tern}
models=${MODELS:-/tmp/models}
reps=${REPS:-10}
MODELS=$models TERN=$tern "$root/scripts/gpu-model.sh" ${TYPES:-TQ2_0 IQ2_BN I2_S}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for ty in ${TYPES:-TQ2_0 IQ2_BN I2_S}; do
    TERN_CUDA_STATS=1 "$tern" bench -m "$models/$ty.gguf" -ngl 99 -p 512 -n 128 -r "$reps"
    "$tern" bench -m "$models/$ty.gguf" -ngl 99 -p 2048 -n 0 -b 2048 -ub 2048 -r "$reps"
done
