#!/usr/bin/env python3
"""Train tern's demo model: a small BitNet b1.58 on the King James Bible.

The architecture is BitNet b1.58 2B-4T scaled down (RMSNorm pre-norms, sub-norms
before attn_output and ffn_down, relu² gated FFN, GQA, NEOX rope, tied
embeddings). Training is quantization-aware as in the BitNet b1.58 paper:
absmean ternary weights and per-token absmax int8 activations, both through a
straight-through estimator.

Outputs (in --out-dir):
  tokenizer.json               the byte-level BPE (HF tokenizers format)
  tern-demo-kjv-tq2_0.gguf      arch bitnet-b1.58, ternary weights TQ2_0, F16 embeddings
  train-log.txt                 losses, held-out perplexity, baseline, samples

The held-out perplexity is computed the way llama.cpp's perplexity tool does it
(and `tern perplexity`): the held-out text is tokenized as one string with BOS,
cut into non-overlapping chunks of --ctx tokens whose first token is replaced
by BOS, and only the second half of each chunk is scored. The model evaluated
is the exported one: fp16-rounded embeddings and weight scales, int8
activations rounded half to even, float32 everywhere else.
"""
import argparse
import json
import math
import os
import sys
import time

import gguf  # imported first so a missing package fails before training
import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

LLAMA3_RE = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"


# ---------------------------------------------------------------------------------------------
# Tokenizer: byte-level BPE with the llama3 pre-tokenizer, stored as a "gpt2" vocab.


def bytes_to_unicode():
    """GPT-2's reversible byte -> printable unicode map."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def train_tokenizer(text_path, n_vocab):
    """Returns (tokens, merges, hf_tokenizer): ids 0..255 are bytes, then one
    token per merge in rank order, then BOS and EOS."""
    b2u = bytes_to_unicode()
    alphabet = [b2u[b] for b in range(256)]
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_RE), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre
    tr = trainers.BpeTrainer(vocab_size=n_vocab - 2, initial_alphabet=alphabet, special_tokens=[],
                             show_progress=False, min_frequency=2)
    tok.train([text_path], tr)
    merges = json.loads(tok.to_str())["model"]["merges"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in merges]
    tokens = list(alphabet)
    for l, r in merges:
        tokens.append(l + r)
    tokens += [BOS, EOS]
    # ignore_merges: a pre-token that is itself in the vocab is emitted whole,
    # as llama.cpp (and tern) do for the llama3 pre-tokenizer.
    vocab = {t: i for i, t in enumerate(tokens[:-2])}
    hf = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=True))
    hf.pre_tokenizer = pre
    hf.decoder = decoders.ByteLevel()
    return tokens, merges, hf


def encode_text(hf, text, bos_id):
    return [bos_id] + hf.encode(text).ids


# ---------------------------------------------------------------------------------------------
# Model


def weight_quant(w):
    """Absmean ternary: W ≈ s · clamp(round(W / s), -1, 1), s = mean|W| (per tensor)."""
    s = w.abs().mean().clamp(min=1e-5)
    return (w / s).round().clamp(-1, 1), s


def act_quant(x):
    """Per-token absmax int8, round half to even (torch.round)."""
    s = 127.0 / x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-5)
    return (x * s).round().clamp(-128, 127) / s


class BitLinear(torch.nn.Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(n_out, n_in) * (2.0 / (n_in + n_out)) ** 0.5)
        self.export_scale = None  # set for exact evaluation of the exported model

    def forward(self, x):
        x32 = x.float()
        w32 = self.weight.float()
        t, s = weight_quant(w32)
        if self.export_scale is not None:
            s = self.export_scale
        xq = x32 + (act_quant(x32) - x32).detach()
        wq = w32 + (t * s - w32).detach()
        return F.linear(xq, wq)


class RMSNorm(torch.nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        x = x.float()
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_neox(x, pos, theta):
    """x: (batch, heads, seq, head_dim); rotate pairs (i, i + d/2)."""
    d = x.shape[-1]
    inv = theta ** (-torch.arange(0, d // 2, device=x.device, dtype=torch.float64) * 2 / d)
    ang = (pos.double()[:, None] * inv[None, :]).float()
    cos, sin = ang.cos(), ang.sin()
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class Block(torch.nn.Module):
    def __init__(self, a):
        super().__init__()
        hd = a.dim // a.heads
        self.a = a
        self.attn_norm = RMSNorm(a.dim, a.eps)
        self.wq = BitLinear(a.dim, a.heads * hd)
        self.wk = BitLinear(a.dim, a.kv_heads * hd)
        self.wv = BitLinear(a.dim, a.kv_heads * hd)
        self.attn_sub_norm = RMSNorm(a.heads * hd, a.eps)
        self.wo = BitLinear(a.heads * hd, a.dim)
        self.ffn_norm = RMSNorm(a.dim, a.eps)
        self.w_gate = BitLinear(a.dim, a.ffn)
        self.w_up = BitLinear(a.dim, a.ffn)
        self.ffn_sub_norm = RMSNorm(a.ffn, a.eps)
        self.w_down = BitLinear(a.ffn, a.dim)

    def forward(self, x, pos):
        a = self.a
        B, T, _ = x.shape
        hd = a.dim // a.heads
        h = self.attn_norm(x)
        q = self.wq(h).view(B, T, a.heads, hd).transpose(1, 2)
        k = self.wk(h).view(B, T, a.kv_heads, hd).transpose(1, 2)
        v = self.wv(h).view(B, T, a.kv_heads, hd).transpose(1, 2)
        q, k = rope_neox(q, pos, a.rope_theta), rope_neox(k, pos, a.rope_theta)
        rep = a.heads // a.kv_heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        o = o.transpose(1, 2).reshape(B, T, a.heads * hd)
        x = x + self.wo(self.attn_sub_norm(o))
        h = self.ffn_norm(x)
        f = F.relu(self.w_gate(h)).pow(2) * self.w_up(h)
        return x + self.w_down(self.ffn_sub_norm(f))


class BitNet(torch.nn.Module):
    def __init__(self, a):
        super().__init__()
        self.embed = torch.nn.Embedding(a.vocab, a.dim)
        torch.nn.init.normal_(self.embed.weight, std=0.02)
        self.blocks = torch.nn.ModuleList(Block(a) for _ in range(a.layers))
        self.norm = RMSNorm(a.dim, a.eps)

    def forward(self, ids):
        x = self.embed(ids).float()
        pos = torch.arange(ids.shape[1], device=ids.device)
        for b in self.blocks:
            x = b(x, pos)
        # Tied head in full precision (as BitNet keeps lm_head out of quantization).
        return F.linear(self.norm(x), self.embed.weight.float())


# ---------------------------------------------------------------------------------------------
# Evaluation, llama.cpp-style perplexity


@torch.no_grad()
def perplexity(model, tokens, ctx, bos_id, device):
    first = ctx // 2
    nll, count = 0.0, 0
    for c in range(len(tokens) // ctx):
        chunk = list(tokens[c * ctx:(c + 1) * ctx])
        chunk[0] = bos_id
        ids = torch.tensor([chunk], device=device)
        logp = F.log_softmax(model(ids)[0].double(), dim=-1)
        tgt = ids[0, first + 1:]
        nll -= logp[first:ctx - 1].gather(1, tgt[:, None]).sum().item()
        count += ctx - 1 - first
    return math.exp(nll / count), count


def unigram_perplexity(train_tokens, eval_tokens, ctx, n_vocab):
    """Add-one smoothed unigram model scored on exactly the tokens perplexity() scores."""
    counts = np.bincount(np.asarray(train_tokens), minlength=n_vocab).astype(np.float64) + 1.0
    logp = np.log(counts / counts.sum())
    first = ctx // 2
    scored = [eval_tokens[c * ctx + j + 1] for c in range(len(eval_tokens) // ctx) for j in range(first, ctx - 1)]
    return math.exp(-logp[np.asarray(scored)].mean())


@torch.no_grad()
def sample(model, hf, prompt, bos_id, eos_id, n, device, temp=0.8, seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    ids = encode_text(hf, prompt, bos_id)
    for _ in range(n):
        logits = model(torch.tensor([ids], device=device))[0, -1].float() / temp
        nxt = torch.multinomial(F.softmax(logits, -1), 1, generator=g).item()
        if nxt == eos_id:
            break
        ids.append(nxt)
    return hf.decode(ids[1:])


# ---------------------------------------------------------------------------------------------
# Export


def export_gguf(model, a, tokens, merges, path):
    arch = "bitnet-b1.58"
    w = gguf.GGUFWriter(path, arch)
    w.add_name("tern demo: BitNet b1.58 on the King James Bible")
    w.add_type(gguf.GGUFType.MODEL)
    w.add_license("public domain text; model weights MIT")
    w.add_block_count(a.layers)
    w.add_context_length(a.ctx)
    w.add_embedding_length(a.dim)
    w.add_feed_forward_length(a.ffn)
    w.add_head_count(a.heads)
    w.add_head_count_kv(a.kv_heads)
    w.add_rope_freq_base(a.rope_theta)
    w.add_layer_norm_rms_eps(a.eps)
    w.add_rope_dimension_count(a.dim // a.heads)
    w.add_vocab_size(a.vocab)
    w.add_string(f"{arch}.hidden_activation", "relu2")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")
    w.add_token_list(tokens)
    w.add_token_types([int(gguf.TokenType.NORMAL)] * (len(tokens) - 2) + [int(gguf.TokenType.CONTROL)] * 2)
    w.add_token_merges([f"{l} {r}" for l, r in merges])
    w.add_bos_token_id(len(tokens) - 2)
    w.add_eos_token_id(len(tokens) - 1)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)

    def f32(t):
        return t.detach().float().cpu().numpy()

    def ternary(lin):
        t, s = weight_quant(lin.weight.detach().float())
        vals = (t * s).cpu().numpy().astype(np.float32)
        return gguf.quants.quantize(vals, gguf.GGMLQuantizationType.TQ2_0)

    w.add_tensor("token_embd.weight", f32(model.embed.weight).astype(np.float16))
    for i, b in enumerate(model.blocks):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", f32(b.attn_norm.weight))
        for name, lin in [("attn_q", b.wq), ("attn_k", b.wk), ("attn_v", b.wv), ("attn_output", b.wo),
                          ("ffn_gate", b.w_gate), ("ffn_up", b.w_up), ("ffn_down", b.w_down)]:
            w.add_tensor(p + name + ".weight", ternary(lin), raw_dtype=gguf.GGMLQuantizationType.TQ2_0)
        w.add_tensor(p + "attn_sub_norm.weight", f32(b.attn_sub_norm.weight))
        w.add_tensor(p + "ffn_norm.weight", f32(b.ffn_norm.weight))
        w.add_tensor(p + "ffn_sub_norm.weight", f32(b.ffn_sub_norm.weight))
    w.add_tensor("output_norm.weight", f32(model.norm.weight))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def freeze_as_exported(model):
    """Makes the model compute exactly what the exported file holds: fp16
    embeddings and fp16 weight scales (TQ2_0 stores its block scale as f16)."""
    with torch.no_grad():
        model.embed.weight.copy_(model.embed.weight.half().float())
        for b in model.blocks:
            for lin in [b.wq, b.wk, b.wv, b.wo, b.w_gate, b.w_up, b.w_down]:
                _, s = weight_quant(lin.weight.float())
                lin.export_scale = s.half().float()


# ---------------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", required=True, help="training text (Genesis..Philemon, one verse a line)")
    ap.add_argument("--heldout", required=True, help="held-out text (Hebrews..Revelation)")
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--layers", type=int, default=5)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--ffn", type=int, default=1536)
    ap.add_argument("--ctx", type=int, default=512, help="training and evaluation context")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--max-steps", type=int, default=2500)
    ap.add_argument("--time-budget", type=float, default=330.0, help="seconds of training before stopping")
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    ap.add_argument("--eps", type=float, default=1e-5)
    ap.add_argument("--seed", type=int, default=1234)
    a = ap.parse_args()
    os.makedirs(a.out_dir, exist_ok=True)
    log = open(os.path.join(a.out_dir, "train-log.txt"), "w")

    def say(*xs):
        msg = " ".join(str(x) for x in xs)
        print(msg, flush=True)
        log.write(msg + "\n")
        log.flush()

    torch.manual_seed(a.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    t0 = time.time()
    tokens, merges, hf = train_tokenizer(a.train, a.vocab)
    hf.save(os.path.join(a.out_dir, "tokenizer.json"))
    a.vocab = len(tokens)  # the trainer may find fewer merges than asked for
    bos_id, eos_id = a.vocab - 2, a.vocab - 1
    train_text = open(a.train, encoding="utf-8").read()
    heldout_text = open(a.heldout, encoding="utf-8").read()
    train_ids = encode_text(hf, train_text, bos_id)
    heldout_ids = encode_text(hf, heldout_text, bos_id)
    say(f"tokenizer: {a.vocab} tokens, {len(merges)} merges; train {len(train_ids)} tokens, "
        f"held-out {len(heldout_ids)} tokens ({time.time() - t0:.1f} s)")

    model = BitNet(a).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    n_ternary = sum(p.numel() for n, p in model.named_parameters() if n.endswith("weight") and p.dim() == 2 and "embed" not in n)
    say(f"model: {n_params / 1e6:.2f} M parameters ({n_ternary / 1e6:.2f} M ternary), device {device}")
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95))
    data = torch.tensor(train_ids, dtype=torch.long)
    gen = torch.Generator().manual_seed(a.seed)

    def lr_at(step, total):
        if step < a.warmup:
            return a.lr * (step + 1) / a.warmup
        progress = min(1.0, (step - a.warmup) / max(1, total - a.warmup))
        return a.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))

    best = (float("inf"), None, 0)
    t_train = time.time()
    step = 0
    # The schedule length is estimated from the first steps' speed so that the
    # cosine ends when the time budget does.
    total = a.max_steps
    while step < total:
        if step == 20:
            per_step = (time.time() - t_train) / 20
            total = min(a.max_steps, int(a.time_budget / per_step))
            say(f"{per_step * 1e3:.1f} ms/step -> {total} steps in the budget")
        starts = torch.randint(0, len(data) - a.ctx - 1, (a.batch,), generator=gen)
        batch = torch.stack([data[s:s + a.ctx + 1] for s in starts]).to(device)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, total)
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=device == "cuda"):
            logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, a.vocab), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % a.eval_every == 0 or step == total:
            model.eval()
            ppl, _ = perplexity(model, heldout_ids, a.ctx, bos_id, device)
            model.train()
            say(f"step {step}/{total} loss {loss.item():.4f} held-out ppl {ppl:.3f} ({time.time() - t_train:.0f} s)")
            if ppl < best[0]:
                best = (ppl, {k: v.detach().clone() for k, v in model.state_dict().items()}, step)
    train_time = time.time() - t_train
    model.load_state_dict(best[1])
    model.eval()
    say(f"training: {step} steps in {train_time:.1f} s; best held-out ppl {best[0]:.3f} at step {best[2]}")

    freeze_as_exported(model)
    ppl, n_scored = perplexity(model, heldout_ids, a.ctx, bos_id, device)
    uni = unigram_perplexity(train_ids, heldout_ids, a.ctx, a.vocab)
    say(f"held-out perplexity (exported model, ctx {a.ctx}, {len(heldout_ids) // a.ctx} chunks, "
        f"second half scored, {n_scored} tokens): {ppl:.4f}")
    say(f"unigram baseline on the same tokens: {uni:.2f}")
    for i, prompt in enumerate(["And God said", "In the beginning", "The LORD is my shepherd"]):
        say(f"sample {i}: {sample(model, hf, prompt, bos_id, eos_id, 60, device, seed=i)!r}")
    out = os.path.join(a.out_dir, "tern-demo-kjv-tq2_0.gguf")
    export_gguf(model, a, tokens, merges, out)
    say(f"wrote {out} ({os.path.getsize(out)} bytes); total {time.time() - t0:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
