#!/usr/bin/env bash
# GPU checks, run on a machine with an NVIDIA GPU (through `device`): every
# kernel compiles with NVRTC, every GPU op matches the CPU backend on random
# data (poisoned outputs), the golden models give the CPU's logits and greedy
# tokens, and a table of kernel times at the 2B-4T shapes.
# Binaries come from scripts/gpu-build.sh (in .gpu/, or $TERN_GPU_BIN).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${TERN_GPU_BIN:-$root/.gpu}
built_at=$(cat "$bin/built-at")
if [ ! -e "$built_at" ]; then
    mkdir -p "$(dirname "$built_at")"
    ln -s "$root" "$built_at"
fi
# NVRTC from the toolkit or a pip wheel; libcuda comes with the driver.
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib $(ls -d /opt/*/.venv/lib/python3*/site-packages/nvidia/cu1*/lib 2>/dev/null); do
    if ls "$d"/libnvrtc.so* >/dev/null 2>&1; then
        export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
        break
    fi
done
export TERN_REQUIRE_GPU=1 TERN_REQUIRE_NVRTC=1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
status=0
# The tests build their options (no process-wide variables), but run one at
# a time: two tests' persistent decoding kernels on one GPU could each hold
# some SMs and wait for blocks that never become resident (a trap after two
# seconds), and the timing table wants the GPU to itself.
for t in kernels_compile gpu_ops gpu_golden; do
    echo "=== $t"
    "$bin/$t" --nocapture --test-threads=1 || status=1
done
# The GPU ops again with the prompt GEMM on mma.sync (TERN_CUDA_WGMMA=0, read
# by the tests' options; on sm_90 the default is ternary_gemm_wg): both GEMMs
# stay checked.
echo "=== gpu_ops, TERN_CUDA_WGMMA=0"
TERN_CUDA_WGMMA=0 "$bin/gpu_ops" --nocapture --test-threads=1 || status=1
# The golden models again with decoding as separate launches
# (TERN_CUDA_FUSE=0, read by the tests' options; on sm_90 the default is one
# persistent kernel, decode_run, whose attention takes f32 caches, as here,
# over (KV head, split) units): the same logits and greedy tokens as the CPU.
echo "=== gpu_golden, TERN_CUDA_FUSE=0"
TERN_CUDA_FUSE=0 "$bin/gpu_golden" --nocapture --test-threads=1 || status=1
exit $status
