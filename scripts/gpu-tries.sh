#!/usr/bin/env bash
# Several decode builds against each other in one device call (through
# `device`, carrying .gpu): for each NAME in BUILDS, .gpu/tern-NAME (and, when
# present, .gpu/gpu_ops-NAME, whose fused decoding test runs first). Makes a
# LAYERS-layer model of the 2B-4T shape (default 8: 37 s to make instead of
# 90 for 30, and the same per-layer costs), then ROUNDS rounds of tg128 (-r 5)
# alternating the builds, then each build's decode_run trace. Build a
# branch's binaries here first, e.g.
#   git checkout BRANCH && scripts/gpu-build.sh && mv .gpu/tern .gpu/tern-NAME &&
#   mv .gpu/gpu_ops .gpu/gpu_ops-NAME && git checkout main
# (drop gpu_golden and kernels_compile from .gpu to stay under the carry limit).
#   BUILDS="base arrive-first" scripts/gpu-tries.sh
set -u
cd "$(dirname "$0")/.."
M=${MODELS:-/tmp/m${LAYERS:-8}}
BUILDS=${BUILDS:?names of .gpu/tern-NAME builds}
mkdir -p "$M"
first=$(echo $BUILDS | awk '{print $1}')
if [ ! -e "$M/IQ2_BN.gguf" ]; then
    (
        python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/gguf-*.whl > /dev/null 2>&1
        PYTHONPATH=/tmp/site python3 .gpu/make_bitnet_gguf.py --tokenizer-model .gpu/llama3-tiktoken-tokenizer.model \
            --arch bitnet-b1.58 --layers "${LAYERS:-8}" -o "$M/f16.gguf" > "$M/gen.log" 2>&1 &&
            ".gpu/tern-$first" quantize "$M/f16.gguf" "$M/IQ2_BN.gguf" IQ2_BN >> "$M/gen.log" 2>&1
        echo "model rc=$?"
    ) &
fi
built_at=$(cat .gpu/built-at)
[ -e "$built_at" ] || { mkdir -p "$(dirname "$built_at")"; ln -s "$PWD" "$built_at"; }
for d in /usr/local/cuda/lib64 $(ls -d /opt/*/.venv/lib/python3*/site-packages/nvidia/cu1*/lib 2>/dev/null); do
    ls "$d"/libnvrtc.so* > /dev/null 2>&1 && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}" && break
done
for b in $BUILDS; do
    [ -e ".gpu/gpu_ops-$b" ] || continue
    echo "$b fused decoding: $(TERN_REQUIRE_GPU=1 timeout 100 ".gpu/gpu_ops-$b" fused_decoding --nocapture \
        --test-threads=1 2>&1 | grep -E 'test result|panicked' | tr '\n' ' ')"
done
wait
tg() { timeout 60 ".gpu/tern-$1" bench -m "$M/IQ2_BN.gguf" -ngl 99 -p 0 -n 128 -r 5 2>&1 | grep tg128 | awk -F'|' '{print $(NF-1)}'; }
for _ in $(seq "${ROUNDS:-3}"); do
    for b in $BUILDS; do echo -n "$b: $(tg "$b")  "; done
    echo
done
for b in $BUILDS; do
    echo "== $b"
    TERN_CUDA_FUSE_TRACE=1 timeout 60 ".gpu/tern-$b" bench -m "$M/IQ2_BN.gguf" -ngl 99 -p 0 -n 16 -r 1 2>&1 |
        grep -A8 'decode_run trace'
done
