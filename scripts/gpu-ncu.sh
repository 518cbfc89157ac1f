#!/usr/bin/env bash
# Where a kernel's time goes, from the hardware (through `device`, carrying
# .gpu from scripts/gpu-build.sh): makes the 2B-4T-shaped IQ2_BN model, then
# Nsight Compute profiles one launch of KERNEL (default decode_run, the 10th
# of a tg16 run; e.g. KERNEL=flash_attn SKIP=40 BENCH="-p 2048 -b 2048 -ub
# 2048 -n 0 -r 2" for the prompt attention past the warm-up). Kernels carry
# line info (nvrtc.rs). Prints the launch's summary, its warp stall reasons,
# and the SASS instructions with the most stall samples; the report itself
# is $OUT/KERNEL.ncu-rep (open it with Nsight Compute). The clocks are left
# alone (--clock-control none, METHOD.md).
set -u
cd "$(dirname "$0")/.."
M=${MODELS:-/tmp/models}
OUT=${OUT:-/tmp}
MODELS=$M scripts/gpu-model.sh IQ2_BN || { echo "no model: $(tail -3 "$M/gen.log")"; exit 1; }
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
KERNEL=${KERNEL:-decode_run}
# By default the 10th decode_run: past the warm-up, the capture and the
# first replays.
timeout 420 "$ncu" --clock-control none --kernel-name "$KERNEL" --launch-skip "${SKIP:-9}" --launch-count 1 \
    --set full --import-source yes --export "$OUT/$KERNEL" --force-overwrite \
    .gpu/tern bench -m "$M/IQ2_BN.gguf" -ngl 99 ${BENCH:--p 0 -n 16 -r 1} > "$OUT/ncu.log" 2>&1
echo "ncu rc=$? ($(tail -c 300 "$OUT/ncu.log" | tr '\n' ' '))"
rep="$OUT/$KERNEL.ncu-rep"
"$ncu" --import "$rep" --page details --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis \
    2>&1 | head -120
# The SASS view (the module's source is assembled at run time, so there is
# no file for a CUDA-source view): the instructions with the most stall
# samples, each with its top reasons.
"$ncu" --import "$rep" --page source --csv --print-source sass 2>/dev/null > "$OUT/sass.csv"
python3 - "$OUT/sass.csv" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
head = next((i for i, r in enumerate(rows) if "Source" in r), None)
if head is None:
    sys.exit("no SASS table in the report")
cols, body = rows[head], rows[head + 1:]
num = lambda v: float(v.replace(",", "")) if v.replace(",", "").replace(".", "").isdigit() else 0.0
si, ti, ei = cols.index("Warp Stall Sampling (All Samples)"), cols.index("Source"), cols.index("Instructions Executed")
why = [(i, c[6:]) for i, c in enumerate(cols) if c.startswith("stall_") and "Not Issued" not in c]
total = sum(num(r[si]) for r in body if len(r) > si) or 1.0
print("| # | stall samples | share | executed | instruction | top reasons |\n|---:|---:|---:|---:|---|---|")
for n, r in sorted(enumerate(body), key=lambda nr: -num(nr[1][si]) if len(nr[1]) > si else 0)[:40]:
    top = sorted(((num(r[i]), c) for i, c in why), reverse=True)[:3]
    reasons = " ".join(f"{c} {v:.0f}" for v, c in top if v > 0)
    print(f"| {n} | {num(r[si]):.0f} | {100 * num(r[si]) / total:.1f}% | {num(r[ei]):.0f} | `{r[ti].strip()[:70]}` | {reasons} |")
PY
