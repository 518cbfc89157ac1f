#!/usr/bin/env python3
"""Float64 reference logits for the compact fixtures, teacher-forced on prompt + the peer's 16 greedy ids.

For each row of manifest.tsv: read its teacher-forced ids, run the float64 reference on the model's own weights
(IQ*_BN and TQ*_0 files share the weights of the F16 file, which is read instead, since the gguf package cannot
read IQ*_BN; Q2_0 files are read themselves by ref_forward_tiny.load_raw, because their token_embd is Q8_0, not the
F16 file's F16: their ternary projections equal the F16 file's bit for bit),
and save ref64/<golden>.npy as float32 [n_prompt + n_gen, n_vocab]. Reads manifest.tsv (never rewrites it);
rows whose architecture the reference does not cover are named and skipped. Activations stay float64 (no
--emulate-act): the file is the exact-arithmetic reference, so quantized MoE rows may route differently from
their peer where the peer's rounding decides a near-tie.
usage: make_ref64.py COMPACT_DIR [GOLDEN_PREFIX...]
"""
import os, re, sys
import numpy as np
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ref_forward_tiny as R, bitnet_ref_forward as bref, gguf

d = sys.argv[1]
only = set(sys.argv[2:])  # optional golden prefixes to (re)compute
for line in open(f"{d}/manifest.tsv"):
    if line.startswith("#") or not line.strip():
        continue
    model, prefix, cls, ids = line.rstrip("\n").split("\t")[:4]
    if only and prefix not in only:
        continue
    seq = [int(x) for x in ids.split(",")]
    src = re.sub(r"iq[12]_bn|tq[12]_0", "f16", model)  # ternary files share the F16 file's weights
    arch = R.arch_of(f"{d}/models/{src}")
    if arch in R.FWD:
        kv, W = R.load_any(f"{d}/models/{src}")
        R.ROUTE_LOG.clear()
        lg = R.FWD[arch](kv, W, seq)
        if R.ROUTE_LOG:   # MoE: the smallest gap at a top-k / group cut tells how close the routing is to a flip
            lay, t, gap = min(R.ROUTE_LOG, key=lambda r: r[2])
            cls += f" (closest routing cut: {lay} token {t}, gap {gap:.1e})"
    elif arch in ("bitnet", "bitnet-b1.58", "bitnet-25"):
        hp, W = bref.load(f"{d}/models/{src}")
        lg = bref.forward(hp, W, seq, "silu" if hp["arch"] == "bitnet" else "relu2", False)
    else:
        print(f"{prefix}: no float64 reference for arch {arch} yet"); continue
    np.save(f"{d}/ref64/{prefix}.npy", lg.astype(np.float32))
    print(prefix, lg.shape, cls)
