#!/usr/bin/env python3
"""float64 numpy reference forward pass for the tiny fixture GGUFs: arch llama, qwen3 (dense), qwen3moe, deepseek2
(both MLA tensor formats, with or without q_lora; V2 softmax or V3 sigmoid + bias + group-limited routing; YaRN
rope scaling), and bitnet / bitnet-b1.58 (delegates to bitnet_ref_forward.forward).
Formulas follow mainline llama.cpp 3f545be; docs/spec/moe.md writes them out.

Compares against a golden produced by the dump_logits harness: runs prompt + the 16 greedy ids read from
PREFIX.tokens.txt in one pass and compares rows [0, n_prompt) with PREFIX.prompt_logits.npy and rows
[n_prompt, n_prompt+16) with PREFIX.gen_logits.npy (gen row g = logits after feeding generated id g).
Weights are dequantized exactly (gguf.quants); activations stay float64, so differences to llama.cpp
include its on-the-fly activation rounding (F16 for F16 weights, Q8_0/Q8_K for quantized weights) and,
for ik, the F16 KV cache.  --q8-lmhead emulates the Q8_0 rounding of the final hidden state (bitnet
files with Q4_0 token_embd).  --emulate-act rounds every matmul input of the llama / qwen3 / qwen3moe / deepseek2
graphs as ggml-cpu does (F16 weights: fp16; Q8_0/Q4_0/Q5_0/IQ4_NL weights: Q8_0 blocks), which reproduces
mainline's logits to ~1e-6 until a rounding lands on a tie (diagnostic; make_ref64.py does not use it).

Files with tensor types the gguf package cannot parse (Q2_0 = GGML type 42) are read by a small built-in
GGUF parser (load_raw) that dequantizes Q2_0 itself and hands every other type to gguf.quants.

usage: ref_forward_tiny.py MODEL.gguf --golden PREFIX [--act silu|relu2] [--q8-lmhead] [--emulate-act]
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
    TYPES.clear()
    for t in r.tensors:
        TYPES[t.name] = int(t.tensor_type)
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
    TYPES.clear()
    for name, ne, ty, off in tens:
        TYPES[name] = ty
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


TYPES = {}        # tensor name -> GGML type id of the file last loaded (load / load_raw fill it)
EMULATE_ACT = False   # --emulate-act: round matmul inputs as ggml-cpu does before the dot product (diagnostic only)
_QTYPES_Q8_0 = {2, 3, 6, 7, 8, 20}   # Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 IQ4_NL: vec_dot_type Q8_0


def act_round(x, wtype):
    """The activation rounding of ggml-cpu mul_mat for weights of type wtype: F32 none, F16 -> fp16,
    Q8_0-family -> Q8_0 blocks of 32 (d = amax/127 kept as fp16, q = round(x*127/amax))."""
    if wtype in (None, 0):
        return x
    if wtype == 1:
        return x.astype(np.float16).astype(np.float64)
    if wtype in _QTYPES_Q8_0:
        b = x.reshape(*x.shape[:-1], -1, 32)
        amax = np.abs(b).max(-1, keepdims=True)
        q = np.rint(b * np.where(amax > 0, 127.0 / np.where(amax > 0, amax, 1.0), 0.0))
        d = (amax / 127.0).astype(np.float32).astype(np.float16).astype(np.float64)
        return (q * d).reshape(x.shape)
    raise NotImplementedError(f"--emulate-act: activation rounding for GGML type {wtype}")


def mm(x, W, name, e=None):
    """x @ W[name].T (or expert / head e of a 3-D tensor); with EMULATE_ACT the rows of x are first rounded
    like ggml-cpu rounds them for that weight type."""
    w = W[name] if e is None else W[name][e]
    if EMULATE_ACT:
        x = act_round(x, TYPES.get(name))
    return x @ w.T


def rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def rope_scaling(kv, A, n_rot):
    """Rope scaling as mainline 3f545be resolves it (llama-model.cpp load_hparams, llama-context.cpp
    llama_context ctor, ggml.c ggml_rope_yarn_corr_dims). Returns None without scaling, else a dict:
    freq_scale = 1/factor, ext_factor (1 for yarn, 0 for linear), corr (low, high) pair indices,
    attn_factor (the value the graph passes to ggml_rope_ext) and log_mul (the arch's yarn_log_multiplier
    as hparams hold it: deepseek2 divides the GGUF value by 0.1 at load)."""
    typ = kv.get(f"{A}.rope.scaling.type", "linear")
    factor = kv.get(f"{A}.rope.scaling.factor", kv.get(f"{A}.rope.scale_linear", 0.0))
    freq_scale = 1.0 if typ == "none" or factor == 0.0 else 1.0 / factor
    factor = 1.0 / freq_scale
    ext = 1.0 if typ == "yarn" else 0.0
    log_mul = kv.get(f"{A}.rope.scaling.yarn_log_multiplier", 0.0)
    if A == "deepseek2" and f"{A}.rope.scaling.yarn_log_multiplier" in kv:
        log_mul = log_mul / 0.1          # [TAG_DEEPSEEK2_YARN_LOG_MUL_FIX]: cancels the converter's 0.1
    attn_factor = 1.0
    if ext != 0.0:
        def get_mscale(s, m):
            return 1.0 if s <= 1.0 else 0.1 * m * np.log(s) + 1.0
        if log_mul != 0.0:
            m, m_all = 1.0, log_mul
            if A == "deepseek2" and m_all != 1.0:
                m = m_all
            attn_factor = get_mscale(factor, m) / get_mscale(factor, m_all)
        else:
            attn_factor = get_mscale(factor, 1.0)
        attn_factor /= 1.0 + 0.1 * np.log(factor)   # ggml's rope multiplies this back in
    attn_factor *= kv.get(f"{A}.rope.scaling.attn_factor", 1.0)
    if freq_scale == 1.0 and attn_factor == 1.0:
        return None                                  # plain rope (yarn with factor 1 is a no-op too)
    n_ctx_orig = kv.get(f"{A}.rope.scaling.original_context_length", kv[f"{A}.context_length"])
    base = kv.get(f"{A}.rope.freq_base", 10000.0)
    beta_fast, beta_slow = 32.0, 1.0     # llama_hparams defaults; deepseek2 reads no override keys

    def corr_dim(beta):
        return n_rot * np.log(n_ctx_orig / (beta * 2 * np.pi)) / (2 * np.log(base))
    corr = (max(0.0, np.floor(corr_dim(beta_fast))), min(n_rot - 1.0, np.ceil(corr_dim(beta_slow))))
    return dict(freq_scale=freq_scale, ext_factor=ext, corr=corr, attn_factor=attn_factor, log_mul=log_mul)


def rope_cos_sin(pos, theta, n_rot, yarn=None):
    """cos/sin (T, n_rot/2) for pair i (frequency theta^(-2i/n_rot)), ggml-cpu rope_yarn: with YaRN the angle
    mixes interpolated (freq_scale * angle) and extrapolated (angle) by ramp(i) * ext_factor, and both cos and sin
    carry mscale = attn_factor * (1 + 0.1 ln(1/freq_scale)) when ext_factor != 0 (attn_factor alone otherwise)."""
    i = np.arange(n_rot // 2, dtype=np.float64)
    ang = pos[:, None] * (theta ** (-2.0 * i / n_rot))[None, :]
    if yarn is None:
        return np.cos(ang), np.sin(ang)
    fs, ext = yarn["freq_scale"], yarn["ext_factor"]
    ang_i, mscale = fs * ang, yarn["attn_factor"]
    if ext != 0.0:
        lo, hi = yarn["corr"]
        ramp = 1.0 - np.clip((i - lo) / max(0.001, hi - lo), 0.0, 1.0)   # 1 for fast pairs (i <= lo): extrapolate
        mix = ramp * ext
        ang_i = ang_i * (1.0 - mix) + ang * mix
        mscale = mscale * (1.0 + 0.1 * np.log(1.0 / fs))
    return np.cos(ang_i) * mscale, np.sin(ang_i) * mscale


def rope_norm(x, pos, theta, n_rot, yarn=None):
    # x: (..., T, n, d) with d == n_rot here; adjacent pairs (2i, 2i+1)
    c, s = rope_cos_sin(pos, theta, n_rot, yarn)
    c, s = c[:, None, :], s[:, None, :]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = x0 * c - x1 * s
    out[..., 1::2] = x0 * s + x1 * c
    return out


def rope_neox(x, pos, theta, n_rot, yarn=None):
    # x: (T, n, d); NEOX / rotate-half: pairs (i, i + n_rot/2) for i < n_rot/2, dims >= n_rot untouched
    half = n_rot // 2
    c, s = rope_cos_sin(pos, theta, n_rot, yarn)
    c, s = c[:, None, :], s[:, None, :]
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


def swiglu_ffn(h, W, p, tag=""):
    """down(silu(gate h) * up h) with blk.N.ffn_{gate,up,down}{tag}.weight (dense FFN or shared expert)."""
    a = silu(mm(h, W, p + f"ffn_gate{tag}.weight")) * mm(h, W, p + f"ffn_up{tag}.weight")
    return mm(a, W, p + f"ffn_down{tag}.weight")


ROUTE_LOG = []   # (layer, token, margin) of every routing decision: gap between the k-th and (k+1)-th selection score


def moe_ffn(h, W, p, n_used, gating=1, norm_w=False, w_scale=0.0, n_groups=0, n_group_used=0):
    """Routed experts as mainline llama-graph.cpp build_moe_ffn computes them (3f545be):
    logits = ffn_gate_inp h; probs = softmax (gating 1) or sigmoid (gating 2) of the logits;
    selection = probs + exp_probs_b (if present; the weights use the unbiased probs);
    with n_groups > 1: experts e = g*(n/n_groups) + j form group g, group score = sum of its 2 largest selection
    values, the n_group_used best groups are kept, the others' selection set to -inf;
    selected = top n_used of selection; w = probs[selected]; norm_w: w /= max(sum w, 6.103515625e-5);
    w *= w_scale unless w_scale is 0 or 1; out = sum_e w_e down_e(silu(gate_e h) * up_e h)."""
    T = h.shape[0]
    lg = mm(h, W, p + "ffn_gate_inp.weight")                      # (T, n_expert)
    if gating == 1:
        probs = np.exp(lg - lg.max(-1, keepdims=True)); probs /= probs.sum(-1, keepdims=True)
    elif gating == 2:
        probs = 1.0 / (1.0 + np.exp(-lg))
    else:
        raise NotImplementedError(f"expert_gating_func {gating}")
    sel = probs + W[p + "exp_probs_b.bias"] if p + "exp_probs_b.bias" in W else probs.copy()
    n_exp = probs.shape[1]
    if n_groups > 1:
        g = sel.reshape(T, n_groups, n_exp // n_groups)
        gscore = np.sort(g, axis=-1)[..., -2:].sum(-1)             # (T, n_groups)
        keep = np.argsort(-gscore, axis=-1, kind="stable")[:, :n_group_used]
        masked = np.full_like(g, -np.inf)
        np.put_along_axis(masked, keep[..., None], np.take_along_axis(g, keep[..., None], 1), 1)
        gs = np.sort(gscore, -1)[:, ::-1]
        for t in range(T):
            ROUTE_LOG.append((p + "group", t, gs[t, n_group_used - 1] - gs[t, n_group_used]))
        sel = masked.reshape(T, n_exp)
    f = np.zeros_like(h)
    for t in range(T):
        order = np.argsort(-sel[t], kind="stable")
        top = order[:n_used]
        nxt = sel[t, order[n_used]] if n_used < n_exp else -np.inf
        ROUTE_LOG.append((p + "topk", t, sel[t, top[-1]] - nxt))
        w = probs[t, top]
        if norm_w:
            w = w / max(w.sum(), 6.103515625e-5)
        if w_scale != 0.0 and w_scale != 1.0:
            w = w * w_scale
        for e, we in zip(top, w):
            a = silu(mm(h[t], W, p + "ffn_gate_exps.weight", e)) * mm(h[t], W, p + "ffn_up_exps.weight", e)
            f[t] += we * mm(a, W, p + "ffn_down_exps.weight", e)
    return f


def fwd_llama(kv, W, toks):
    A = "llama"
    E, H, HKV, L = kv[f"{A}.embedding_length"], kv[f"{A}.attention.head_count"], kv[f"{A}.attention.head_count_kv"], kv[f"{A}.block_count"]
    eps, theta = kv[f"{A}.attention.layer_norm_rms_epsilon"], kv[f"{A}.rope.freq_base"]
    hd = E // H; T = len(toks); pos = np.arange(T, dtype=np.float64)
    x = W["token_embd.weight"][toks]
    for i in range(L):
        p = f"blk.{i}."
        h = rms(x, W[p + "attn_norm.weight"], eps)
        q = rope_norm(mm(h, W, p + "attn_q.weight").reshape(T, H, hd), pos, theta, hd)
        k = rope_norm(mm(h, W, p + "attn_k.weight").reshape(T, HKV, hd), pos, theta, hd)
        v = mm(h, W, p + "attn_v.weight").reshape(T, HKV, hd)
        g = H // HKV
        k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
        x = x + mm(attn(q, k, v, 1 / np.sqrt(hd)).reshape(T, E), W, p + "attn_output.weight")
        h = rms(x, W[p + "ffn_norm.weight"], eps)
        x = x + swiglu_ffn(h, W, p)
    x = rms(x, W["output_norm.weight"], eps)
    return mm(x, W, "output.weight" if "output.weight" in W else "token_embd.weight")


def fwd_qwen3(kv, W, toks, A="qwen3"):
    """Qwen3 dense (llama.cpp src/models/qwen3.cpp) and Qwen3-MoE (src/models/qwen3moe.cpp, A="qwen3moe"):
    pre-norm blocks, GQA, per-head RMS norm of q and k (attn_q_norm / attn_k_norm, size head_dim) after the
    projections and before rope NEOX, output_norm, head = output.weight or tied token_embd; attention scale
    1/sqrt(head_dim) (head_dim = attention.key_length, may differ from n_embd/n_head).
    FFN: dense SwiGLU (qwen3) or, in every qwen3moe layer, routed experts with softmax gating and the top-k
    weights always renormalised (build_moe_ffn norm_w = true), no shared expert."""
    E, H, HKV, L = kv[f"{A}.embedding_length"], kv[f"{A}.attention.head_count"], kv[f"{A}.attention.head_count_kv"], kv[f"{A}.block_count"]
    eps, theta = kv[f"{A}.attention.layer_norm_rms_epsilon"], kv.get(f"{A}.rope.freq_base", 10000.0)
    hd = kv.get(f"{A}.attention.key_length", E // H)
    assert kv.get(f"{A}.attention.value_length", hd) == hd, f"{A}: key_length != value_length"
    n_rot = kv.get(f"{A}.rope.dimension_count", hd)
    assert n_rot == hd, f"{A} graph asserts n_rot == head_dim"
    assert rope_scaling(kv, A, n_rot) is None, f"{A}: rope scaling not covered (only checked for deepseek2)"
    T = len(toks); pos = np.arange(T, dtype=np.float64)
    x = W["token_embd.weight"][toks]
    for i in range(L):
        p = f"blk.{i}."
        h = rms(x, W[p + "attn_norm.weight"], eps)
        q = rms(mm(h, W, p + "attn_q.weight").reshape(T, H, hd), W[p + "attn_q_norm.weight"], eps)
        k = rms(mm(h, W, p + "attn_k.weight").reshape(T, HKV, hd), W[p + "attn_k_norm.weight"], eps)
        q, k = rope_neox(q, pos, theta, n_rot), rope_neox(k, pos, theta, n_rot)
        v = mm(h, W, p + "attn_v.weight").reshape(T, HKV, hd)
        g = H // HKV
        k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)   # query head j uses kv head j // g
        x = x + mm(attn(q, k, v, 1 / np.sqrt(hd)).reshape(T, H * hd), W, p + "attn_output.weight")
        h = rms(x, W[p + "ffn_norm.weight"], eps)
        if A == "qwen3moe":
            x = x + moe_ffn(h, W, p, kv[f"{A}.expert_used_count"], gating=1, norm_w=True,
                            w_scale=0.0,   # qwen3moe passes hparams.expert_weights_scale, never read for it: 0 = none
                            n_groups=kv.get(f"{A}.expert_group_count", 0), n_group_used=kv.get(f"{A}.expert_group_used_count", 0))
        else:
            x = x + swiglu_ffn(h, W, p)
    x = rms(x, W["output_norm.weight"], eps)
    return mm(x, W, "output.weight" if "output.weight" in W else "token_embd.weight")


def fwd_qwen3moe(kv, W, toks):
    return fwd_qwen3(kv, W, toks, A="qwen3moe")


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
    k_used = kv[f"{A}.expert_used_count"]; scale_w = kv.get(f"{A}.expert_weights_scale", 0.0)
    norm_w = kv.get(f"{A}.expert_weights_norm", False)
    gating = kv.get(f"{A}.expert_gating_func", 0) or 1     # 0 (key absent) = softmax for V2 / V2.5 files
    n_groups, n_group_used = kv.get(f"{A}.expert_group_count", 0), kv.get(f"{A}.expert_group_used_count", 0)
    yarn = rope_scaling(kv, A, rope)
    # src/models/deepseek2.cpp: undo the rope attn_factor adjustment, then pre-scale kq_scale by mscale^2
    fs = yarn["freq_scale"] if yarn else 1.0
    attn_factor = yarn["attn_factor"] if yarn else kv.get(f"{A}.rope.scaling.attn_factor", 1.0)
    attn_factor_org = attn_factor * (1.0 + 0.1 * np.log(1.0 / fs))
    mscale = attn_factor_org * (1.0 + 0.1 * (yarn["log_mul"] if yarn else 0.0) * np.log(1.0 / fs))
    kq_scale = mscale * mscale / np.sqrt(dk)
    T = len(toks); pos = np.arange(T, dtype=np.float64)
    x = W["token_embd.weight"][toks]
    for i in range(L):
        p = f"blk.{i}."
        h = rms(x, W[p + "attn_norm.weight"], eps)
        if p + "attn_q_a.weight" in W:
            q = mm(rms(mm(h, W, p + "attn_q_a.weight"), W[p + "attn_q_a_norm.weight"], eps), W, p + "attn_q_b.weight")
        else:
            q = mm(h, W, p + "attn_q.weight")
        q = q.reshape(T, H, dk)
        q_nope, q_pe = q[..., :nope], rope_norm(q[..., nope:], pos, theta, rope, yarn)
        ckv = mm(h, W, p + "attn_kv_a_mqa.weight")
        c, k_pe = rms(ckv[:, :kvl], W[p + "attn_kv_a_norm.weight"], eps), ckv[:, kvl:]
        k_pe = rope_norm(k_pe[:, None, :], pos, theta, rope, yarn)    # (T,1,rope)
        if p + "attn_kv_b.weight" in W:
            # legacy: decompress per head [k_nope | v] and run MHA (deepseek2.cpp, !is_mla branch)
            kvb = mm(c, W, p + "attn_kv_b.weight").reshape(T, H, nope + dv)
            k_nope, v = kvb[..., :nope], kvb[..., nope:]
            K = np.concatenate([k_nope, np.repeat(k_pe, H, axis=1)], -1)
            Q = np.concatenate([q_nope, q_pe], -1)
            o = attn(Q, K, v, kq_scale).reshape(T, H * dv)
        else:
            # split: absorbed MQA over the latent (deepseek2.cpp, is_mla branch): q_abs[h] = k_b[h]^T q_nope[h] (kvl),
            # scores = q_abs . c + q_pe . k_pe, out_latent = softmax . c, out[h] = v_b[h] out_latent[h]
            q_abs = np.stack([mm(q_nope[:, j], W, p + "attn_k_b.weight", j) for j in range(H)], 1)   # (T,H,kvl)
            Q = np.concatenate([q_abs, q_pe], -1)
            K = np.concatenate([c[:, None, :], k_pe], -1)                    # (T,1,kvl+rope), shared by all heads
            o_lat = attn(Q, np.repeat(K, H, axis=1), np.repeat(c[:, None, :], H, axis=1), kq_scale)   # (T,H,kvl)
            o = np.stack([mm(o_lat[:, j], W, p + "attn_v_b.weight", j) for j in range(H)], 1).reshape(T, H * dv)
        x = x + mm(o, W, p + "attn_output.weight")
        h = rms(x, W[p + "ffn_norm.weight"], eps)
        if i < n_dense:
            f = swiglu_ffn(h, W, p)
        else:
            f = moe_ffn(h, W, p, k_used, gating, norm_w, scale_w, n_groups, n_group_used) + swiglu_ffn(h, W, p, "_shexp")
        x = x + f
    x = rms(x, W["output_norm.weight"], eps)
    return mm(x, W, "output.weight" if "output.weight" in W else "token_embd.weight")


FWD = {"llama": fwd_llama, "qwen3": fwd_qwen3, "qwen3moe": fwd_qwen3moe, "deepseek2": fwd_deepseek2}


def read_tokens(prefix):
    lines = [l.strip() for l in open(prefix + ".tokens.txt", encoding="latin-1") if l.strip() and not l.startswith("#")]
    return [int(v) for v in lines[0].split(",")], [int(v) for v in lines[1].split(",")]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--golden", nargs="+", required=True, help="golden prefixes (…/ml_x) sharing this model")
    ap.add_argument("--act", default="auto")
    ap.add_argument("--q8-lmhead", action="store_true")
    ap.add_argument("--emulate-act", action="store_true", help="round matmul inputs as ggml-cpu does (F16 -> fp16, "
                    "Q8_0-family -> Q8_0); diagnostic for quantized MoE files, whose routing flips otherwise")
    a = ap.parse_args()
    global EMULATE_ACT
    EMULATE_ACT = a.emulate_act
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
        print(f"{os.path.basename(g)}: " + fmt_compare(compare(logits, g, len(prompt))))


def compare(logits, prefix, n):
    """Distances between reference logits (rows: prompt then gen) and the golden PREFIX.{prompt,gen}_logits.npy:
    max |diff| on prompt and gen rows, rms, argmax agreement, mean over rows of KL(softmax golden || softmax ref)."""
    pl, gl = np.load(prefix + ".prompt_logits.npy"), np.load(prefix + ".gen_logits.npy")
    gold = np.concatenate([pl, gl]).astype(np.float64)
    ref = np.asarray(logits[:n + len(gl)], dtype=np.float64)
    d = np.abs(ref - gold)

    def logsm(z):
        z = z - z.max(-1, keepdims=True)
        return z - np.log(np.exp(z).sum(-1, keepdims=True))
    lg, lr = logsm(gold), logsm(ref)
    kl = (np.exp(lg) * (lg - lr)).sum(-1)
    return dict(prompt=d[:n].max(), gen=d[n:].max(), rms=np.sqrt((d * d).mean()), std=pl.std(),
                agree=(ref.argmax(-1) == gold.argmax(-1)).mean(), kl=kl.mean(), kl_max=kl.max())


def fmt_compare(c):
    return (f"prompt maxabs {c['prompt']:.5f} | gen maxabs {c['gen']:.5f} | rms {c['rms']:.5f} | logit std {c['std']:.2f} "
            f"| argmax agree {c['agree']*100:.0f}% | KL(golden||ref) mean {c['kl']:.2e} max {c['kl_max']:.2e}")


if __name__ == "__main__":
    main()
