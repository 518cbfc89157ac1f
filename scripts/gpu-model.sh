#!/usr/bin/env bash
# The 2B-4T-shaped model on a GPU machine (through `device`, carrying .gpu
# from scripts/gpu-build.sh): $MODELS/f16.gguf made by make_bitnet_gguf.py
# if missing (the gguf wheel from .gpu goes to /tmp/site; the machine has
# numpy but no package index), then each format given quantized by tern if
# missing. Output goes to $MODELS/gen.log; the exit status says whether all
# files are there.
#   scripts/gpu-model.sh IQ2_BN TQ2_0 I2_S
# MODELS (default /tmp/models), MAKE_MODEL, TOKENIZER and TERN (defaults in .gpu/).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
models=${MODELS:-/tmp/models}
tern=${TERN:-$root/.gpu/tern}
mkdir -p "$models"
log="$models/gen.log"
if [ ! -e "$models/f16.gguf" ]; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/site "$root"/.gpu/gguf-*.whl >> "$log" 2>&1
    PYTHONPATH=/tmp/site python3 "${MAKE_MODEL:-$root/.gpu/make_bitnet_gguf.py}" \
        --tokenizer-model "${TOKENIZER:-$root/.gpu/llama3-tiktoken-tokenizer.model}" --arch bitnet-b1.58 \
        -o "$models/f16.gguf.tmp" >> "$log" 2>&1 && mv "$models/f16.gguf.tmp" "$models/f16.gguf" || exit 1
fi
for ty in "$@"; do
    [ -e "$models/$ty.gguf" ] || "$tern" quantize "$models/f16.gguf" "$models/$ty.gguf" "$ty" >> "$log" 2>&1 || exit 1
done
