#!/usr/bin/env python3
"""CPU benchmark of tern against ik_llama.cpp and llama.cpp, run alternately.

Each round runs every configuration once (pp512 + tg128, one repetition after
the tool's own warm-up), so the engines share the machine's state; the table
gives medians over rounds and ratios to ik_llama.cpp. Peers are built outside
the repo (see BENCHMARKS.md); nothing here downloads anything.

usage: bench_vs_peers.py --ik IK_BENCH --ml ML_BENCH --tern TERN --models DIR [--suite bitnet|moe]
                         [--rounds 5] [--threads 2]
Suite bitnet: DIR holds ik-iq2_bn.gguf ik-iq1_bn.gguf ml-tq2_0.gguf
ml-tq1_0.gguf and tern's tq2_0.gguf tq1_0.gguf iq2_bn.gguf iq1_bn.gguf
i2_s.gguf (all from one F16 file); ratios to ik's IQ2_BN.
Suite moe: DIR holds q3moe-q4_k_m.gguf and ds2-q4_k_m.gguf (llama-quantize
Q4_K_M; every engine reads the same file); ik runs with its MoE flags
(-fmoe 1 -rtr 1, and -mla 3 -fa 1 on deepseek2); ratios to ik per model.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys


def parse(md):
    """{test: t/s} from a llama-bench style markdown table."""
    out = {}
    for line in md.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and re.fullmatch(r"(pp|tg)\d+", cells[-2]):
            out[cells[-2]] = float(cells[-1].split("±")[0])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ik", required=True)
    ap.add_argument("--ml", required=True)
    ap.add_argument("--tern", required=True)
    ap.add_argument("--models", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--log", default="bench_vs_peers.log")
    ap.add_argument("--suite", choices=["bitnet", "moe"], default="bitnet")
    a = ap.parse_args()
    m = lambda f: os.path.join(a.models, f)
    common = ["-p", "512", "-n", "128", "-t", str(a.threads), "-r", "1"]
    if a.suite == "moe":
        return moe(a, m, common)
    configs = [
        ("ik_llama.cpp", "IQ2_BN -rtr 1", [a.ik, "-m", m("ik-iq2_bn.gguf"), "-rtr", "1"] + common),
        ("ik_llama.cpp", "IQ1_BN", [a.ik, "-m", m("ik-iq1_bn.gguf")] + common),
        ("llama.cpp", "TQ2_0", [a.ml, "-m", m("ml-tq2_0.gguf")] + common),
        ("llama.cpp", "TQ1_0", [a.ml, "-m", m("ml-tq1_0.gguf")] + common),
    ] + [("tern", t.upper(), [a.tern, "bench", "-m", m(f"{t}.gguf")] + common)
         for t in ["tq2_0", "iq2_bn", "i2_s", "tq1_0", "iq1_bn"]]
    med = run_rounds(a, configs, ["pp512", "tg128"])
    ik2, ik1 = med[("ik_llama.cpp", "IQ2_BN -rtr 1")], med[("ik_llama.cpp", "IQ1_BN")]
    print(f"| engine | format | pp512 t/s | tg128 t/s | pp512 / ik IQ2_BN | tg128 / ik IQ2_BN | pp512 / ik IQ1_BN | tg128 / ik IQ1_BN |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for (engine, fmt), d in med.items():
        print(f"| {engine} | {fmt} | {d['pp512']:.1f} | {d['tg128']:.2f} | {d['pp512'] / ik2['pp512']:.2f} | "
              f"{d['tg128'] / ik2['tg128']:.2f} | {d['pp512'] / ik1['pp512']:.2f} | {d['tg128'] / ik1['tg128']:.2f} |")
    print(f"\nmedians of {a.rounds} rounds, {a.threads} threads; raw output in {a.log}")


def run_rounds(a, configs, tests):
    """Runs every configuration once a round; medians per (engine, label) and test."""
    samples = {(e, f): {t: [] for t in tests} for e, f, _ in configs}
    with open(a.log, "w") as log:
        for r in range(a.rounds):
            for engine, label, cmd in configs:
                res = subprocess.run(cmd, capture_output=True, text=True)
                log.write(f"# round {r} {engine} {label}: {' '.join(cmd)}\n{res.stdout}\n{res.stderr[-2000:]}\n")
                log.flush()
                got = parse(res.stdout)
                for t in tests:
                    if t in got:
                        samples[(engine, label)][t].append(got[t])
                print(f"round {r} {engine:13} {label:24} {got}", file=sys.stderr, flush=True)
    return {k: {t: statistics.median(v) if v else float("nan") for t, v in d.items()} for k, d in samples.items()}


def moe(a, m, common):
    tests = ["pp512", "tg128"]
    configs = []
    for name, ik_flags in [("q3moe", ["-fmoe", "1", "-rtr", "1"]), ("ds2", ["-fmoe", "1", "-rtr", "1", "-mla", "3", "-fa", "1"])]:
        f = m(f"{name}-q4_k_m.gguf")
        if not os.path.exists(f):
            continue
        configs += [
            ("ik_llama.cpp", f"{name} {' '.join(ik_flags)}", [a.ik, "-m", f] + ik_flags + common),
            ("llama.cpp", name, [a.ml, "-m", f] + common),
            ("tern", name, [a.tern, "bench", "-m", f] + common),
        ]
    med = run_rounds(a, configs, tests)
    print("| model | engine | test | t/s | / ik_llama.cpp |")
    print("|---|---|---|---:|---:|")
    for (engine, label), d in med.items():
        name = label.split()[0]
        ik = next(v for (e, l), v in med.items() if e == "ik_llama.cpp" and l.split()[0] == name)
        for t, v in d.items():
            if v == v:  # not NaN
                print(f"| {name} | {engine} | {t} | {v:.2f} | {v / ik[t]:.2f} |")
    print(f"\nmedians of {a.rounds} rounds, {a.threads} threads; raw output in {a.log}")


if __name__ == "__main__":
    main()
