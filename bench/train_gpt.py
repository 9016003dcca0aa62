#!/usr/bin/env python3
"""A small GPT trained with flash_steps.attention and with PyTorch SDPA from the same seed, weights and batches:
`python3 bench/train_gpt.py [--quick] [--head-dim 128]`. PASS when, in every window of --window steps, the
mean |loss(flash_steps) - loss(sdpa_flash)| is at most --k x the spread of the other SDPA backends + --eps, the
first gradients differ by at most max(--k x theirs, --grad-floor), and every run ends at least halfway from its
first loss to the entropy floor of the synthetic data. Details: bench/README.md.

--varlen [--sliding-window 256]: the same model, rule and language on packed documents of random lengths
(FlashAttention's varlen layout), causal within each document and a sliding window (left, 0):
flash_steps.varlen_attention against SDPA memory-efficient with an explicit block-diagonal, causal,
windowed mask (the reference) and SDPA math (and cuDNN, where it takes a mask) with the same mask.
"""
from __future__ import annotations

import bisect
import copy
import datetime
import itertools
import json
import math
import os
import random
import sys
import time
from pathlib import Path
from statistics import fmean as mean

import fs_results

TEST_RUN, REFERENCE_RUN = "flash_steps", "sdpa_flash"
SDPA_BACKENDS = fs_results.SDPA_BACKENDS
TEXT, DEFINE, RECALL = 0, 1, 2  # the generator's modes


# ---- the synthetic language (plain Python: the specification) -------------------------------------

class Language:
    """The language's constants and its Markov table, made from the seed with random.Random.

    Tokens 0 .. text_tokens-1 are text, text_tokens .. vocab-1 are the anchors. probs[prev][tok] is
    the Markov transition; row text_tokens is the start row (uniform), used before any text token.
    cum[prev] is its running sum with the entries from the last nonzero one on set to exactly 1.0, so
    that bisect_right(cum[prev], u) for u in [0, 1) always lands on a token of nonzero probability."""

    def __init__(self, seed: int, text_tokens: int = 48, anchors: int = 8, segment: int = 32,
                 p_anchor: float = 0.08, successors: int = 6):
        if not (0 < successors <= text_tokens and anchors > 0 and segment > 0 and 0 < p_anchor < 1):
            raise ValueError("Language: need 0 < successors <= text_tokens, anchors > 0, segment > 0 and "
                             "0 < p_anchor < 1")
        self.text_tokens, self.anchors, self.segment, self.p_anchor = text_tokens, anchors, segment, p_anchor
        self.vocab = text_tokens + anchors
        rng = random.Random(seed)
        self.probs = []
        for _ in range(text_tokens):
            row = [0.0] * text_tokens
            weights = [rng.expovariate(1.0) for _ in range(successors)]
            for tok, w in zip(rng.sample(range(text_tokens), successors), weights):
                row[tok] = w / sum(weights)
            self.probs.append(row)
        self.probs.append([1.0 / text_tokens] * text_tokens)  # the start row
        self.cum = []
        for row in self.probs:
            cum = list(itertools.accumulate(row))
            last = max(i for i, p in enumerate(row) if p > 0)
            self.cum.append(cum[:last] + [1.0] * (text_tokens - last))
        self.log_anchor = math.log(p_anchor / anchors)
        self.log_text = math.log(1.0 - p_anchor)

    def config(self) -> dict:
        return {"text_tokens": self.text_tokens, "anchors": self.anchors, "segment": self.segment,
                "p_anchor": self.p_anchor, "vocab": self.vocab}


def generate_sequence(lang: Language, uniforms) -> dict:
    """One sequence from one (u1, u2) pair of uniforms in [0, 1) per position: the specification that
    generate_batch follows with tensors. Returns lists: tokens, logp (the natural log of each token's
    probability given all the tokens before it), markov_logp (the same, but a copied token is charged
    what its source cost) and recall (whether the token is a copy).

    In TEXT mode, u1 < p_anchor draws anchor int(u1 / p_anchor * anchors); else u2 draws a text
    token from the Markov row of the last text token. An anchor seen for the first time switches to
    DEFINE for `segment` tokens (Markov text, no anchors); one seen before switches to RECALL for
    `segment` tokens, the copy of those that followed its first occurrence."""
    n_text, p, k = lang.text_tokens, lang.p_anchor, lang.anchors
    tokens, logp, markov_logp, recall = [], [], [], []
    prev, mode, left, src, first = n_text, TEXT, 0, 0, {}
    for t, (u1, u2) in enumerate(uniforms):
        anchor = None
        if mode == RECALL:
            tok, lp, mlp = tokens[src], 0.0, logp[src]
            src += 1
        elif mode == TEXT and u1 < p:
            anchor = min(int(u1 / p * k), k - 1)
            tok, lp = n_text + anchor, lang.log_anchor
            mlp = lp
        else:
            tok = min(bisect.bisect_right(lang.cum[prev], u2), n_text - 1)
            lp = math.log(lang.probs[prev][tok]) + (lang.log_text if mode == TEXT else 0.0)
            mlp = lp
        tokens.append(tok)
        logp.append(lp)
        markov_logp.append(mlp)
        recall.append(mode == RECALL)
        if mode != TEXT:
            left -= 1
            if left == 0:
                mode = TEXT
        if anchor is None:
            prev = tok
        else:
            left = lang.segment
            if anchor in first:
                mode, src = RECALL, first[anchor] + 1
            else:
                mode, first[anchor] = DEFINE, t
    return {"tokens": tokens, "logp": logp, "markov_logp": markov_logp, "recall": recall}


def generate_batch(torch, lang: Language, count: int, length: int, seed: int, device: str = "cpu") -> dict:
    """count sequences of length tokens, generate_sequence's rules on all of them at once (a loop over
    positions, tensors over sequences), from torch.rand(count, length, 2, float64) of a generator
    seeded with seed; the same uniforms given to generate_sequence give the same tokens. Returns
    tensors: tokens (int64), logp and markov_logp (float64), recall (bool), and the uniforms."""
    g = torch.Generator(device=device).manual_seed(seed)
    u = torch.rand(count, length, 2, generator=g, dtype=torch.float64, device=device)
    n_text, p, k = lang.text_tokens, lang.p_anchor, lang.anchors
    cum = torch.tensor(lang.cum, dtype=torch.float64, device=device)             # [n_text + 1, n_text]
    with_zeros = [[math.log(x) if x > 0 else -math.inf for x in row] for row in lang.probs]
    log_probs = torch.tensor(with_zeros, dtype=torch.float64, device=device)    # [n_text + 1, n_text]
    tokens = torch.zeros(count, length, dtype=torch.long, device=device)
    logp = torch.zeros(count, length, dtype=torch.float64, device=device)
    markov_logp = torch.zeros_like(logp)
    recall = torch.zeros(count, length, dtype=torch.bool, device=device)
    rows = torch.arange(count, device=device)
    prev = torch.full((count,), n_text, dtype=torch.long, device=device)
    mode = torch.full((count,), TEXT, dtype=torch.long, device=device)
    left = torch.zeros(count, dtype=torch.long, device=device)
    src = torch.zeros(count, dtype=torch.long, device=device)
    first = torch.full((count, k), -1, dtype=torch.long, device=device)
    for t in range(length):
        u1, u2 = u[:, t, 0], u[:, t, 1]
        is_text, is_recall = mode == TEXT, mode == RECALL
        drawn = torch.searchsorted(cum[prev], u2.unsqueeze(1).contiguous(), right=True).squeeze(1).clamp(max=n_text - 1)
        drawn_lp = log_probs[prev, drawn] + lang.log_text * is_text.double()
        anchor = is_text & (u1 < p)
        which = (u1 / p * k).long().clamp(max=k - 1)
        tok = torch.where(is_recall, tokens[rows, src], drawn)
        tok = torch.where(anchor, n_text + which, tok)
        lp = torch.where(is_recall, 0.0, torch.where(anchor, lang.log_anchor, drawn_lp))
        tokens[:, t], logp[:, t], recall[:, t] = tok, lp, is_recall
        markov_logp[:, t] = torch.where(is_recall, logp[rows, src], lp)
        # the state after this token, as generate_sequence updates it
        src = torch.where(is_recall, src + 1, src)
        in_segment = ~is_text
        left = torch.where(in_segment, left - 1, left)
        mode = torch.where(in_segment & (left == 0), TEXT, mode)
        prev = torch.where(anchor, prev, tok)
        seen = first[rows, which]
        new, old = anchor & (seen < 0), anchor & (seen >= 0)
        first[rows, which] = torch.where(new, t, seen)  # no boolean indexing: no host sync per position
        mode = torch.where(new, DEFINE, torch.where(old, RECALL, mode))
        left = torch.where(anchor, lang.segment, left)
        src = torch.where(old, seen + 1, src)
    return {"tokens": tokens, "logp": logp, "markov_logp": markov_logp, "recall": recall, "uniforms": u}


def floors(sum_logp: float, sum_markov_logp: float, counts: list[int]) -> dict:
    """The losses (nats per predicted token) of three ideal models on the predicted tokens (positions
    1.. of each sequence), from the sums of their logp and markov_logp and the count of each token:
    the entropy floor (the true conditional probabilities), the Markov floor (copied tokens charged
    their source's cost) and the unigram entropy (no context at all)."""
    n = sum(counts)
    unigram = -sum(c / n * math.log(c / n) for c in counts if c)
    return {"entropy_floor": -sum_logp / n, "markov_floor": -sum_markov_logp / n, "unigram_entropy": unigram}


# ---- packed documents (plain Python: the specification) -------------------------------------------------

def document_lengths(rng: random.Random, total: int, min_len: int, max_len: int) -> list[int]:
    """Lengths in [min_len, max_len] that add up to total exactly: drawn by rng.randint while more than
    max_len tokens are left, from [min_len, min(max_len, left - min_len)] so that at least min_len stay
    for the last document, which takes the rest. Needs total >= min_len >= 1 and max_len >= 2 * min_len."""
    if not (1 <= min_len and 2 * min_len <= max_len and total >= min_len):
        raise ValueError(f"document_lengths: need 1 <= min_len, 2 * min_len <= max_len and total >= min_len "
                         f"(min_len {min_len}, max_len {max_len}, total {total})")
    lengths, left = [], total
    while left > max_len:
        lengths.append(rng.randint(min_len, min(max_len, left - min_len)))
        left -= lengths[-1]
    return lengths + [left]


def cu_seqlens(lengths: list[int]) -> list[int]:
    """0, then the running sum of the lengths: document b is rows cu[b] .. cu[b + 1] - 1 of the stream."""
    return [0, *itertools.accumulate(lengths)]


def first_visible_key(cu: list[int], left: int) -> list[int]:
    """Per row i of the stream, the first key it sees: causal within its document and a sliding window
    (left, 0) (left < 0: none), row i sees keys first_visible_key[i] .. i, that is key j iff j is in i's
    document, j <= i and i - j <= left. The one statement of the mask: packed_mask builds it from this."""
    out = []
    for start, end in zip(cu, cu[1:]):
        out += [start if left < 0 else max(start, i - left) for i in range(start, end)]
    return out


def window_text(left: int) -> str:
    return "no window" if left < 0 else f"window ({left}, 0)"


# ---- the verdict (plain Python on lists) -------------------------------------------------------------

def windows(n: int, size: int) -> list[tuple[int, int]]:
    """[start, end) of consecutive windows of size steps covering 0 .. n-1 (the last may be shorter;
    a last piece under half a window joins the one before it)."""
    bounds = list(range(0, n, size)) + [n]
    if len(bounds) > 2 and bounds[-1] - bounds[-2] < size / 2:
        del bounds[-2]
    return list(zip(bounds[:-1], bounds[1:]))


def verdict(losses: dict, window: int, k: float, eps: float, entropy_floor: float,
            grad_diffs: dict | None = None, grad_floor: float = 0.05, learn_fraction: float = 0.5,
            test: str = TEST_RUN, reference: str = REFERENCE_RUN) -> dict:
    """The criterion of the module docstring. losses: {run: [loss per step]} with the test run, the
    reference run and at least one other run (the spread); grad_diffs: {run: {parameter: relative
    difference of its first gradient from the reference's}} for the test run and the others.
    Returns {"pass", "reasons", "windows": [...], "learned": {...}, "grads": {...}}."""
    def failed(reasons):
        return {"pass": False, "reasons": reasons, "windows": [], "learned": {}, "grads": {}}

    reasons = []
    spread_runs = [r for r in losses if r not in (test, reference)]
    missing = [name for name in (test, reference) if name not in losses]
    if missing:
        return failed([f"no {missing[0]} run"])
    if not spread_runs:
        return failed(["no second SDPA backend ran, so there is no spread to compare with"])
    n = len(losses[reference])
    for name, curve in losses.items():
        if len(curve) != n:
            reasons.append(f"{name} has {len(curve)} losses, {reference} has {n}")
        elif not all(math.isfinite(x) for x in curve):
            reasons.append(f"{name}: a loss is not finite (step {next(i for i, x in enumerate(curve) if not math.isfinite(x))})")
    if reasons:
        return failed(reasons)

    ref = losses[reference]
    rows = []
    for lo, hi in windows(n, window):
        diff = mean([abs(a - b) for a, b in zip(losses[test][lo:hi], ref[lo:hi])])
        spread = max(mean([abs(a - b) for a, b in zip(losses[r][lo:hi], ref[lo:hi])]) for r in spread_runs)
        rows.append(w := {"start": lo, "end": hi, "diff": diff, "spread": spread, "allowed": k * spread + eps})
        w["ok"] = diff <= w["allowed"]
        if not w["ok"]:
            reasons.append(f"steps {w['start']}-{w['end'] - 1}: mean |{test} - {reference}| = {w['diff']:.4f} > "
                           f"{k:g} x spread {w['spread']:.4f} + {eps:g} = {w['allowed']:.4f}")

    initial = ref[0]
    needed = initial - learn_fraction * (initial - entropy_floor)
    last_lo, last_hi = rows[-1]["start"], rows[-1]["end"]
    learned = {}
    for name, curve in losses.items():
        final = mean(curve[last_lo:last_hi])
        learned[name] = {"final": final, "needed": needed, "ok": final <= needed}
        if final > needed:
            reasons.append(f"{name} did not learn: its last window's mean loss {final:.4f} > {needed:.4f} "
                           f"({learn_fraction:g} of the way from {initial:.4f} to the floor {entropy_floor:.4f})")

    grads = {}
    if grad_diffs is not None:
        others = [r for r in spread_runs if r in grad_diffs]
        if test not in grad_diffs or not others:
            reasons.append("the first-step gradients of the test run and of another backend are needed")
        else:
            for param, diff in grad_diffs[test].items():
                spread = max(grad_diffs[r].get(param, 0.0) for r in others)
                allowed = max(k * spread, grad_floor)
                grads[param] = {"diff": diff, "spread": spread, "allowed": allowed, "ok": diff <= allowed}
                if not diff <= allowed:  # also catches NaN
                    reasons.append(f"first gradient of {param}: |g({test}) - g({reference})| / |g({reference})| = "
                                   f"{diff:.4g} > max({k:g} x {spread:.4g}, {grad_floor:g})")
    return {"pass": not reasons, "reasons": reasons, "windows": rows, "learned": learned, "grads": grads}


# ---- the model and the runs (PyTorch, imported by main) -----------------------------------------------

def sdpa_attention(torch, backend: str):
    """Causal attention on [B, S, H, D] tensors through SDPA with one backend forced (fs_results.Backend:
    SDPA reads [B, H, S, D] views of the same memory)."""
    be = fs_results.Backend(torch, backend)

    def attend(q, k, v):
        with be.context():
            return be.view(be(be.view(q), be.view(k), be.view(v), True, None))
    return attend


def flash_steps_attention(flash_steps, step=None, backward_step=None, deterministic=False):
    """Causal attention on [B, S, H, D] tensors through flash_steps.attention; q, k and v are slices of
    one qkv projection, made contiguous here."""
    def attend(q, k, v):
        return flash_steps.attention(q.contiguous(), k.contiguous(), v.contiguous(), causal=True, step=step,
                                     backward_step=backward_step, deterministic=deterministic)
    return attend


def packed_mask(torch, cu: list[int], left: int, device):
    """The boolean (total, total) mask of one packed step, True where row i sees key j: the keys
    first_visible_key(cu, left)[i] .. i, block-diagonal per document, causal and windowed."""
    first = torch.tensor(first_visible_key(cu, left), device=device)
    j = torch.arange(cu[-1], device=device)
    return (j[None, :] >= first[:, None]) & (j[None, :] <= j[:, None])


def sdpa_packed_attention(torch, backend: str):
    """Packed documents through SDPA with one backend forced, as batch 1: bind(pack) builds the step's
    packed_mask once and returns attend(q, k, v) on [1, T, H, D] tensors, SDPA with attn_mask on the
    [1, H, T, D] views (the mask broadcasts over the heads)."""
    be = fs_results.Backend(torch, backend)

    def bind(pack):
        mask = packed_mask(torch, pack["cu_seqlens"], pack["left"], pack["cu"].device)

        def attend(q, k, v):
            with be.context():
                return be.view(be.func(be.view(q), be.view(k), be.view(v), attn_mask=mask))
        return attend
    return bind


def flash_steps_packed_attention(flash_steps, step=None, backward_step=None, deterministic=False):
    """Packed documents through flash_steps.varlen_attention: bind(pack) returns attend(q, k, v) on
    [1, T, H, D] tensors, which hands the (T, H, D) rows (contiguous) with the step's cu_seqlens (int32 on
    the device, for Q and K alike), causal=True and window (left, 0) (None when left < 0)."""
    def bind(pack):
        window = None if pack["left"] < 0 else (pack["left"], 0)

        def attend(q, k, v):
            o = flash_steps.varlen_attention(q[0].contiguous(), k[0].contiguous(), v[0].contiguous(), pack["cu"],
                                             pack["cu"], pack["max_seqlen"], pack["max_seqlen"], causal=True,
                                             window=window, step=step, backward_step=backward_step,
                                             deterministic=deterministic)
            return o.unsqueeze(0)
        return attend
    return bind


def build_model(torch, vocab: int, seqlen: int, layers: int, d_model: int, heads: int):
    """A pre-LayerNorm GPT: token and learned position embeddings, `layers` blocks of causal attention
    and a 4x GELU MLP, a final LayerNorm and an untied output layer; no biases, no dropout. forward
    takes the attention function: attend(q, k, v) on [B, S, H, D] tensors, and the positions ([B, S],
    below seqlen; default 0 .. S-1: packed documents give each token its place in its document). GPT-2's
    initialisation: N(0, 0.02), the projections back into the residual stream scaled by 1/sqrt(2 * layers)."""
    nn, F = torch.nn, torch.nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
            self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
            self.proj = nn.Linear(d_model, d_model, bias=False)
            self.fc = nn.Linear(d_model, 4 * d_model, bias=False)
            self.out = nn.Linear(4 * d_model, d_model, bias=False)

        def forward(self, x, attend):
            b, s, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, heads, d_model // heads).unbind(2)  # [B, S, H, D] each
            x = x + self.proj(attend(q, k, v).reshape(b, s, d_model))
            return x + self.out(F.gelu(self.fc(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(vocab, d_model)
            self.pos = nn.Embedding(seqlen, d_model)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln_f = nn.LayerNorm(d_model)
            self.head = nn.Linear(d_model, vocab, bias=False)
            for name, p in self.named_parameters():
                if p.dim() == 2:
                    std = 0.02 / math.sqrt(2 * layers) if name.endswith(("proj.weight", "out.weight")) else 0.02
                    nn.init.normal_(p, 0.0, std)

        def forward(self, idx, attend, positions=None):
            if positions is None:
                positions = torch.arange(idx.shape[1], device=idx.device)
            x = self.tok(idx) + self.pos(positions)
            for block in self.blocks:
                x = block(x, attend)
            return self.head(self.ln_f(x))

    return GPT()


def lr_factor(step: int, warmup: int, steps: int, final: float = 0.1) -> float:
    """Linear warm-up over warmup steps, then a cosine from 1 down to final at the last step."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - 1 - warmup)
    return final + (1 - final) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def train(torch, model, init_state: dict, attend, data: dict, cfg: dict) -> dict:
    """One run from init_state over make_data's steps: inputs and targets ([steps, B, S] int64 on the
    model's device), recall ([steps, B, S] float, 1 where the target is a copied token) and, for packed
    documents, positions ([steps, 1, T]) and packs (one per step): then attend is a binder and
    attend(packs[step]) the step's attention. Returns the per-step losses and losses on copied tokens
    (lists), the gradients of the first step (before clipping), and timings."""
    F = torch.nn.functional
    inputs, targets, recall = data["inputs"], data["targets"], data["recall"]
    positions, packs = data.get("positions"), data.get("packs")
    device = inputs.device
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    model.load_state_dict(init_state)
    model.zero_grad(set_to_none=True)
    params = list(model.parameters())
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg["weight_decay"]},
                             {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                            lr=cfg["lr"], betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, cfg["warmup"], cfg["steps"]))
    steps = inputs.shape[0]
    losses = torch.zeros(steps, device=device)
    recall_losses = torch.zeros(steps, device=device)
    first_grads, warm = None, min(5, steps - 1)
    sync()
    t0 = t_warm = time.perf_counter()
    for step in range(steps):
        x, y = inputs[step], targets[step]
        step_attend = attend if packs is None else attend(packs[step])
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            logits = model(x, step_attend, None if positions is None else positions[step])
        ce = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="none").view_as(y)
        loss = ce.mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if step == 0:
            first_grads = {name: p.grad.detach().float().cpu() for name, p in model.named_parameters()}
        torch.nn.utils.clip_grad_norm_(params, cfg["clip"])
        opt.step()
        sched.step()
        losses[step] = loss.detach()
        recall_losses[step] = (ce.detach() * recall[step]).sum() / recall[step].sum().clamp(min=1)
        if step == warm - 1:
            sync()
            t_warm = time.perf_counter()
    sync()
    t1 = time.perf_counter()
    return {"losses": [round(x, 6) for x in losses.tolist()],
            "recall_losses": [round(x, 6) for x in recall_losses.tolist()],
            "first_grads": first_grads, "wall_s": round(t1 - t0, 2),
            "ms_per_step": round((t1 - t_warm) * 1e3 / max(1, steps - warm), 2)}


def grad_differences(grads: dict, reference: dict) -> dict:
    """{parameter: |g - g_ref| / |g_ref|} (Frobenius norms; 0 where both are zero). The qkv weights
    are split into their q, k and v rows: at initialisation the attention is nearly uniform, dQ and
    dK are small beside dV, and an error in them would hide in the norm of the whole matrix."""
    out = {}
    for name, g_ref in reference.items():
        parts = {name: (grads[name], g_ref)}
        if name.endswith("qkv.weight"):
            parts = {f"{name}[{p}]": pair for p, pair in zip("qkv", zip(grads[name].chunk(3), g_ref.chunk(3)))}
        for part, (g, r) in parts.items():
            num, den = (g - r).norm().item(), r.norm().item()
            out[part] = num / den if den > 0 else (0.0 if num == 0 else math.inf)
    return out


def make_data(torch, lang: Language, cfg: dict, device) -> dict:
    """The batches of every step, generated once on the device from the seed (a CUDA generator draws
    other numbers than a CPU one: the data depend on the seed and the device type), and the floors of
    the data. With cfg["varlen"]: make_packed_data's."""
    if cfg.get("varlen"):
        return make_packed_data(torch, lang, cfg, device)
    t0 = time.perf_counter()
    count, length = cfg["steps"] * cfg["batch"], cfg["seqlen"] + 1
    data = generate_batch(torch, lang, count, length, cfg["seed"] + 1, device=device)
    targets = data["tokens"][:, 1:]
    counts = torch.bincount(targets.flatten(), minlength=lang.vocab).tolist()
    fl = floors(data["logp"][:, 1:].sum().item(), data["markov_logp"][:, 1:].sum().item(), counts)
    copied = data["recall"][:, 1:]
    fl["copied_fraction"] = copied.double().mean().item()
    fl["copied_markov_cost"] = -data["markov_logp"][:, 1:][copied].mean().item()  # what a copy costs without recall
    fl["generate_s"] = round(time.perf_counter() - t0, 2)
    batches = data["tokens"].view(cfg["steps"], cfg["batch"], length)
    return {"inputs": batches[:, :, :-1], "targets": batches[:, :, 1:],
            "recall": data["recall"][:, 1:].reshape(cfg["steps"], cfg["batch"], length - 1).float(), "floors": fl}


def make_packed_data(torch, lang: Language, cfg: dict, device) -> dict:
    """Every step's packed stream of cfg["varlen"]["tokens"] tokens: documents of document_lengths
    (random.Random(seed), from min_len to seqlen), each one sequence of the language of its length + 1
    tokens (generate_batch, all documents at once, seed + 1 as make_data), whose first `length` tokens
    are inputs and last `length` targets, at positions 0 .. length - 1; as batch 1 ([steps, 1, T]).
    packs[step]: cu_seqlens (a list and an int32 tensor on the device), max_seqlen and the window's left.
    The floors on the targets, as make_data's."""
    t0 = time.perf_counter()
    v = cfg["varlen"]
    rng = random.Random(cfg["seed"])
    lengths = [document_lengths(rng, v["tokens"], v["min_len"], cfg["seqlen"]) for _ in range(cfg["steps"])]
    packs = [{"cu_seqlens": cu_seqlens(ls), "max_seqlen": max(ls), "left": v["sliding_window"]} for ls in lengths]
    for pack in packs:
        pack["cu"] = torch.tensor(pack["cu_seqlens"], dtype=torch.int32, device=device)
    flat = [n for ls in lengths for n in ls]
    data = generate_batch(torch, lang, len(flat), cfg["seqlen"] + 1, cfg["seed"] + 1, device=device)
    # the first `length` places of each document, in order: the documents of step 0, then of step 1, ...
    keep = torch.arange(cfg["seqlen"], device=device)[None, :] < torch.tensor(flat, device=device)[:, None]
    shape = (cfg["steps"], 1, v["tokens"])
    targets = data["tokens"][:, 1:][keep]
    counts = torch.bincount(targets, minlength=lang.vocab).tolist()
    fl = floors(data["logp"][:, 1:][keep].sum().item(), data["markov_logp"][:, 1:][keep].sum().item(), counts)
    copied = data["recall"][:, 1:][keep]
    fl["copied_fraction"] = copied.double().mean().item()
    fl["copied_markov_cost"] = -data["markov_logp"][:, 1:][keep][copied].mean().item()
    fl["documents"], fl["mean_length"] = len(flat), round(mean(flat), 1)
    fl["generate_s"] = round(time.perf_counter() - t0, 2)
    positions = torch.arange(cfg["seqlen"], device=device).expand(len(flat), -1)[keep]
    return {"inputs": data["tokens"][:, :-1][keep].view(shape), "targets": targets.view(shape),
            "positions": positions.view(shape), "recall": copied.float().view(shape), "packs": packs, "floors": fl}


def run_experiment(torch, runs: dict, cfg: dict, device, log=print) -> dict:
    """Trains the model once per entry of runs ({name: attend}, the reference first), all from one
    initial state and one list of batches, and returns the config, the floors, the runs and the
    verdict (the result file's body)."""
    lang = Language(cfg["seed"], cfg["text_tokens"], cfg["anchors"], cfg["segment"], cfg["p_anchor"])
    data = make_data(torch, lang, cfg, device)
    fl = data["floors"]
    v = cfg.get("varlen")
    shape = (f"{cfg['steps']} x {cfg['batch']} sequences of {cfg['seqlen'] + 1} tokens" if not v else
             f"{cfg['steps']} steps of {v['tokens']} tokens packed from {fl['documents']} documents of {v['min_len']} "
             f"to {cfg['seqlen']} (mean {fl['mean_length']}), {window_text(v['sliding_window'])}")
    log(f"data: {shape} in {fl['generate_s']} s; "
        f"{100 * fl['copied_fraction']:.1f}% copied tokens; nats per token: entropy floor {fl['entropy_floor']:.4f}, "
        f"Markov floor {fl['markov_floor']:.4f}, unigram {fl['unigram_entropy']:.4f}, uniform {math.log(lang.vocab):.4f}")
    torch.manual_seed(cfg["seed"])
    model = build_model(torch, lang.vocab, cfg["seqlen"], cfg["layers"], cfg["d_model"], cfg["heads"]).to(device)
    init_state = copy.deepcopy(model.state_dict())
    results, grads = {}, {}
    for i, (name, attend) in enumerate(runs.items()):
        try:
            r = train(torch, model, init_state, attend, data, cfg)
        except Exception as e:  # a backend that refuses the shape, or a failing kernel: recorded, not fatal
            results[name] = {"status": "error", "reason": f"{type(e).__name__}: {e}".strip()}
            log(f"[{i + 1}/{len(runs)}] {name}: {results[name]['reason']}")
            continue
        grads[name] = r.pop("first_grads")
        results[name] = {"status": "ok", **r}
        last = max(1, cfg["steps"] // 10)
        log(f"[{i + 1}/{len(runs)}] {name}: {r['wall_s']} s, {r['ms_per_step']} ms/step; mean of the last {last} "
            f"steps: loss {mean(r['losses'][-last:]):.4f}, on copied tokens {mean(r['recall_losses'][-last:]):.4f}")
    reference = next(iter(runs))
    grad_diffs = None
    if reference in grads:
        grad_diffs = {name: grad_differences(g, grads[reference]) for name, g in grads.items()
                      if name != reference}
        for name, diffs in grad_diffs.items():
            results[name]["first_grad_rel_diff"] = {p: float(f"{d:.4g}") for p, d in diffs.items()}
    ok = {name: r["losses"] for name, r in results.items() if r["status"] == "ok"}
    v = verdict(ok, cfg["window"], cfg["k"], cfg["eps"], fl["entropy_floor"], grad_diffs, cfg["grad_floor"],
                reference=reference)
    for name, r in results.items():
        if r["status"] == "error" and name in (TEST_RUN, reference):
            v["pass"] = False
            v["reasons"].insert(0, f"{name} failed: {r['reason']}")
    return {"config": cfg, "language": lang.config(), "floors": fl, "runs": results, "verdict": v}


# ---- results: the file, the plot, the summary -----------------------------------------------------------

COLORS = {"flash_steps": "tab:red", "sdpa_flash": "tab:blue", "sdpa_cudnn": "tab:green",
          "sdpa_efficient": "tab:purple", "sdpa_math": "tab:gray"}


def plot(result: dict, path: Path) -> None:
    """Two panels: loss against step for every run (solid: all tokens, dashed: copied tokens) with the
    floors; and, on a log scale, |loss - loss(reference)| of every run with the per-window means and
    the allowed band of the verdict."""
    plt = fs_results.pyplot()
    runs = {n: r for n, r in result["runs"].items() if r["status"] == "ok"}
    reference, fl, v = result["config"]["reference"], result["floors"], result["verdict"]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 8), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    for name, r in runs.items():
        steps = range(len(r["losses"]))
        c = COLORS.get(name)
        ax1.plot(steps, r["losses"], color=c, lw=1.0, label=name)
        ax1.plot(steps, r["recall_losses"], color=c, lw=0.8, ls="--")
    for key, label, ls in (("unigram_entropy", "unigram entropy", ":"), ("markov_floor", "Markov floor", "-."),
                           ("entropy_floor", "entropy floor", "-")):
        ax1.axhline(fl[key], color="black", lw=0.7, ls=ls)
        ax1.annotate(f"{label} {fl[key]:.3f}", (0, fl[key]), xytext=(2, 2), textcoords="offset points", fontsize=8)
    ax1.set_ylabel("loss (nats per token)")
    ax1.set_title("solid: all tokens, dashed: copied tokens", fontsize=9)
    ax1.legend(fontsize=8)
    ax1.grid(alpha=0.3)
    ref = runs.get(reference)
    if ref:
        for name, r in runs.items():
            if name != reference:
                diff = [max(abs(a - b), 1e-6) for a, b in zip(r["losses"], ref["losses"])]
                ax2.plot(range(len(diff)), diff, color=COLORS.get(name), lw=0.6, alpha=0.45)
        for i, w in enumerate(v.get("windows", [])):
            span = [w["start"], w["end"]]
            ax2.plot(span, [w["diff"]] * 2, color=COLORS[TEST_RUN], lw=2.5,
                     label=f"window mean |{TEST_RUN} - {reference}|" if i == 0 else None)
            ax2.plot(span, [w["spread"]] * 2, color="black", lw=2.0,
                     label="window mean spread (largest other backend)" if i == 0 else None)
            ax2.plot(span, [w["allowed"]] * 2, color="black", lw=1.2, ls="--",
                     label="allowed: k x spread + eps" if i == 0 else None)
        if v.get("windows"):
            ax2.legend(fontsize=8)
    ax2.set_yscale("log")
    ax2.set_xlabel("step")
    ax2.set_ylabel(f"|loss - loss({reference})|")
    ax2.grid(alpha=0.3, which="both")
    env = result.get("environment", {})
    varlen = result["config"].get("varlen")
    mode = f" --varlen, {window_text(varlen['sliding_window'])}" if varlen else ""
    fig.suptitle(f"train_gpt{mode}: {'PASS' if v['pass'] else 'FAIL'}, {env.get('gpu', '')} {result.get('commit', '')}",
                 fontsize=10)
    fig.tight_layout()
    fs_results.save_figure(fig, path)


def summary(result: dict) -> str:
    v, fl = result["verdict"], result["floors"]
    lines = [f"floors: entropy {fl['entropy_floor']:.4f}, Markov {fl['markov_floor']:.4f}, "
             f"unigram {fl['unigram_entropy']:.4f} nats per token"]
    cost = fl.get("copied_markov_cost")
    for name, r in v.get("learned", {}).items():
        recall = result.get("runs", {}).get(name, {}).get("recall_losses")
        tail = ""
        if recall and cost is not None and v.get("windows"):
            w = v["windows"][-1]
            tail = (f"; on copied tokens {mean(recall[w['start']:w['end']]):.4f} (without long-range recall "
                    f"about {cost:.4f}, with it 0)")
        lines.append(f"  {name:15s} last window mean loss {r['final']:.4f} (needed <= {r['needed']:.4f}){tail}")
    for w in v.get("windows", []):
        lines.append(f"  steps {w['start']:4d}-{w['end'] - 1:4d}: |{TEST_RUN} - ref| {w['diff']:.5f}  spread "
                     f"{w['spread']:.5f}  allowed {w['allowed']:.5f}  {'ok' if w['ok'] else 'OVER'}")
    if v.get("grads"):
        worst = max(v["grads"].items(), key=lambda kv: kv[1]["diff"] / max(kv[1]["allowed"], 1e-30))
        lines.append(f"  first gradients: worst {worst[0]}: {worst[1]['diff']:.4g} (allowed {worst[1]['allowed']:.4g}, "
                     f"spread {worst[1]['spread']:.4g})")
    lines += [f"  {reason}" for reason in v["reasons"]]
    lines.append("PASS" if v["pass"] else "FAIL")
    return "\n".join(lines)


# ---- the command line ---------------------------------------------------------------------------------------

DEFAULTS = {"steps": (300, 120), "batch": (32, 16), "seqlen": (512, 256), "layers": (4, 2), "d_model": (512, 128),
            "lr": (1e-3, 2e-3), "window": (50, 20),  # (the experiment, --quick)
            "tokens": (8192, 2048), "min_len": (32, 16), "sliding_window": (256, 64)}  # --varlen's
VARLEN_REFERENCE = "efficient"  # SDPA's backend that is the reference with --varlen (flash takes no mask)


def parse_args(argv=None):
    ap = fs_results.parser(__doc__)
    fs_results.add_run_arguments(ap, "JSON and PNG")
    ap.add_argument("--quick", action="store_true", help="a smoke run, the (quick) defaults below")
    for name, kind, help_text in (("steps", int, None), ("batch", int, "sequences per step"), ("seqlen", int, None),
                                  ("layers", int, None), ("d-model", int, None),
                                  ("lr", float, "peak learning rate of AdamW"),
                                  ("window", int, "steps per window of the criterion"),
                                  ("tokens", int, "--varlen: tokens per step, packed"),
                                  ("min-len", int, "--varlen: the shortest document (the longest: --seqlen)"),
                                  ("sliding-window", int, "--varlen: the window's left bound, -1 none")):
        normal, quick = DEFAULTS[name.replace("-", "_")]
        ap.add_argument(f"--{name}", type=kind, help=f"{help_text + ' ' if help_text else ''}(default {normal}; "
                        f"quick {quick})")
    ap.add_argument("--head-dim", type=int, choices=[64, 128], default=64, help="heads = d_model / head_dim")
    ap.add_argument("--warmup", type=int, default=20, help="steps of linear warm-up")
    ap.add_argument("--weight-decay", type=float, default=0.1, help="on the matrices only")
    ap.add_argument("--seed", type=int, default=1, help="the language, the data and the initial weights")
    ap.add_argument("--varlen", action="store_true",
                    help="packed documents of random lengths, causal per document, a sliding window: "
                    "flash_steps.varlen_attention against SDPA with an explicit mask")
    ap.add_argument("--spread-backends",
                    help="the other SDPA backends whose distance from the reference (SDPA flash; with --varlen "
                    f"{VARLEN_REFERENCE}, masked) is the allowed spread (comma-separated, of "
                    f"{', '.join(b for b in SDPA_BACKENDS if b != 'flash')}; default cudnn,efficient, with "
                    "--varlen math,cudnn)")
    ap.add_argument("--k", type=float, default=3.0, help="allowed multiple of the spread")
    ap.add_argument("--eps", type=float, default=0.01, help="allowed mean |difference| on top (nats)")
    ap.add_argument("--grad-floor", type=float, default=0.05,
                    help="relative first-gradient difference always allowed")
    ap.add_argument("--step", help="the forward step flash_steps.attention (--varlen: varlen_attention) uses "
                    "(default: its choice)")
    ap.add_argument("--backward-step", help="the backward step flash_steps.attention (--varlen: varlen_attention) "
                    "uses (default: its choice)")
    ap.add_argument("--deterministic", action="store_true", help="flash_steps.attention(deterministic=True)")
    ap.add_argument("--no-plot", action="store_true", help="write the JSON only")
    args = ap.parse_args(argv)
    for name, (normal, quick) in DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else normal)
    args.reference = VARLEN_REFERENCE if args.varlen else "flash"
    known = [b for b in SDPA_BACKENDS if b not in ("flash", args.reference)]
    if args.spread_backends is None:
        args.spread_backends = "math,cudnn" if args.varlen else "cudnn,efficient"
    spread = [b.strip() for b in args.spread_backends.split(",") if b.strip()]
    unknown = [b for b in spread if b not in known]
    if unknown or not spread:
        ap.error(f"--spread-backends: {', '.join(unknown) or 'none given'} (known: {', '.join(known)})")
    args.spread = spread
    if args.d_model % args.head_dim:
        ap.error(f"--d-model {args.d_model} is not a multiple of --head-dim {args.head_dim}")
    for name in ("steps", "batch", "seqlen", "layers", "window", "warmup", "tokens", "min_len"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} {getattr(args, name)}: must be at least 1")
    if args.varlen:
        if args.seqlen < 2 * args.min_len or args.tokens < args.min_len or args.tokens >= 2 ** 31:
            ap.error(f"--varlen: need --seqlen ({args.seqlen}) >= 2 x --min-len ({args.min_len}) and --min-len <= "
                     f"--tokens ({args.tokens}) < 2^31")
        if args.sliding_window < -1:
            ap.error(f"--sliding-window {args.sliding_window}: must be -1 (none) or at least 0")
    return args


def config_of(args) -> dict:
    return {"steps": args.steps, "batch": 1 if args.varlen else args.batch, "seqlen": args.seqlen,
            "layers": args.layers,
            "d_model": args.d_model, "heads": args.d_model // args.head_dim, "head_dim": args.head_dim,
            "dtype": "bf16 autocast", "optimizer": "AdamW betas (0.9, 0.95)", "lr": args.lr, "warmup": args.warmup,
            "schedule": "linear warm-up, cosine to 0.1 x", "weight_decay": args.weight_decay, "clip": 1.0,
            "seed": args.seed, "text_tokens": 48, "anchors": 8, "segment": 32, "p_anchor": 0.08,
            "window": args.window, "k": args.k, "eps": args.eps, "grad_floor": args.grad_floor,
            "reference": f"sdpa_{args.reference}", "test": TEST_RUN, "spread": [f"sdpa_{b}" for b in args.spread],
            "flash_steps": {"step": args.step, "backward_step": args.backward_step,
                            "deterministic": args.deterministic},
            **({"varlen": {"tokens": args.tokens, "min_len": args.min_len, "max_len": args.seqlen,
                           "sliding_window": args.sliding_window,
                           "attention": "flash_steps.varlen_attention(causal=True, window=(left, 0)); SDPA with "
                           "the (T, T) boolean mask: same document, j <= i, i - j <= left"}}
               if args.varlen else {})}


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.lib:
        os.environ["FLASH_STEPS_LIB"] = str(Path(args.lib).resolve())
    import torch

    if not torch.cuda.is_available():
        print("train_gpt: PyTorch sees no CUDA device", file=sys.stderr)
        return 1
    package = fs_results.REPO / "python"
    sys.path.insert(0, str(package))
    used = "varlen_attention" if args.varlen else "attention"
    try:
        import flash_steps
        getattr(flash_steps, used)  # the one function used
    except Exception as e:  # a missing package or library, or one that fails to load: said, not a traceback
        print(f"train_gpt: cannot use flash_steps.{used} from {package} ({type(e).__name__}: {e}); "
              "build the library (cmake --build build) or pass --lib", file=sys.stderr)
        return 1
    cfg = config_of(args)
    sdpa = sdpa_packed_attention if args.varlen else sdpa_attention
    runs = {f"sdpa_{b}": sdpa(torch, b) for b in [args.reference, *args.spread]}  # the reference first
    runs[TEST_RUN] = (flash_steps_packed_attention if args.varlen else flash_steps_attention)(
        flash_steps, args.step, args.backward_step, args.deterministic)
    date = datetime.datetime.now(datetime.timezone.utc)
    mode = "varlen" if args.varlen else None
    head = fs_results.result_head("train_gpt", mode, date, args.commit or fs_results.git_commit(),
                                  fs_results.environment(torch),
                                  os.environ.get("FLASH_STEPS_LIB") or str(fs_results.library_path()))
    env = head["environment"]
    shape = (f"seqlen {cfg['seqlen']}, batch {cfg['batch']}" if not args.varlen else
             f"{args.tokens} tokens a step, documents of {args.min_len} to {args.seqlen}, "
             f"{window_text(args.sliding_window)}")
    print(f"train_gpt {head['commit']} on {env['gpu']} (CUDA {env['cuda']}, torch {env['torch']}, cuDNN "
          f"{env['cudnn']}): {cfg['layers']} layers, d_model {cfg['d_model']}, {cfg['heads']} heads of "
          f"{cfg['head_dim']}, {shape}, {cfg['steps']} steps; runs: {', '.join(runs)}", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    result = {**head, **run_experiment(torch, runs, cfg, torch.device("cuda"),
                                       log=lambda s: print(s, file=sys.stderr, flush=True))}
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    base = fs_results.results_base(args.out_dir, "train_gpt_varlen" if args.varlen else "train_gpt", date)
    base.parent.mkdir(parents=True, exist_ok=True)
    result["plot"] = None
    if not args.no_plot:
        try:
            plot(result, base.with_suffix(".png"))
            result["plot"] = base.with_suffix(".png").name
        except ImportError:
            print("train_gpt: no matplotlib, so no plot", file=sys.stderr)
    base.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"train_gpt: wrote {base.with_suffix('.json')}" + (f" and {result['plot']}" if result["plot"] else ""),
          file=sys.stderr)
    print(summary(result))
    return 0 if result["verdict"]["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
