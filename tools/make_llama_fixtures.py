#!/usr/bin/env python3
"""Makes the tiny Llama and Mistral fixtures of tests/data/llama with Hugging Face `transformers` (PyPI).

Run from a venv that has torch, transformers, safetensors and h5py (Debian bookworm packages no
python3-transformers), with a built tessera for `prepare text`:
    bench/peer_venv.sh && .venv/bin/pip install transformers safetensors
    .venv/bin/python tools/make_llama_fixtures.py --tessera build/tessera [OUT_DIR]   # default tests/data/llama
    .venv/bin/python tools/make_llama_fixtures.py --tessera build/tessera --check OUT_DIR   # recompute, compare, write nothing

What it writes (LlamaForCausalLM models, and one MistralForCausalLM; no biases; float32 tensors):
  gqa_untied/           V=256 (byte tokens), C=64, H=4, KV=2, F=96, L=2, T=32, rope_theta 1e4,
                        rms_norm_eps 1e-5, lm_head separate: model.safetensors + config.json +
                        generation_config.json as save_pretrained writes them (one file)
  gqa_untied_sharded/   the same weights, save_pretrained(max_shard_size=SHARD): several
                        model-0000i-of-0000n.safetensors and model.safetensors.index.json
  mha_tied/             KV=H=4, F=128, rope_theta 5e5, rms_norm_eps 1e-6, lm_head tied to the
                        embedding (not stored), otherwise as gqa_untied
  mistral_window/       MistralForCausalLM (a llama whose attention has a sliding window):
                        sliding_window W=8 of the T=32 positions evaluated, C=32, H=4, KV=2,
                        F=64, L=2, rope_theta 500 (with head_dim 8 and W = 8, 1e4 and 5e5 differ by
                        less than 1e-6 of the loss), rms_norm_eps 1e-5, lm_head separate
  reference.json        per model: the mean next-token cross-entropy transformers computes in
                        float64 and in float32 on the windows `tessera eval` evaluates, the greedy
                        continuation of PROMPT, and the float64 loss under deliberate mistakes
                        (how far a wrong RoPE, GQA mapping, eps or norm moves it; for the Mistral,
                        no window (the same tensors as a LlamaForCausalLM) and windows W - 1, W + 1,
                        and the greedy continuation without the window)

The weights are not transformers' init (whose order of draws may change between releases) but
drawn here, tensor by tensor in name order, from one seeded torch.Generator, and scaled so that
the logits are far from uniform: every Linear N(0, 0.15^2); the embedding N(0, 0.02^2), small so
that the first RMSNorm's eps moves the result visibly (mean(x^2) = 4e-4 against eps 1e-5 / 1e-6);
every RMSNorm weight U(0.5, 1.5) (not ones: a swapped or ignored norm weight shows); the tied
model's final norm weight times 9, so its logits (through the small embedding) are not flat.

The evaluation data: `tessera prepare text --out TMP.h5 tests/data/bpe/kjv_slice.txt` (the
default --val-fraction 0.1: the last 1113 bytes are /val), read back with h5py; the loss is that
of `tessera eval` with model.context = 32 and data.test_split = "val": sample s is the window of
tokens [32 s, 32 s + 32) of /val with the next token at every position as labels, (N - 1) // 32
windows, and the loss is the mean over the windows of the mean over the 32 positions.
"""
import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

import h5py
import numpy as np
import torch
import torch.nn.functional as F
import transformers
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

SEED = 20261128
TEXT = os.path.join("tests", "data", "bpe", "kjv_slice.txt")  # relative to the repository root
SPLIT = "val"
CONTEXT = 32
PROMPT = "And God said"  # 12 bytes + 20 new tokens = 32: never more than the context
NEW_TOKENS = 20
SHARD = "200KB"  # gqa_untied's 378 KB of float32 tensors in 2 shards

WINDOW = 8  # the Mistral's sliding window: a quarter of the CONTEXT positions each window evaluates

BASE = dict(vocab_size=256, hidden_size=64, num_attention_heads=4, num_hidden_layers=2, max_position_embeddings=CONTEXT,
            hidden_act="silu", bos_token_id=None, eos_token_id=None, pad_token_id=None, use_cache=True)
LLAMA = dict(attention_bias=False, mlp_bias=False)  # LlamaConfig's keys that MistralConfig lacks
MODELS = {
    "gqa_untied": dict(LLAMA, num_key_value_heads=2, intermediate_size=96, rope_theta=10000.0, rms_norm_eps=1e-5,
                       tie_word_embeddings=False),
    "mha_tied": dict(LLAMA, num_key_value_heads=4, intermediate_size=128, rope_theta=500000.0, rms_norm_eps=1e-6,
                     tie_word_embeddings=True),
    "mistral_window": dict(hidden_size=32, num_key_value_heads=2, intermediate_size=64, rope_theta=500.0,
                           rms_norm_eps=1e-5, tie_word_embeddings=False, sliding_window=WINDOW),
}


def classes(name):
    """(config class, model class): a model with a sliding window is a Mistral, the others Llamas."""
    return (MistralConfig, MistralForCausalLM) if "sliding_window" in MODELS[name] else (LlamaConfig, LlamaForCausalLM)


def make_config(name, **change):
    return classes(name)[0](**{**BASE, **MODELS[name], **change})


def make_model(name):
    config = make_config(name)
    torch.manual_seed(SEED)  # nothing below should draw from it, but transformers' own init does
    model = classes(name)[1](config).float().eval()
    g = torch.Generator().manual_seed(SEED)
    params = dict(model.named_parameters())  # a tied lm_head.weight is the embedding: listed once
    with torch.no_grad():
        for pname in sorted(params):
            p = params[pname]
            if pname.endswith("norm.weight"):
                p.copy_(0.5 + torch.rand(p.shape, generator=g, dtype=torch.float64))
                if pname == "model.norm.weight" and config.tie_word_embeddings:
                    p.mul_(9.0)
            elif pname == "model.embed_tokens.weight":
                p.copy_(0.02 * torch.randn(p.shape, generator=g, dtype=torch.float64))
            else:
                p.copy_(0.15 * torch.randn(p.shape, generator=g, dtype=torch.float64))
    if config.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return model


def windows(h5_path):
    with h5py.File(h5_path, "r") as f:
        tokens = f[SPLIT]["tokens"][()].astype(np.int64)
        start = int(f[SPLIT].attrs["start"])
    n = (len(tokens) - 1) // CONTEXT
    x = torch.from_numpy(tokens[:n * CONTEXT].reshape(n, CONTEXT))
    y = torch.from_numpy(tokens[1:n * CONTEXT + 1].reshape(n, CONTEXT))
    return x, y, len(tokens), start


def mean_loss(model, x, y):
    """tessera eval's loss: the mean over windows of each window's mean cross-entropy."""
    with torch.no_grad():
        logits = model(input_ids=x).logits
        per_window = F.cross_entropy(logits.transpose(1, 2), y, reduction="none").mean(dim=1)
    return float(per_window.double().mean())


def greedy(model):
    prompt = torch.tensor([list(PROMPT.encode())])
    with torch.no_grad():
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW_TOKENS,
                             min_new_tokens=NEW_TOKENS, do_sample=False, num_beams=1)
        # The same by hand, as tessera generate does it: argmax of the last position's logits.
        tokens = prompt[0].tolist()
        for _ in range(NEW_TOKENS):
            tokens.append(int(model(input_ids=torch.tensor([tokens[-CONTEXT:]])).logits[0, -1].argmax()))
    new = out[0, prompt.shape[1]:].tolist()
    assert new == tokens[prompt.shape[1]:], (new, tokens)
    return new


def without_window(name, model):
    """The Mistral's tensors as a LlamaForCausalLM in float64: the same model without its window."""
    llama = {k: v for k, v in MODELS[name].items() if k != "sliding_window"}
    m = LlamaForCausalLM(LlamaConfig(**{**BASE, **llama})).double().eval()
    m.load_state_dict(model.state_dict())
    return m


def perturbed(model, name, x, y):
    """float64 losses of deliberately wrong variants of the model: what each mistake costs."""
    out = {}
    config = model.config
    model_class = classes(name)[1]

    def loss_of(change):
        m = model_class(config).double().eval()
        m.load_state_dict(model.state_dict())
        change(m)
        return mean_loss(m, x, y)

    def loss_as(**change):
        m = model_class(make_config(name, **change)).double().eval()
        m.load_state_dict(model.state_dict())
        return mean_loss(m, x, y)

    hd = config.hidden_size // config.num_attention_heads
    other_theta = 500000.0 if MODELS[name]["rope_theta"] == 10000.0 else 10000.0
    out[f"rope_theta {other_theta:g}"] = loss_as(rope_theta=other_theta)

    if "sliding_window" in MODELS[name]:
        # The window: none (the same tensors and config keys as a LlamaForCausalLM), one short,
        # one long.
        out["no sliding window (LlamaForCausalLM)"] = mean_loss(without_window(name, model), x, y)
        for w in (WINDOW - 1, WINDOW + 1):
            out[f"sliding_window {w}"] = loss_as(sliding_window=w)

    other_eps = 1e-6 if config.rms_norm_eps == 1e-5 else 1e-5

    def eps(m):
        for mod in m.modules():
            if hasattr(mod, "variance_epsilon"):
                mod.variance_epsilon = other_eps
    out[f"rms_norm_eps {other_eps:g}"] = loss_of(eps)

    def interleaved(m):
        # RoPE on pairs (2i, 2i+1) instead of rotate_half's (i, i + hd/2): the same as HF's
        # rotate_half on q/k rows taken in the order 0, 2, 4, ..., 1, 3, 5, ... of each head.
        order = torch.cat([torch.arange(0, hd, 2), torch.arange(1, hd, 2)])
        for layer in m.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj):
                w = proj.weight.data.view(-1, hd, proj.weight.shape[1])
                proj.weight.data.copy_(w[:, order].reshape(proj.weight.shape))
    out["rope interleaved pairs"] = loss_of(interleaved)

    heads, kv = config.num_attention_heads, config.num_key_value_heads
    if kv < heads:
        def gqa_modulo(m):
            # Query head h reads kv head h % KV instead of h // (H / KV): reorder the q heads
            # (and o_proj's input columns) so that HF's pairing becomes the modulo one.
            group = heads // kv
            position = {h: (h % kv) * group + h // kv for h in range(heads)}
            order = [h for h, _ in sorted(position.items(), key=lambda e: e[1])]
            for layer in m.model.layers:
                q, o = layer.self_attn.q_proj.weight.data, layer.self_attn.o_proj.weight.data
                q.copy_(q.view(heads, hd, -1)[order].reshape(q.shape))
                o.copy_(o.view(o.shape[0], heads, hd)[:, order].reshape(o.shape))
        out["gqa query head h on kv head h % KV"] = loss_of(gqa_modulo)

    def ones(m):
        for pname, p in m.named_parameters():
            if pname.endswith("norm.weight"):
                p.data.fill_(1.0)
    out["norm weights ignored (ones)"] = loss_of(ones)

    def swap(m):
        for layer in m.model.layers:
            a, b = layer.input_layernorm.weight.data, layer.post_attention_layernorm.weight.data
            t = a.clone()
            a.copy_(b)
            b.copy_(t)
    out["ln_1 and ln_2 swapped"] = loss_of(swap)
    return out


def sha256_tree(folder):
    return {os.path.relpath(os.path.join(d, f), folder): hashlib.sha256(open(os.path.join(d, f), "rb").read()).hexdigest()
            for d, _, files in os.walk(folder) for f in files}


def write(out_dir, tessera, root):
    with tempfile.TemporaryDirectory() as tmp:
        h5 = os.path.join(tmp, "kjv_slice.h5")
        command = [tessera, "prepare", "text", "--out", h5, TEXT]
        subprocess.run(command, cwd=root, check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        x, y, n_tokens, start = windows(h5)
    reference = {
        "command": "python tools/make_llama_fixtures.py --tessera build/tessera",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "numpy": np.__version__,
                     "h5py": h5py.__version__, "python": sys.version.split()[0]},
        "data": {"prepare": f"tessera prepare text --out DATA.h5 {TEXT}", "val_fraction": 0.1, "split": SPLIT,
                 "split_start": start, "split_tokens": n_tokens, "context": CONTEXT, "windows": int(x.shape[0]),
                 "unused_tail_tokens": n_tokens - 1 - int(x.shape[0]) * CONTEXT,
                 "sample": "window s: tokens [s*T, s*T+T) of the split, labels [s*T+1, s*T+T+1)",
                 "loss": "mean over the windows of the mean over the T positions of the natural-log cross-entropy "
                         "(= tessera eval with model.context = 32, data.test_split = \"val\")"},
        "generate": {"prompt": PROMPT, "prompt_ids": list(PROMPT.encode()), "new_tokens": NEW_TOKENS,
                     "how": "greedy (do_sample=False), model.generate and an argmax loop over the last 32 tokens agree"},
        "init": {"seed": SEED, "linear": "N(0, 0.15^2)", "embedding": "N(0, 0.02^2)",
                 "norm_weights": "U(0.5, 1.5); the tied model's model.norm.weight times 9"},
        "models": {},
    }
    for name in MODELS:
        model = make_model(name)
        folder = os.path.join(out_dir, name)
        shutil.rmtree(folder, ignore_errors=True)
        model.save_pretrained(folder, safe_serialization=True)
        folders = [name]
        if name == "gqa_untied":
            sharded = os.path.join(out_dir, name + "_sharded")
            shutil.rmtree(sharded, ignore_errors=True)
            model.save_pretrained(sharded, safe_serialization=True, max_shard_size=SHARD)
            shards = [f for f in os.listdir(sharded) if f.endswith(".safetensors")]
            assert len(shards) >= 2 and os.path.exists(os.path.join(sharded, "model.safetensors.index.json")), shards
            folders.append(name + "_sharded")
        # Reference numbers from what was written, loaded back as any user would.
        model_class = classes(name)[1]
        m64 = model_class.from_pretrained(folder, torch_dtype=torch.float64).eval()
        m32 = model_class.from_pretrained(folder, torch_dtype=torch.float32).eval()
        if "sliding_window" in MODELS[name]:
            assert type(m64) is MistralForCausalLM and m64.config.sliding_window == WINDOW, m64.config
        loss64, loss32 = mean_loss(m64, x, y), mean_loss(m32, x, y)
        new64, new32 = greedy(m64), greedy(m32)
        c = m64.config
        entry = {
            "folders": folders,
            "dims": {"V": c.vocab_size, "C": c.hidden_size, "H": c.num_attention_heads, "KV": c.num_key_value_heads,
                     "hd": c.hidden_size // c.num_attention_heads, "F": c.intermediate_size,
                     "L": c.num_hidden_layers, "T": c.max_position_embeddings, "rope_theta": MODELS[name]["rope_theta"],
                     "norm_eps": c.rms_norm_eps, "tie_embeddings": c.tie_word_embeddings,
                     "window": MODELS[name].get("sliding_window", 0)},
            "parameters": sum(p.numel() for p in m64.parameters()),
            "loss_float64": loss64,
            "loss_float32": loss32,
            "uniform_loss": float(np.log(256.0)),
            "generate_float64_new_ids": new64,
            "generate_float32_new_ids": new32,
            "generate_output_hex": (PROMPT.encode() + bytes(new64)).hex(),
            "loss_float64_if_wrong": perturbed(m64, name, x, y),
        }
        if "sliding_window" in MODELS[name]:
            # The greedy continuation of the same tensors without the window (a LlamaForCausalLM).
            entry["generate_float64_new_ids_if_no_window"] = greedy(without_window(name, m64))
            # The window must matter well beyond the 1e-5 that the tests allow, and to the text.
            for mistake, loss in entry["loss_float64_if_wrong"].items():
                if "window" in mistake:
                    assert abs(loss - loss64) > 1e-4 * loss64, (mistake, loss, loss64)
            assert entry["generate_float64_new_ids_if_no_window"] != new64
        if name == "gqa_untied":
            sharded_model = LlamaForCausalLM.from_pretrained(os.path.join(out_dir, name + "_sharded"),
                                                             torch_dtype=torch.float64).eval()
            assert mean_loss(sharded_model, x, y) == loss64
        reference["models"][name] = entry
    sizes = {}
    for d in sorted(os.listdir(out_dir)):
        if os.path.isdir(os.path.join(out_dir, d)):
            for f in sorted(os.listdir(os.path.join(out_dir, d))):
                sizes[f"{d}/{f}"] = os.path.getsize(os.path.join(out_dir, d, f))
    reference["file_bytes"] = sizes
    with open(os.path.join(out_dir, "reference.json"), "w") as f:
        json.dump(reference, f, indent=1)
        f.write("\n")
    return reference


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tessera", required=True, help="a built tessera (for `prepare text`)")
    parser.add_argument("--check", action="store_true", help="recompute into a temporary folder and compare with OUT_DIR")
    parser.add_argument("out_dir", nargs="?")
    args = parser.parse_args()
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
    tessera = os.path.abspath(args.tessera)
    out_dir = os.path.abspath(args.out_dir or os.path.join(root, "tests", "data", "llama"))
    torch.use_deterministic_algorithms(True)
    transformers.utils.logging.disable_progress_bar()
    if not args.check:
        os.makedirs(out_dir, exist_ok=True)
        ref = write(out_dir, tessera, root)
        for name, e in ref["models"].items():
            print(f"{name}: loss float64 {e['loss_float64']:.12g} float32 {e['loss_float32']:.9g} "
                  f"greedy {e['generate_float64_new_ids']}")
        print(f"wrote {out_dir}: {sum(ref['file_bytes'].values()) + os.path.getsize(os.path.join(out_dir, 'reference.json'))} bytes")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        write(tmp, tessera, root)
        have, want = sha256_tree(out_dir), sha256_tree(tmp)
        bad = 0
        for f in sorted(set(have) | set(want)):
            same = have.get(f) == want.get(f)
            bad += not same
            print(f"{f}: {'same' if same else 'DIFFERENT'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
