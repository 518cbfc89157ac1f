#!/usr/bin/env bash
# decode_run (TERN_CUDA_FUSE=1) against the separate launches, on a GPU
# machine through `device` (carrying .gpu, which scripts/gpu-build.sh fills
# with the binaries, the model generator, its tokenizer and the gguf wheel):
# makes the 2B-4T-shaped IQ2_BN model in the lease while scripts/gpu-check.sh
# runs (CHECK=0 skips it), then greedy text with and without fusing, the
# per-phase trace, ROUNDS alternating tg128 rounds, and tg128 fused with
# each setting in VARIANTS (e.g. "TERN_CUDA_PDL=0 TERN_CUDA_GRAPHS=0"; docs/environment.md).
# CHECK=fuse runs only the golden models through decode_run, CHECK=ops the
# ops and golden models both ways; FORMATS (default IQ2_BN) adds tg128 of
# other ternary formats, STATS=1 launches per token and pp512. Logs go to $OUT.
set -u
cd "$(dirname "$0")/.."
export M=${MODELS:-/tmp/models}
OUT=${OUT:-/tmp}
T=.gpu/tern
mkdir -p "$M"
FORMATS=${FORMATS:-IQ2_BN}
MODELS=$M TERN=$T scripts/gpu-model.sh $FORMATS &
if [ "${CHECK:-1}" = ops ]; then
    # The ops and golden models, launched and fused (no NVRTC pass: CI has it).
    built_at=$(cat .gpu/built-at); [ -e "$built_at" ] || { mkdir -p "$(dirname "$built_at")"; ln -s "$PWD" "$built_at"; }
    for t in "gpu_ops" "gpu_golden" "gpu_golden FUSE"; do
        set -- $t
        TERN_REQUIRE_GPU=1 TERN_CUDA_FUSE=$([ "${2:-}" = FUSE ] && echo 1 || echo 0) timeout 120 .gpu/$1 --nocapture \
            --test-threads=1 > "$OUT/check-$1${2:-}.log" 2>&1
        echo "$t rc=$?: $(grep -E 'test result' "$OUT/check-$1${2:-}.log")"
    done
    grep -E 'GEMV|head' "$OUT/check-gpu_ops.log" | head -12
elif [ "${CHECK:-1}" = fuse ]; then
    # decode_run alone: the golden models fused against the CPU.
    built_at=$(cat .gpu/built-at); [ -e "$built_at" ] || { mkdir -p "$(dirname "$built_at")"; ln -s "$PWD" "$built_at"; }
    TERN_REQUIRE_GPU=1 TERN_CUDA_FUSE=1 timeout 120 .gpu/gpu_golden --nocapture --test-threads=1 > "$OUT/check.log" 2>&1
    echo "gpu_golden TERN_CUDA_FUSE=1 rc=$?"
    grep -E 'test result|FAILED|panicked' "$OUT/check.log" | head -20
elif [ "${CHECK:-1}" = 1 ]; then
    timeout 300 scripts/gpu-check.sh > "$OUT/check.log" 2>&1
    echo "gpu-check rc=$?"
    grep -E '^=== |test result|FAILED|panicked|GEMV' "$OUT/check.log" | head -40
fi
wait
tg() { timeout 60 "$@" bench -m "$M/IQ2_BN.gguf" -ngl 99 -p 0 -n 128 -r "${REPS:-5}" 2>&1 | grep tg128 | awk -F'|' '{print $(NF-1)}'; }
for f in 0 1; do
    echo "FUSE=$f greedy: $(TERN_CUDA_FUSE=$f timeout 60 $T run -m "$M/IQ2_BN.gguf" -ngl 99 -p "The capital of" -n 24 --temp 0 2>/dev/null | tr '\n' ' ')"
done
# Logits of the same greedy steps with and without fusing: KL of each row
# until the two runs first pick different tokens.
for f in 0 1; do
    TERN_CUDA_FUSE=$f timeout 60 $T eval -m "$M/IQ2_BN.gguf" -ngl 99 --tokens 128000,791,6864,315 --gen 24 \
        --logits-out "$M/logits$f.npy" > /dev/null 2> "$OUT/eval$f.log"
done
python3 - "$M/logits0.npy" "$M/logits1.npy" <<'PY'
import sys
import numpy as np
a, b = (np.load(f).astype(np.float64) for f in sys.argv[1:3])
for i in range(min(len(a), len(b))):
    pa, pb = (np.exp(x - x.max()) / np.exp(x - x.max()).sum() for x in (a[i], b[i]))
    kl = float((pa * (np.log(pa + 1e-300) - np.log(pb + 1e-300))).sum())
    print(f"row {i:2d}: KL {kl:.2e} max|d| {np.abs(a[i] - b[i]).max():.3e} top1 {a[i].argmax()} {b[i].argmax()}")
    if a[i].argmax() != b[i].argmax():
        break
PY
TERN_CUDA_FUSE=1 TERN_CUDA_FUSE_TRACE=1 timeout 60 $T bench -m "$M/IQ2_BN.gguf" -ngl 99 -p 0 -n 16 -r 1 > "$OUT/trace.log" 2>&1
grep -A8 'decode_run trace' "$OUT/trace.log"
for _ in $(seq "${ROUNDS:-3}"); do
    for f in 0 1; do
        echo "FUSE=$f tg128 $(TERN_CUDA_FUSE=$f tg $T)"
    done
done
# The other formats, once each way.
for fmt in $FORMATS; do
    [ "$fmt" = IQ2_BN ] && continue
    for f in 0 1; do
        echo "$fmt FUSE=$f tg128 $(TERN_CUDA_FUSE=$f timeout 60 $T bench -m "$M/$fmt.gguf" -ngl 99 -p 0 -n 128 -r "${REPS:-5}" 2>&1 |
            grep tg128 | awk -F'|' '{print $(NF-1)}')"
    done
done
if [ "${STATS:-0}" = 1 ]; then
    for f in 0 1; do
        echo "FUSE=$f:"
        TERN_CUDA_FUSE=$f TERN_CUDA_STATS=1 timeout 60 $T bench -m "$M/IQ2_BN.gguf" -ngl 99 -p 512 -n 32 -r 3 2>&1 |
            grep -E 'pp512|tg32|launches'
    done
fi
for v in ${VARIANTS:-}; do
    echo "FUSE=1 $v tg128 $(env TERN_CUDA_FUSE=1 "$v" bash -c "$(declare -f tg); tg $T")"
done
