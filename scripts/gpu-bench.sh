#!/usr/bin/env bash
# GPU benchmarks of the 2B-4T-shaped model, run on a GPU machine (through
# `device`) with the binaries from scripts/gpu-build.sh. Makes the model if
# it is missing (make_bitnet_gguf.py from shared/tools, needs python `gguf`),
# quantizes it to TQ2_0, IQ2_BN and I2_S, and runs `tern bench -ngl 99`.
#   MODELS=/tmp/models MAKE_MODEL=.../make_bitnet_gguf.py TOKENIZER=.../llama3-tiktoken-tokenizer.model
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tern=${TERN:-$root/.gpu/tern}
models=${MODELS:-/tmp/models}
reps=${REPS:-10}
mkdir -p "$models"
if [ ! -e "$models/f16.gguf" ]; then
    python3 "$MAKE_MODEL" --tokenizer-model "$TOKENIZER" --arch bitnet-b1.58 -o "$models/f16.gguf"
fi
for ty in ${TYPES:-TQ2_0 IQ2_BN I2_S}; do
    [ -e "$models/$ty.gguf" ] || "$tern" quantize "$models/f16.gguf" "$models/$ty.gguf" "$ty"
done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for ty in ${TYPES:-TQ2_0 IQ2_BN I2_S}; do
    TERN_CUDA_STATS=1 "$tern" bench -m "$models/$ty.gguf" -ngl 99 -p 512 -n 128 -r "$reps"
    "$tern" bench -m "$models/$ty.gguf" -ngl 99 -p 2048 -n 0 -b 2048 -ub 2048 -r "$reps"
done
