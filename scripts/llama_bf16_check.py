#!/usr/bin/env python3
"""Issue 15's bf16 bar: wick's greedy tokens against transformers' in bf16 on the same weights.

  python3 scripts/llama_bf16_check.py --build build --device cpu --shape llama1b --layers 4
  python3 scripts/llama_bf16_check.py --build build-gpu --device cuda --shape qwen05b

For each of 5 seeded prompts, 64 greedy tokens from:
  - transformers in bf16, loaded as users load it (from_pretrained(dtype=bfloat16), eager
    attention): the reference. NB `model.to(torch.bfloat16)` also rounds the rotary inv_freq
    buffer to bf16 (from_pretrained keeps it f32), which moves the rope angles: not a reference.
  - transformers in f32 (the noise floor: how far bf16 itself is from f32);
  - wick-generate --dtype bf16.
Printed per prompt: equal leading tokens (wick vs transformers bf16, and transformers bf16 vs
f32); the top-1/top-2 logit gap of transformers' bf16 logits at each step, in units of the bf16
spacing at the top logit (a gap of 0 is an exact tie in bf16, broken by the first index); and at
the first divergence, that step's gap. With --teacher-forced, also the share of bf16 logits that
are bit-equal between wick and transformers over prompt + reference continuation (one prefill).
"""

import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from make_llama_refs import SHAPES, make_model, save_folder  # noqa: E402


def prompts(vocab, n=5):
    rng = np.random.default_rng(7)
    return [rng.integers(3, min(vocab, 30000), size=int(rng.integers(6, 25))).tolist()
            for _ in range(n)]


def bf16_spacing(x):
    """The distance between adjacent bf16 values at |x| (8 significant bits)."""
    x = np.abs(np.asarray(x, dtype=np.float64))
    e = np.floor(np.log2(np.maximum(x, 1e-30)))
    return 2.0 ** (e - 7)


def hf_greedy(model, ids, n, device):
    """Greedy ids and, per step, (top1 - top2) of the logits and the top logit."""
    import torch
    seq, gaps, tops = list(ids), [], []
    with torch.no_grad():
        out = model(torch.tensor([seq], device=device), use_cache=True)
        for _ in range(n):
            logits = out.logits[0, -1]
            top2 = torch.topk(logits.float(), 2).values
            gaps.append(float(top2[0] - top2[1]))
            tops.append(float(top2[0]))
            nxt = int(logits.argmax())  # first index of the maximum, as torch documents
            seq.append(nxt)
            out = model(torch.tensor([[nxt]], device=device),
                        past_key_values=out.past_key_values, use_cache=True)
    return seq[len(ids):], np.array(gaps), np.array(tops)


def leading(a, b):
    return next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def wick_greedy(build, folder, ids, n, device):
    exe = os.path.join(build, "tools", "wick-generate")
    r = subprocess.run([exe, folder, "--prompt-ids", ",".join(map(str, ids)), "--device", device,
                        "--dtype", "bf16", "--max-new", str(n), "--ignore-eos", "--print-ids",
                        "-q"], capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise RuntimeError(f"wick-generate failed\n{r.stderr[-1500:]}")
    line = next(l for l in r.stdout.splitlines() if l.startswith("ids:"))
    return [int(x) for x in line.split()[1:]]


def wick_logits(build, folder, ids, device, out):
    exe = os.path.join(build, "tools", "wick-generate")
    r = subprocess.run([exe, folder, "--prompt-ids", ",".join(map(str, ids)), "--device", device,
                        "--dtype", "bf16", "--max-new", "0", "--logits-out", out, "-q"],
                       capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise RuntimeError(f"wick-generate failed\n{r.stderr[-1500:]}")
    return np.fromfile(out, dtype=np.float32)


def shape_config(shape, layers, hidden):
    cfg = dict(SHAPES[shape])
    if layers:
        cfg["num_hidden_layers"] = layers
    if hidden:  # keep head_dim; scale heads and the MLP with the width
        heads = cfg["num_attention_heads"] * hidden // cfg["hidden_size"]
        kv = max(1, cfg["num_key_value_heads"] * hidden // cfg["hidden_size"])
        cfg.update(intermediate_size=cfg["intermediate_size"] * hidden // cfg["hidden_size"],
                   num_attention_heads=heads, num_key_value_heads=kv, hidden_size=hidden,
                   head_dim=hidden // heads)
    return cfg


def check(build, shape, device, layers=0, hidden=0, n_new=64, n_prompts=5, work=None,
          teacher_forced=False, with_f32=True, log=print):
    """Runs the comparison; returns (equal leading tokens per prompt, summary dict)."""
    import torch
    from transformers import AutoModelForCausalLM
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    work = work or tempfile.mkdtemp(prefix="wick-bf16-")
    folder = os.path.join(work, f"{shape}_l{layers}_h{hidden}")
    cfg = shape_config(shape, layers, hidden)
    if not os.path.exists(os.path.join(folder, "model.safetensors")):
        save_folder(make_model(cfg, seed=0), folder)
    ps = prompts(cfg["vocab_size"], n_prompts)
    ref_tokens, ref_gaps, ref_tops = [], [], []
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16,
                                                 attn_implementation="eager").to(device).eval()
    for ids in ps:
        t, g, top = hf_greedy(model, ids, n_new, device)
        ref_tokens.append(t)
        ref_gaps.append(g)
        ref_tops.append(top)
    tf_equal = []
    if teacher_forced:
        for i, (ids, t) in enumerate(zip(ps, ref_tokens)):
            full = ids + t[:-1]
            with torch.no_grad():
                ref = model(torch.tensor([full], device=device)).logits[0].float().cpu().numpy()
            got = wick_logits(build, folder, full, device,
                              os.path.join(work, f"tf_{i}.f32")).reshape(ref.shape)
            tf_equal.append(float((got == ref).mean()))
    del model
    f32_lead = []
    if with_f32:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                     attn_implementation="eager").to(device)
        for ids, t in zip(ps, ref_tokens):
            f32_lead.append(leading(hf_greedy(model.eval(), ids, n_new, device)[0], t))
        del model
    leads, gap_at_split = [], []
    for i, ids in enumerate(ps):
        got = wick_greedy(build, folder, ids, n_new, device)
        lead = leading(got, ref_tokens[i])
        leads.append(lead)
        if lead < n_new:
            gap_at_split.append(ref_gaps[i][lead] / bf16_spacing(ref_tops[i][lead]))
    gaps = np.concatenate(ref_gaps) / bf16_spacing(np.concatenate(ref_tops))
    summary = dict(
        config=f"{shape} d{cfg['hidden_size']} L{cfg['num_hidden_layers']} "
               f"h{cfg['num_attention_heads']}/{cfg['num_key_value_heads']} v{cfg['vocab_size']}",
        wick_vs_hf_bf16=leads, hf_bf16_vs_f32=f32_lead,
        median_gap_ulps=float(np.median(gaps)), ties=int((gaps == 0).sum()), steps=len(gaps),
        gap_at_first_divergence_ulps=[round(float(g), 2) for g in gap_at_split],
        median_top_logit=float(np.median(np.abs(np.concatenate(ref_tops)))),
        teacher_forced_bit_equal=[round(x, 5) for x in tf_equal])
    log(f"{summary['config']} on {device}:")
    log(f"  equal leading tokens, wick bf16 vs transformers bf16: {sum(leads)}/"
        f"{n_new * len(ps)} per prompt {leads}")
    if with_f32:
        log(f"  equal leading tokens, transformers bf16 vs transformers f32 (noise floor): "
            f"{sum(f32_lead)}/{n_new * len(ps)} per prompt {f32_lead}")
    log(f"  top1-top2 gap of transformers' bf16 logits: median {summary['median_gap_ulps']:.1f} "
        f"bf16 spacings (top logit median {summary['median_top_logit']:.3f}); exact ties "
        f"{summary['ties']}/{summary['steps']} steps; gap at each first divergence "
        f"{summary['gap_at_first_divergence_ulps']}")
    if teacher_forced:
        log(f"  bf16 logits bit-equal over prompt + continuation (prefill): {tf_equal}")
    return leads, summary


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--shape", default="llama1b", choices=sorted(SHAPES))
    ap.add_argument("--layers", type=int, default=0, help="fewer layers (0: the shape's)")
    ap.add_argument("--hidden", type=int, default=0, help="narrower model (0: the shape's)")
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=5)
    ap.add_argument("--work", default=None)
    ap.add_argument("--teacher-forced", action="store_true")
    ap.add_argument("--no-f32", action="store_true")
    a = ap.parse_args()
    check(a.build, a.shape, a.device, a.layers, a.hidden, a.new, a.prompts, a.work,
          a.teacher_forced, not a.no_f32)


if __name__ == "__main__":
    main()
