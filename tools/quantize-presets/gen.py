#!/usr/bin/env python3
"""Record which type llama-quantize gives every tensor under each preset.

Runs mainline's llama-quantize on each compact fixture's F16 file for each
preset tern takes, reads the written files with the `gguf` package, and writes
testdata/quantize/<model>.tsv: a header `tensor<TAB>PRESET...`, one row per
tensor (in the source file's order) with the written type under each preset,
and a `general.file_type` row. A preset llama-quantize refuses on a model gets
`refused` in every cell of its column. `crates/cli/src/quantize_presets/tests.rs`
compares tern's choice with these tables.

Usage (from the repository root):
    python3 tools/quantize-presets/gen.py --llama-quantize /tmp/peers/ml/build/bin/llama-quantize --commit 3f545be
Needs `pip install gguf` (0.19.0 reads every type the presets write).
"""

import argparse
import os
import subprocess
import sys
import tempfile

import gguf

MODELS = ["q3moe-e128-f16", "ds2-e128-f16", "ds3-e128-f16", "llama-e256-f16", "qwen3-e256-f16"]
PRESETS = ["Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K", "IQ4_XS", "Q8_0"]


def types_of(path):
    r = gguf.GGUFReader(path)
    ft = r.fields["general.file_type"].contents()
    return {t.name: t.tensor_type.name for t in r.tensors}, ft


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-quantize", required=True, help="mainline llama-quantize binary")
    ap.add_argument("--commit", required=True, help="the llama.cpp commit it was built from (recorded in the tables)")
    ap.add_argument("--models", default="testdata/compact/models")
    ap.add_argument("--out", default="testdata/quantize")
    ap.add_argument("--tmp", default=tempfile.gettempdir())
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for model in MODELS:
        src = os.path.join(a.models, model + ".gguf")
        names = [t.name for t in gguf.GGUFReader(src).tensors]
        columns, file_types = [], []
        for preset in PRESETS:
            dst = os.path.join(a.tmp, f"tern-presets-{model}-{preset}.gguf")
            run = subprocess.run([a.llama_quantize, src, dst, preset, "2"], capture_output=True, text=True)
            if run.returncode != 0:
                last = (run.stderr.strip().splitlines() or ["?"])[-1]
                print(f"{model} {preset}: refused: {last}", file=sys.stderr)
                columns.append({n: "refused" for n in names})
                file_types.append("refused")
                continue
            types, ft = types_of(dst)
            os.remove(dst)
            assert sorted(types) == sorted(names), f"{model} {preset}: tensor names differ"
            columns.append(types)
            file_types.append(str(ft))
            print(f"{model} {preset}: file_type {ft}", file=sys.stderr)
        with open(os.path.join(a.out, model + ".tsv"), "w") as f:
            f.write(f"# llama-quantize (llama.cpp {a.commit}) on {model}.gguf, by tools/quantize-presets/gen.py\n")
            f.write("\t".join(["tensor"] + PRESETS) + "\n")
            for n in names:
                f.write("\t".join([n] + [c[n] for c in columns]) + "\n")
            f.write("\t".join(["general.file_type"] + file_types) + "\n")


if __name__ == "__main__":
    main()
