#!/usr/bin/env bash
# ik_llama.cpp beside tern on a GPU machine (through `device`), in the same
# session and on one model file. The peer is never part of the repo: bring its
# source as a tarball in .gpu/ik-src.tar.xz (ggml, src, include, common,
# examples, vendor, pocs, cmake and the CMake files of a fetched checkout).
#
# A CUDA build of ik takes about 14 minutes on 16 cores, longer than one
# `device` call, and a machine left idle for 30 s is given back (taking the
# build with it). So: call `start`, then `wait` until it prints "ik done",
# then `bench`, each call issued right after the last one returns.
#   scripts/gpu-peer.sh start   # ik build + the f16 model, in the background
#   scripts/gpu-peer.sh wait    # up to 9.5 minutes
#   scripts/gpu-peer.sh bench   # ik's IQ2_BN file; ik and tern alternating: full
#                               # offload (medians of 10, per-run samples under
#                               # $OUT/peer), then ROUNDS (default 3) hybrid rounds
#   scripts/gpu-peer.sh sweep   # the same file at depth: ik's llama-sweep-bench
#                               # and tern's --sweep (-c 4096 -ub 512, tg 128 a
#                               # depth), SWEEPS (default 2) rounds alternating
# The model comes from scripts/gpu-model.sh (MAKE_MODEL, TOKENIZER: defaults in .gpu/).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export PATH=/usr/local/cuda/bin:$PATH
ik=/tmp/ik
models=${MODELS:-/tmp/models}
tern=${TERN:-$root/.gpu/tern}
case "${1:-}" in
start)
    mkdir -p "$ik" "$models" && tar xJf .gpu/ik-src.tar.xz -C "$ik"
    setsid nohup bash -c "cd $ik && cmake -B build -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DGGML_IQK_FA_ALL_QUANTS=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF \
        -DCMAKE_BUILD_TYPE=Release > /tmp/ik-cfg.log 2>&1 \
        && cmake --build build -j16 --target llama-bench llama-quantize llama-sweep-bench > /tmp/ik-build.log 2>&1; echo \$? > /tmp/ik-done" \
        > /dev/null 2>&1 < /dev/null &
    setsid nohup bash -c "MODELS=$models scripts/gpu-model.sh; echo ok > /tmp/gen-done" > /dev/null 2>&1 < /dev/null &
    echo "started"
    ;;
wait)
    while [ ! -e /tmp/ik-done ] && [ $SECONDS -lt 570 ]; do sleep 5; done
    if [ -e /tmp/ik-done ]; then echo "ik done: $(cat /tmp/ik-done)"; else echo "ik building: $(tail -c 120 /tmp/ik-build.log)"; fi
    ;;
bench)
    while [ ! -e /tmp/gen-done ] && [ $SECONDS -lt 300 ]; do sleep 3; done
    m=$models/ik-iq2_bn.gguf
    [ -e "$m" ] || $ik/build/bin/llama-quantize --token-embedding-type q6_k --output-tensor-type q6_k \
        "$models/f16.gguf" "$m" IQ2_BN 16 > /tmp/ikq.log 2>&1
    row() { grep -E "^\| [a-z]" | grep -vE "model +\|"; }
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    # Full offload: two rounds, the engines alternating, 10 runs a figure
    # after each tool's warm-up run, every run's t/s kept (-o json) so that
    # the summary below compares medians, not means (ik's
    # prompt speeds spread ±25-30%).
    out=${OUT:-/tmp}/peer
    mkdir -p "$out"
    for round in 1 2; do
        i=0
        for args in "-p 512 -n 0 -r 10" "-p 2048 -n 0 -b 2048 -ub 2048 -r 10" "-p 0 -n 128 -r 10"; do
            i=$((i + 1))
            echo "## round $round: -ngl 99 $args"
            $ik/build/bin/llama-bench -m "$m" -ngl 99 -fa 1 $args -o json > "$out/ik-$round-$i.json" 2> /dev/null
            "$tern" bench -m "$m" -ngl 99 $args -o json > "$out/tern-$round-$i.json" 2> /dev/null
        done
    done
    python3 - "$out" <<'PY'
import glob, json, os, statistics, sys
runs = {}
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    engine, rnd, _ = os.path.basename(f)[:-5].split("-")
    for r in json.load(open(f)):
        test = f"pp{r['n_prompt']}" if r["n_prompt"] else f"tg{r['n_gen']}"
        runs.setdefault((test, rnd), {})[engine] = [float(v) for v in r["samples_ts"]]
print("| test | round | ik median (mean ± sd, n) | tern median (mean ± sd, n) | tern / ik (medians) |")
print("|---|---:|---:|---:|---:|")
def cell(v):
    return f"{statistics.median(v):,.1f} ({statistics.mean(v):,.1f} ± {statistics.pstdev(v):,.1f}, {len(v)})"
for (test, rnd), e in sorted(runs.items()):
    if "ik" in e and "tern" in e:
        ratio = statistics.median(e["tern"]) / statistics.median(e["ik"])
        print(f"| {test} | {rnd} | {cell(e['ik'])} | {cell(e['tern'])} | {ratio:.2f}× |")
PY
    # Hybrid placements: ROUNDS rounds (default 3), ik and tern alternating.
    for round in $(seq "${ROUNDS:-3}"); do
        for placement in "-ngl 99 -ot ffn_.*=CPU" "-ngl 15"; do
            echo "## round $round: $placement -t 16"
            $ik/build/bin/llama-bench -m "$m" $placement -fa 1 -t 16 -p 512 -n 128 -r 5 2>&1 | row
            "$tern" bench -m "$m" $placement -t 16 -p 512 -n 128 -r 5 2>&1 | row
        done
    done
    ;;
sweep)
    m=$models/ik-iq2_bn.gguf
    [ -e "$m" ] || { echo "no $m: run bench first" >&2; exit 1; }
    for round in $(seq "${SWEEPS:-2}"); do
        echo "## round $round: ik llama-sweep-bench -ngl 99 -fa 1 -c 4096 -ub 512 (tg 128)"
        $ik/build/bin/llama-sweep-bench -m "$m" -ngl 99 -fa 1 -c 4096 -ub 512 -n 128 2>&1 | grep -E "^\|"
        echo "## round $round: tern bench -ngl 99 --sweep -c 4096 -ub 512 -n 128 -r 1"
        "$tern" bench -m "$m" -ngl 99 --sweep -c 4096 -ub 512 -n 128 -r 1 2>&1 | grep -E "^\|"
    done
    ;;
*)
    echo "usage: $0 start|wait|bench|sweep" >&2
    exit 2
    ;;
esac
