#!/usr/bin/env python3
"""float64 numpy reference forward pass for the tiny fixture GGUFs: arch llama, qwen3 (dense), deepseek2 (both
MLA tensor formats, with or without q_lora), and bitnet / bitnet-b1.58 (delegates to bitnet_ref_forward.forward).

Compares against a golden produced by the dump_logits harness: runs prompt + the 16 greedy ids read from
PREFIX.tokens.txt in one pass and compares rows [0, n_prompt) with PREFIX.prompt_logits.npy and rows
[n_prompt, n_prompt+16) with PREFIX.gen_logits.npy (gen row g = logits after feeding generated id g).
Weights are dequantized exactly (gguf.quants); activations stay float64, so differences to llama.cpp
include its on-the-fly activation rounding (F16 for F16 weights, Q8_0/Q8_K for quantized weights) and,
for ik, the F16 KV cache.  --q8-lmhead emulates the Q8_0 rounding of the final hidden state (bitnet
files with Q4_0 token_embd).

Files with tensor types the gguf package cannot parse (Q2_0 = GGML type 42) are read by a small built-in
GGUF parser (load_raw) that dequantizes Q2_0 itself and hands every other type to gguf.quants.

usage: ref_forward_tiny.py MODEL.gguf --golden PREFIX [--act silu|relu2] [--q8-lmhead]
"""
import argparse, os, struct, sys
import numpy as np
import gguf
from gguf.quants import dequantize

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bitnet_ref_forward as bref  # noqa: E402


def load(path):
    r = gguf.GGUFReader(path)
    kv = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.") and not k.startswith("tokenizer.")}
    W = {}
    for t in r.tensors:
        d = np.asarray(t.data)
        a = d.astype(np.float64) if t.tensor_type in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16) \
            else dequantize(d, t.tensor_type).astype(np.float64)
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))
        W[t.name] = a.reshape(shape)
        if len(shape) == 2 and shape[0] == 1:
            W[t.name] = a.reshape(-1)
    return kv, W


GGML_Q2_0 = 42  # mainline llama.cpp: block of 64 = {f16 d; u8 qs[16]}, element j = (qs[j/4] >> 2*(j%4)) & 3, value d*(code-1)


def dequant_q2_0(raw, n):
    b = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 18)[: n // 64]
    d = b[:, :2].copy().view(np.float16).astype(np.float64)            # (nb, 1)
    qs = b[:, 2:]                                                       # (nb, 16)
    codes = (qs[:, :, None] >> np.array([0, 2, 4, 6], dtype=np.uint8)) & 3   # (nb, 16, 4): element 4*byte + pair
    return ((codes.reshape(-1, 64).astype(np.float64) - 1.0) * d).reshape(-1)


def load_raw(path):
    """Minimal GGUF v3 reader for files the gguf package refuses (unknown tensor types). Same output as load()."""
    b = open(path, "rb").read()
    o = [0]

    def u(fmt):
        v = struct.unpack_from(fmt, b, o[0]); o[0] += struct.calcsize(fmt); return v[0]

    def s_():
        n = u("<Q"); v = b[o[0]:o[0] + n].decode("utf-8", "replace"); o[0] += n; return v
    fmts = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}

    def val(t):
        if t == 8:
            return s_()
        if t == 9:
            at = u("<I"); n = u("<Q"); return [val(at) for _ in range(n)]
        return u(fmts[t])
    assert b[:4] == b"GGUF"; o[0] = 4
    u("<I"); nt = u("<Q"); nkv = u("<Q")
    kv = {}
    for _ in range(nkv):
        k = s_(); t = u("<I"); v = val(t)
        if not k.startswith("tokenizer."):
            kv[k] = v
    tens = []
    for _ in range(nt):
        name = s_(); nd = u("<I"); ne = [u("<Q") for _ in range(nd)]; ty = u("<I"); off = u("<Q")
        tens.append((name, ne, ty, off))
    al = kv.get("general.alignment", 32)
    start = (o[0] + al - 1) // al * al
    W = {}
    for name, ne, ty, off in tens:
        n = int(np.prod(ne))
        if ty == GGML_Q2_0:
            a = dequant_q2_0(b[start + off:start + off + n // 64 * 18], n)
        else:
            qt = gguf.GGMLQuantizationType(ty)
            bs, ts = gguf.GGML_QUANT_SIZES[qt]
            raw = np.frombuffer(b, dtype=np.uint8, count=n // bs * ts, offset=start + off)
            if qt == gguf.GGMLQuantizationType.F32:
                a = raw.view(np.float32).astype(np.float64)
            elif qt == gguf.GGMLQuantizationType.F16:
                a = raw.view(np.float16).astype(np.float64)
            else:
                a = dequantize(raw, qt).astype(np.float64).reshape(-1)
        shape = tuple(int(x) for x in reversed(ne))
        W[name] = a.reshape(-1) if len(shape) == 1 or (len(shape) == 2 and shape[0] == 1) else a.reshape(shape)
    return kv, W


def load_any(path):
    try:
        return load(path)
    except (ValueError, KeyError):   # gguf 0.19 raises on GGML type 42
        return load_raw(path)


def arch_of(path):
    try:
        r = gguf.GGUFReader(path); a = r.fields["general.architecture"].contents(); del r; return a
    except (ValueError, KeyError):
        return load_raw(path)[0]["general.architecture"]


def rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def rope_norm(x, pos, theta, n_rot):
    # x: (..., T, n, d) with d == n_rot here; adjacent pairs (2i, 2i+1)
    inv = theta ** (-np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)
    ang = pos[:, None] * inv[None, :]            # (T, n_rot/2)
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = x0 * c - x1 * s
    out[..., 1::2] = x0 * s + x1 * c
    return out


def rope_neox(x, pos, theta, n_rot):
    # x: (T, n, d); NEOX / rotate-half: pairs (i, i + n_rot/2) for i < n_rot/2, dims >= n_rot untouched
    half = n_rot // 2
    inv = theta ** (-np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)
    ang = pos[:, None] * inv[None, :]            # (T, n_rot/2)
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    x0, x1 = x[..., :half], x[..., half:n_rot]
    out = x.copy()
    out[..., :half] = x0 * c - x1 * s
    out[..., half:n_rot] = x0 * s + x1 * c
    return out


def silu(x):
    return x / (1 + np.exp(-x))


def attn(q, k, v, scale):
    # q (T,H,dk) k (T,H,dk) v (T,H,dv), causal
    T = q.shape[0]
    mask = np.triu(np.full((T, T), -np.inf), 1)
    s = np.einsum("thd,shd->hts", q, k) * scale + mask
    s = np.exp(s - s.max(-1, keepdims=True)); s /= s.sum(-1, keepdims=True)
    return np.einsum("hts,shd->thd", s, v)


def fwd_llama(kv, W, toks):
    A = "llama"
    E, H, HKV, L = kv[f"{A}.embedding_length"], kv[f"{A}.attention.head_count"], kv[f"{A}.attention.head_count_kv"], kv[f"{A}.block_count"]
    eps, theta = kv[f"{A}.attention.layer_norm_rms_epsilon"], kv[f"{A}.rope.freq_base"]
    hd = E // H; T = len(toks); pos = np.arange(T, dtype=np.float64)
    x = W["token_embd.weight"][toks]
    for i in range(L):
        p = f"blk.{i}."
        h = rms(x, W[p + "attn_norm.weight"], eps)
        q = rope_norm((h @ W[p + "attn_q.weight"].T).reshape(T, H, hd), pos, theta, hd)
        k = rope_norm((h @ W[p + "attn_k.weight"].T).reshape(T, HKV, hd), pos, theta, hd)
        v = (h @ W[p + "attn_v.weight"].T).reshape(T, HKV, hd)
        g = H // HKV
        k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
        x = x + attn(q, k, v, 1 / np.sqrt(hd)).reshape(T, E) @ W[p + "attn_output.weight"].T
        h = rms(x, W[p + "ffn_norm.weight"], eps)
        x = x + (silu(h @ W[p + "ffn_gate.weight"].T) * (h @ W[p + "ffn_up.weight"].T)) @ W[p + "ffn_down.weight"].T
    x = rms(x, W["output_norm.weight"], eps)
    return x @ W.get("output.weight", W["token_embd.weight"]).T


def fwd_qwen3(kv, W, toks):
    """Dense Qwen3 (llama.cpp src/models/qwen3.cpp): pre-norm blocks, GQA, per-head RMS norm of q and k
    (attn_q_norm / attn_k_norm, size head_dim) after the projections and before rope NEOX, SwiGLU FFN,
    output_norm, head = output.weight or tied token_embd. Attention scale 1/sqrt(head_dim)."""
    A = "qwen3"
    E, H, HKV, L = kv[f"{A}.embedding_length"], kv[f"{A}.attention.head_count"], kv[f"{A}.attention.head_count_kv"], kv[f"{A}.block_count"]
    eps, theta = kv[f"{A}.attention.layer_norm_rms_epsilon"], kv.get(f"{A}.rope.freq_base", 10000.0)
    hd = kv.get(f"{A}.attention.key_length", E // H)
    assert kv.get(f"{A}.attention.value_length", hd) == hd, "qwen3: key_length != value_length"
    n_rot = kv.get(f"{A}.rope.dimension_count", hd)
    assert n_rot == hd, "qwen3 graph asserts n_rot == head_dim"
    T = len(toks); pos = np.arange(T, dtype=np.float64)
    x = W["token_embd.weight"][toks]
    for i in range(L):
        p = f"blk.{i}."
        h = rms(x, W[p + "attn_norm.weight"], eps)
        q = rms((h @ W[p + "attn_q.weight"].T).reshape(T, H, hd), W[p + "attn_q_norm.weight"], eps)
        k = rms((h @ W[p + "attn_k.weight"].T).reshape(T, HKV, hd), W[p + "attn_k_norm.weight"], eps)
        q, k = rope_neox(q, pos, theta, n_rot), rope_neox(k, pos, theta, n_rot)
        v = (h @ W[p + "attn_v.weight"].T).reshape(T, HKV, hd)
        g = H // HKV
        k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)   # query head j uses kv head j // g
        x = x + attn(q, k, v, 1 / np.sqrt(hd)).reshape(T, H * hd) @ W[p + "attn_output.weight"].T
        h = rms(x, W[p + "ffn_norm.weight"], eps)
        x = x + (silu(h @ W[p + "ffn_gate.weight"].T) * (h @ W[p + "ffn_up.weight"].T)) @ W[p + "ffn_down.weight"].T
    x = rms(x, W["output_norm.weight"], eps)
    return x @ W.get("output.weight", W["token_embd.weight"]).T


def fwd_deepseek2(kv, W, toks):
    A = "deepseek2"
    E, H, L = kv[f"{A}.embedding_length"], kv[f"{A}.attention.head_count"], kv[f"{A}.block_count"]
    eps, theta = kv[f"{A}.attention.layer_norm_rms_epsilon"], kv[f"{A}.rope.freq_base"]
    rope = kv[f"{A}.rope.dimension_count"]; kvl = kv[f"{A}.attention.kv_lora_rank"]
    if f"{A}.attention.key_length_mla" in kv:
        dk, dv = kv[f"{A}.attention.key_length_mla"], kv[f"{A}.attention.value_length_mla"]
    else:
        dk, dv = kv[f"{A}.attention.key_length"], kv[f"{A}.attention.value_length"]
    nope = dk - rope
    n_dense = kv.get(f"{A}.leading_dense_block_count", 0)
    k_used = kv[f"{A}.expert_used_count"]; scale_w = kv.get(f"{A}.expert_weights_scale", 1.0)
    norm_w = kv.get(f"{A}.expert_weights_norm", False)
    assert kv.get(f"{A}.expert_gating_func", 1) == 1, "only softmax gating implemented"
    T = len(toks); pos = np.arange(T, dtype=np.float64)
    x = W["token_embd.weight"][toks]
    for i in range(L):
        p = f"blk.{i}."
        h = rms(x, W[p + "attn_norm.weight"], eps)
        if p + "attn_q_a.weight" in W:
            q = rms(h @ W[p + "attn_q_a.weight"].T, W[p + "attn_q_a_norm.weight"], eps) @ W[p + "attn_q_b.weight"].T
        else:
            q = h @ W[p + "attn_q.weight"].T
        q = q.reshape(T, H, dk)
        q_nope, q_pe = q[..., :nope], rope_norm(q[..., nope:], pos, theta, rope)
        ckv = h @ W[p + "attn_kv_a_mqa.weight"].T
        c, k_pe = rms(ckv[:, :kvl], W[p + "attn_kv_a_norm.weight"], eps), ckv[:, kvl:]
        k_pe = rope_norm(k_pe[:, None, :], pos, theta, rope)          # (T,1,rope)
        if p + "attn_kv_b.weight" in W:
            kvb = (c @ W[p + "attn_kv_b.weight"].T).reshape(T, H, nope + dv)
            k_nope, v = kvb[..., :nope], kvb[..., nope:]
        else:
            k_nope = np.einsum("tc,hcn->thn", c, W[p + "attn_k_b.weight"])   # k_b numpy [H, kvl, nope]
            v = np.einsum("tc,hvc->thv", c, W[p + "attn_v_b.weight"])        # v_b numpy [H, dv, kvl]
        K = np.concatenate([k_nope, np.repeat(k_pe, H, axis=1)], -1)
        Q = np.concatenate([q_nope, q_pe], -1)
        o = attn(Q, K, v, 1 / np.sqrt(dk)).reshape(T, H * dv)
        x = x + o @ W[p + "attn_output.weight"].T
        h = rms(x, W[p + "ffn_norm.weight"], eps)
        if i < n_dense:
            f = (silu(h @ W[p + "ffn_gate.weight"].T) * (h @ W[p + "ffn_up.weight"].T)) @ W[p + "ffn_down.weight"].T
        else:
            lg = h @ W[p + "ffn_gate_inp.weight"].T
            pr = np.exp(lg - lg.max(-1, keepdims=True)); pr /= pr.sum(-1, keepdims=True)
            f = np.zeros_like(h)
            for t in range(T):
                sel = np.argsort(-pr[t], kind="stable")[:k_used]
                wts = pr[t, sel]
                if norm_w:
                    wts = wts / wts.sum()
                wts = wts * scale_w
                for e, we in zip(sel, wts):
                    g = silu(W[p + "ffn_gate_exps.weight"][e] @ h[t]) * (W[p + "ffn_up_exps.weight"][e] @ h[t])
                    f[t] += we * (W[p + "ffn_down_exps.weight"][e] @ g)
            f += (silu(h @ W[p + "ffn_gate_shexp.weight"].T) * (h @ W[p + "ffn_up_shexp.weight"].T)) @ W[p + "ffn_down_shexp.weight"].T
        x = x + f
    x = rms(x, W["output_norm.weight"], eps)
    return x @ W.get("output.weight", W["token_embd.weight"]).T


FWD = {"llama": fwd_llama, "qwen3": fwd_qwen3, "deepseek2": fwd_deepseek2}


def read_tokens(prefix):
    lines = [l.strip() for l in open(prefix + ".tokens.txt", encoding="latin-1") if l.strip() and not l.startswith("#")]
    return [int(v) for v in lines[0].split(",")], [int(v) for v in lines[1].split(",")]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--golden", nargs="+", required=True, help="golden prefixes (…/ml_x) sharing this model")
    ap.add_argument("--act", default="auto")
    ap.add_argument("--q8-lmhead", action="store_true")
    a = ap.parse_args()
    arch = arch_of(a.model)
    for g in a.golden:
        prompt, gen = read_tokens(g)
        seq = prompt + gen
        if arch in FWD:
            kv, W = load_any(a.model)
            logits = FWD[arch](kv, W, seq)
        elif arch in ("bitnet", "bitnet-b1.58", "bitnet-25"):
            hp, W = bref.load(a.model)
            act = a.act if a.act != "auto" else ("silu" if hp["arch"] == "bitnet" else "relu2")
            logits = bref.forward(hp, W, seq, act, a.q8_lmhead)
        else:
            sys.exit(f"no float64 reference for arch {arch}")
        n = len(prompt)
        pl, gl = np.load(g + ".prompt_logits.npy"), np.load(g + ".gen_logits.npy")
        dp, dg = np.abs(logits[:n] - pl), np.abs(logits[n:n + len(gl)] - gl)
        am = (logits[:n + len(gl)].argmax(-1) == np.concatenate([pl, gl]).argmax(-1)).mean()
        print(f"{os.path.basename(g)}: prompt maxabs {dp.max():.5f} | gen maxabs {dg.max():.5f} | rms {np.sqrt(np.concatenate([dp, dg]).__pow__(2).mean()):.5f} "
              f"| logit std {pl.std():.2f} | argmax agree {am*100:.0f}%")


if __name__ == "__main__":
    main()
