#!/usr/bin/env bash
# Builds what scripts/gpu-check.sh runs on a GPU machine that has no Rust
# toolchain: the release `tern` binary and the GPU test binaries, into .gpu/.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out="$root/.gpu"
mkdir -p "$out"
cargo build --release -p tern-cli
cp target/release/tern "$out/tern"
for t in "tern-cuda kernels_compile" "tern-cuda gpu_ops" "tern-engine gpu_golden"; do
    set -- $t
    exe=$(cargo test --release -p "$1" --test "$2" --no-run --message-format=json 2>/dev/null |
        python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["executable"])' | tail -1)
    cp "$exe" "$out/$2"
done
# What scripts/gpu-fuse.sh and gpu-ab.sh need to make the 2B-4T-shaped model
# on the GPU machine: the generator and tokenizer from ../shared when there,
# and the gguf wheel (the GPU machine has numpy but no package index).
shared="$root/../shared"
if [ -d "$shared" ]; then
    cp -f "$shared/tools/make_bitnet_gguf.py" "$shared/testdata/tokenizer/llama3-tiktoken-tokenizer.model" "$out/"
fi
ls "$out"/gguf-*.whl > /dev/null 2>&1 || python3 -m pip download -q --no-deps --only-binary=:all: -d "$out" gguf ||
    echo "warning: no gguf wheel in $out (the model generator needs it)"
# The test binaries find fixtures through the source path they were built at.
strip "$out"/* 2>/dev/null || true
echo "$root" > "$out/built-at"
ls -la "$out"
