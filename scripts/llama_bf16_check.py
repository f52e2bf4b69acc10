#!/usr/bin/env python3
"""Issue 15's bf16 bar: wick's greedy tokens against transformers' in bf16 on the same weights.

  python3 scripts/llama_bf16_check.py --build build --device cpu --shape llama1b --layers 4
  python3 scripts/llama_bf16_check.py --build build-gpu --device cuda --shape qwen05b \
      --teacher-forced --peer

For each of 5 seeded prompts, 64 greedy tokens from:
  - transformers in bf16, loaded as users load it (from_pretrained(dtype=bfloat16), eager
    attention): the reference. NB `model.to(torch.bfloat16)` also rounds the rotary inv_freq
    buffer to bf16 (from_pretrained keeps it f32), which moves the rope angles: not a reference.
  - transformers in f32 (the noise floor: how far bf16 itself is from f32);
  - with --peer, transformers bf16 with every nn.Linear summed in another order (f32 matmul
    rounded once): the same rounding points, other f32 sums. Its agreement with the reference
    is the floor that any other implementation (wick included) can be held to;
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

# wick rounds short f16/bf16 attention as transformers does (on CUDA this is opt-in).
os.environ.setdefault("WICK_ATTENTION_ROUNDING", "transformers")

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


def check(builds, shape, device, layers=0, hidden=0, n_new=64, n_prompts=5, work=None,
          teacher_forced=False, with_f32=True, log=print, folder=None, with_peer=False):
    """Runs the comparison for each build (a list of build dirs, e.g. before and after a
    change; transformers runs once); returns {build: (equal leading tokens per prompt, summary)}.
    """
    import torch
    from transformers import AutoModelForCausalLM
    if isinstance(builds, str):
        builds = [builds]
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        # cuBLAS may otherwise reduce split-K partial sums in bf16 (PyTorch's default allows
        # it): a rounding inside the matmul that no op boundary shows. wick sums in f32.
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
        torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    work = work or tempfile.mkdtemp(prefix="wick-bf16-")
    folder = folder or os.path.join(work, f"{shape}_l{layers}_h{hidden}")
    cfg = shape_config(shape, layers, hidden)
    if not os.path.exists(os.path.join(folder, "model.safetensors")):
        save_folder(make_model(cfg, seed=0), folder)
    ps = prompts(cfg["vocab_size"], n_prompts)
    n = n_new * len(ps)
    ref_tokens, ref_gaps, ref_tops = [], [], []
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16,
                                                 attn_implementation="eager").to(device).eval()
    for ids in ps:
        t, g, top = hf_greedy(model, ids, n_new, device)
        ref_tokens.append(t)
        ref_gaps.append(g)
        ref_tops.append(top)
    # Teacher-forced: one prefill of prompt + reference continuation; the argmax at each of the
    # n_new positions, compared position by position (no cascade after a first difference).
    tf_full, tf_ref, hf_self = [], [], 0
    if teacher_forced:
        for ids, t in zip(ps, ref_tokens):
            full = ids + t[:-1]
            tf_full.append(full)
            with torch.no_grad():
                ref = model(torch.tensor([full], device=device)).logits[0].float().cpu().numpy()
            tf_ref.append(ref)
            hf_self += int((ref[len(ids) - 1:].argmax(1) == np.array(t)).sum())
    del model
    f32_lead, f32_tf_agree = [], 0
    if with_f32:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                     attn_implementation="eager").to(device)
        for ids, t in zip(ps, ref_tokens):
            f32_lead.append(leading(hf_greedy(model.eval(), ids, n_new, device)[0], t))
        for ids, full, t in zip(ps, tf_full, ref_tokens):
            with torch.no_grad():
                ref = model(torch.tensor([full], device=device)).logits[0].float().cpu().numpy()
            f32_tf_agree += int((ref[len(ids) - 1:].argmax(1) == np.array(t)).sum())
        del model
    # The floor for "same rounding points": transformers bf16 itself with every nn.Linear
    # summed in another order (an f32 matmul of the widened operands, rounded once: the same
    # single rounding, other f32 sums).
    peer_lead, peer_tf = [], 0
    if with_peer:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16,
                                                     attn_implementation="eager").to(device).eval()
        for mod in model.modules():
            if isinstance(mod, torch.nn.Linear):
                w32 = mod.weight.detach().float()
                b32 = None if mod.bias is None else mod.bias.detach().float()
                mod.forward = (lambda w, b: lambda x: torch.nn.functional.linear(
                    x.float(), w, b).to(x.dtype))(w32, b32)
        for ids, t in zip(ps, ref_tokens):
            peer_lead.append(leading(hf_greedy(model, ids, n_new, device)[0], t))
        for ids, full, t in zip(ps, tf_full, ref_tokens):
            with torch.no_grad():
                ref = model(torch.tensor([full], device=device)).logits[0].float().cpu().numpy()
            peer_tf += int((ref[len(ids) - 1:].argmax(1) == np.array(t)).sum())
        del model
    gaps = np.concatenate(ref_gaps) / bf16_spacing(np.concatenate(ref_tops))
    config = (f"{shape} d{cfg['hidden_size']} L{cfg['num_hidden_layers']} "
              f"h{cfg['num_attention_heads']}/{cfg['num_key_value_heads']} v{cfg['vocab_size']}")
    log(f"{config} on {device}, {len(ps)} prompts x {n_new} greedy tokens; transformers "
        f"bf16 (eager) is the reference:")
    if with_f32:
        log(f"  transformers f32 vs bf16, equal leading tokens (noise floor): {sum(f32_lead)}/{n}"
            f" per prompt {f32_lead}")
    log(f"  top1-top2 gap of transformers' bf16 logits: median {np.median(gaps):.1f} bf16 "
        f"spacings (top logit median {np.median(np.abs(np.concatenate(ref_tops))):.3f}); exact "
        f"ties {int((gaps == 0).sum())}/{len(gaps)} steps; <= 1 spacing "
        f"{int((gaps <= 1).sum())}/{len(gaps)}")
    if with_peer:
        log(f"  transformers bf16 with nn.Linear summed in another order (f32 matmul, one "
            f"rounding), vs the reference: equal leading tokens {sum(peer_lead)}/{n} per prompt "
            f"{peer_lead}" + (f"; teacher-forced argmax {peer_tf}/{n}" if teacher_forced else ""))
    if teacher_forced:
        log(f"  transformers' own bf16 prefill argmax vs its decode-path tokens: {hf_self}/{n}"
            + (f"; its f32 prefill argmax vs the bf16 tokens: {f32_tf_agree}/{n}"
               if with_f32 else ""))
    results = {}
    for build in builds:
        leads, gap_at_split = [], []
        for i, ids in enumerate(ps):
            got = wick_greedy(build, folder, ids, n_new, device)
            lead = leading(got, ref_tokens[i])
            leads.append(lead)
            if lead < n_new:
                gap_at_split.append(round(float(ref_gaps[i][lead] /
                                                bf16_spacing(ref_tops[i][lead])), 2))
        summary = dict(config=config, leads=leads, gap_at_first_divergence=gap_at_split)
        log(f"  [{build}] wick bf16 vs transformers bf16, equal leading tokens: {sum(leads)}/{n} "
            f"per prompt {leads}; transformers' gap at each first divergence {gap_at_split} "
            f"bf16 spacings")
        if teacher_forced:
            bit_equal, agree, tf_gaps = [], 0, []
            for i, (ids, full) in enumerate(zip(ps, tf_full)):
                ref = tf_ref[i]
                got = wick_logits(build, folder, full, device,
                                  os.path.join(work, f"tf_{i}.f32")).reshape(ref.shape)
                sl = slice(len(ids) - 1, len(full))
                bit_equal.append(float((got[sl] == ref[sl]).mean()))
                ra, ga = ref[sl].argmax(1), got[sl].argmax(1)
                agree += int((ra == ga).sum())
                top2 = np.sort(ref[sl], axis=1)[:, -2:]
                gap = (top2[:, 1] - top2[:, 0]) / bf16_spacing(top2[:, 1])
                tf_gaps += [round(float(g), 2) for g in gap[ra != ga]]
            summary.update(tf_bit_equal=bit_equal, tf_agree=agree, tf_gaps=tf_gaps)
            log(f"  [{build}] teacher-forced (one prefill of prompt + transformers' "
                f"continuation): argmax equal {agree}/{n}, where not: transformers' gap "
                f"{tf_gaps} bf16 spacings; logits bit-equal "
                f"{np.round(bit_equal, 4).tolist()}")
        results[build] = (leads, summary)
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--build", default="build", help="comma list: several builds compared")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--shape", default="llama1b", choices=sorted(SHAPES))
    ap.add_argument("--layers", type=int, default=0, help="fewer layers (0: the shape's)")
    ap.add_argument("--hidden", type=int, default=0, help="narrower model (0: the shape's)")
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=5)
    ap.add_argument("--work", default=None)
    ap.add_argument("--teacher-forced", action="store_true")
    ap.add_argument("--no-f32", action="store_true")
    ap.add_argument("--peer", action="store_true",
                    help="also transformers with nn.Linear summed in f32 (the summation-order "
                         "floor)")
    a = ap.parse_args()
    check(a.build.split(","), a.shape, a.device, a.layers, a.hidden, a.new, a.prompts, a.work,
          a.teacher_forced, not a.no_f32, with_peer=a.peer)


if __name__ == "__main__":
    main()
