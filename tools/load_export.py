#!/usr/bin/env python3
"""Load a `tessera export` into plain PyTorch modules and evaluate it.

    tools/load_export.py eval EXPORT [--data FILE] [--split NAME] [--expect-loss X] [--rtol 1e-5]
    tools/load_export.py eval HF_DIR --data FILE [--split val] [--context T] [--expect-loss X] [--rtol 1e-5]
    tools/load_export.py hf-generate DIR --prompt TEXT [--tokens N] [--expect TEXT] [--expect-ids A,B,...]

`eval` reads EXPORT (a .safetensors file, or a .pt state_dict loaded with weights_only=True) and
the JSON `tessera export` wrote beside it (same path, .json), builds the model as ordinary
torch.nn modules whose parameter names are the export's (load_state_dict(strict=True) checks
every name and shape), and computes the loss `tessera eval` prints on the same split of the same
data: the mean cross-entropy (or squared error) over the samples; for a gpt the mean over windows
of `context` tokens of the next-token cross-entropy at every position (its attention under the
JSON's sliding `window`, where that is not 0); for a unet (the model is
bench/unet_torch.py's UNet, standardising with the export's normalisation statistics) the mean
squared error of the standardised fields and the relative L2 error. The arithmetic is float64.
With --expect-loss it exits 1 unless |loss - X| <= rtol * |X|; likewise --expect-rel-l2, and
--stats-rtol for a unet's statistics against those recomputed from the deck's training split.

`eval DIR`, where DIR is a Hugging Face LlamaForCausalLM directory (config.json with
"architectures": ["LlamaForCausalLM"], model.safetensors or sharded with its index; what
`tessera export --hf-llama` writes, or tests/data/llama/*), a MistralForCausalLM one (what
`--hf-llama` writes for a llama with model.window) or a `--hf-gpt2` one, loads it with
transformers' `from_pretrained` of that class (no custom code), converts it to float64 and computes the same
token loss as for a gpt export on --data (required: there is no deck) and --split (default
"val"), windows of --context tokens (default: config.json's max_position_embeddings). It refuses
a transformers that did not take config.json's rope_theta (transformers 4.x ignores the
"rope_parameters" that transformers 5 writes).

`hf-generate` loads a `tessera export --hf-gpt2` directory with Hugging Face transformers'
GPT2LMHeadModel, or a LlamaForCausalLM or MistralForCausalLM directory (config.json's "architectures"
says which), and
prints the greedy continuation of a prompt of bytes, as `tessera generate --temperature 0` does:
the prompt's bytes and the new tokens as bytes, then a newline. --expect TEXT exits 1 unless that
output (without the newline) is TEXT byte for byte; --expect-ids A,B,... unless the new tokens
are those ids.

Needs PyTorch (Debian: python3-torch), numpy and h5py; transformers (PyPI) only for a Hugging
Face directory and hf-generate.
"""
import argparse
import json
import os
import struct
import sys
import tomllib
from collections import OrderedDict
from pathlib import Path

from require import require

h5py, np, torch = require("load_export", "h5py", "numpy", "torch")
from torch import nn  # noqa: E402  (torch imports)
import torch.nn.functional as F  # noqa: E402

# --- Reading an export -------------------------------------------------------------------------

_DTYPES = {"F32": np.float32, "F64": np.float64, "F16": np.float16}


def read_safetensors(path):
    """The tensors (name -> float32 torch tensor) and __metadata__ of a safetensors file."""
    blob = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    metadata = header.pop("__metadata__", {})
    data = memoryview(blob)[8 + n:]
    tensors = OrderedDict()
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        raw = data[begin:end]
        if entry["dtype"] == "BF16":  # the top half of a float32
            bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            values = bits.view(np.float32)
        else:
            values = np.frombuffer(raw, dtype=np.dtype(_DTYPES[entry["dtype"]]).newbyteorder("<"))
        tensors[name] = torch.from_numpy(values.astype(np.float32).reshape(entry["shape"]))
    return tensors, metadata


def load_export(path):
    """(state_dict of the model's parameters, optimizer state by name, config) of an export."""
    path = Path(path)
    config = json.loads(path.with_suffix(".json").read_text())
    if path.suffix == ".pt":
        tensors = torch.load(path, weights_only=True)
    else:
        tensors, _ = read_safetensors(path)
    model = OrderedDict((k, v) for k, v in tensors.items() if not k.startswith("optimizer/"))
    optimizer = OrderedDict((k, v) for k, v in tensors.items() if k.startswith("optimizer/"))
    return model, optimizer, config


# --- The models, as PyTorch modules with Tessera's parameter names -----------------------------

def activation(config):
    if config["activation"] == "gelu":
        return nn.GELU(approximate=config.get("gelu_approximate", "none"))
    return nn.ReLU()


class Mlp(nn.Module):
    def __init__(self, c):
        super().__init__()
        widths = [c["in_features"]] + c["hidden"] + [c["outputs"]]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths, widths[1:]))
        self.act = activation(c)

    def forward(self, x):
        x = x.flatten(1)
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i + 1 < len(self.layers):
                x = self.act(x)
        return x


class Cnn(nn.Module):
    def __init__(self, c):
        super().__init__()
        channels = [c["in_channels"]] + c["channels"]
        k = c["kernel"]
        self.convs = nn.ModuleList(nn.Conv2d(a, b, k, padding=k // 2) for a, b in zip(channels, channels[1:]))
        widths = [c["tensors"]["fc.0.weight"][1]] + c["hidden"] + [c["outputs"]]
        self.fc = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths, widths[1:]))

    def forward(self, x):
        if x.dim() == 3:  # [N, H, W]: one channel
            x = x.unsqueeze(1)
        for conv in self.convs:
            x = F.max_pool2d(F.relu(conv(x)), 2)
        x = x.flatten(1)  # C, H, W order
        for i, layer in enumerate(self.fc):
            x = layer(x)
            if i + 1 < len(self.fc):
                x = F.relu(x)
        return x


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        width, self.heads = c["width"], c["heads"]
        self.qkv = nn.Linear(width, 3 * width)  # q, k, v rows stacked
        self.proj = nn.Linear(width, width)
        self.scale = c["attention_scale"]
        self.window = c.get("window", 0)  # a sliding window: query i sees keys i - window < j <= i

    def forward(self, x):
        b, t, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=2)
        q, k, v = (z.view(b, t, self.heads, width // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) * self.scale
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        if self.window > 0:
            mask = mask.triu(-(self.window - 1))
        scores = scores.masked_fill(~mask, float("-inf"))
        y = scores.softmax(dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(b, t, width))


class MlpBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.fc = nn.Linear(c["width"], c["mlp_hidden"])
        self.proj = nn.Linear(c["mlp_hidden"], c["width"])
        self.act = activation(c)

    def forward(self, x):
        return self.proj(self.act(self.fc(x)))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        eps = c["layer_norm_eps"]
        self.ln_1 = nn.LayerNorm(c["width"], eps=eps)
        self.attn = Attention(c)
        self.ln_2 = nn.LayerNorm(c["width"], eps=eps)
        self.mlp = MlpBlock(c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Gpt(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.wte = nn.Embedding(c["vocab_size"], c["width"])
        self.wpe = nn.Embedding(c["context"], c["width"])
        self.blocks = nn.ModuleList(Block(c) for _ in range(c["layers"]))
        self.ln_f = nn.LayerNorm(c["width"], eps=c["layer_norm_eps"])

    def forward(self, tokens):
        x = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight.T  # the head is tied to wte


def unet(c):
    """bench/unet_torch.py's UNet (the PyTorch peer of Tessera's U-Net), unchanged: an export's
    tensors are its state_dict."""
    import importlib.util
    path = Path(__file__).resolve().parent.parent / "bench" / "unet_torch.py"
    spec = importlib.util.spec_from_file_location("unet_torch", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.UNet(c["in_channels"], c["out_channels"], c["levels"], c["kernel"], c["activation"])


MODELS = {"mlp": Mlp, "cnn": Cnn, "gpt": Gpt, "unet": unet}


def build(state, config):
    """The export's model as a float64 torch module; every name and shape must match."""
    model = MODELS[config["kind"]](config).double()
    model.load_state_dict(OrderedDict((k, v.double()) for k, v in state.items()), strict=True)
    return model.eval()


# --- Evaluating as `tessera eval` does ----------------------------------------------------------

def deck_data(config, data, split):
    deck = tomllib.loads(config["deck"])
    return data or deck["data"]["path"], split or deck["data"]["test_split"]


def supervised_loss(model, group, batch):
    inputs = group["inputs"]
    scale = np.float32(inputs.attrs.get("scale", 1.0))
    offset = np.float32(inputs.attrs.get("offset", 0.0))
    labels = group["labels"][()].astype(np.int64) if "labels" in group else None
    targets = group["targets"][()] if "targets" in group else None
    total, n = 0.0, inputs.shape[0]
    for begin in range(0, n, batch):
        x = inputs[begin:begin + batch].astype(np.float32) * scale + offset  # float32, as Tessera maps
        out = model(torch.from_numpy(x.astype(np.float64)))
        if labels is not None:
            y = torch.from_numpy(labels[begin:begin + batch])
            total += F.cross_entropy(out, y, reduction="sum").item()
        else:
            t = torch.from_numpy(targets[begin:begin + batch].astype(np.float64)).reshape(out.shape)
            total += ((out - t) ** 2).mean(dim=1).sum().item()
    return total / n, n


def read_fields(group, name):
    """A split's inputs (float32 after x * scale + offset, as Tessera maps them) or targets."""
    v = group[name]
    x = v[()].astype(np.float32)
    if name == "inputs":
        x = x * np.float32(v.attrs.get("scale", 1.0)) + np.float32(v.attrs.get("offset", 0.0))
    return x


def channel_statistics(group):
    """Tessera's data.normalize statistics of a split: per channel mean and population std in
    float64, rounded to float32 (a constant channel's std is 1)."""
    stats = {}
    for name, prefix in (("inputs", "input"), ("targets", "target")):
        v = read_fields(group, name).astype(np.float64)
        mean = v.mean(axis=(0, 2, 3))
        std = np.sqrt(((v - mean[None, :, None, None]) ** 2).mean(axis=(0, 2, 3)))
        stats[prefix + "_mean"] = mean.astype(np.float32)
        stats[prefix + "_std"] = np.where(std.astype(np.float32) > 0, std.astype(np.float32), np.float32(1))
    return stats


def field_loss(model, group, norm, batch):
    """A unet's test loss as `tessera eval` prints it (the mean over samples of the mean squared
    error of the standardised fields) and the mean relative L2 error in the targets' units."""
    view = lambda key: torch.from_numpy(np.asarray(norm[key], dtype=np.float32).astype(np.float64)).view(1, -1, 1, 1)
    x_all, t_all = read_fields(group, "inputs"), read_fields(group, "targets")
    loss, rel, n = 0.0, 0.0, x_all.shape[0]
    for begin in range(0, n, batch):
        x = torch.from_numpy(x_all[begin:begin + batch].astype(np.float64))
        t = torch.from_numpy(t_all[begin:begin + batch].astype(np.float64))
        if norm:
            pred = model((x - view("input_mean")) / view("input_std")) * view("target_std") + view("target_mean")
            scaled = (pred - t) / view("target_std")
        else:
            pred = model(x)
            scaled = pred - t
        loss += (scaled ** 2).flatten(1).mean(dim=1).sum().item()
        rel += ((pred - t).flatten(1).norm(dim=1) / t.flatten(1).norm(dim=1)).sum().item()
    return loss / n, rel / n, n


def unet_eval(model, config, f, split, args):
    """Evaluates a unet export; prints how its statistics compare with the training split's."""
    deck = tomllib.loads(config["deck"])
    norm = config.get("normalization") or {}
    recomputed = channel_statistics(f[deck["data"]["train_split"]]) if norm else {}
    stats_ok = True
    if "input_mean" in norm:
        # Each difference relative to its channel's std (a mean near 0 is as exact as the values allow).
        diff = max(float(np.max(np.abs(np.asarray(norm[k], dtype=np.float64) - v) / recomputed[k[:k.index("_")] + "_std"]))
                   for k, v in recomputed.items())
        print(f"statistics: the export's against /{deck['data']['train_split']}'s recomputed: "
              f"max relative difference {diff:.3g} (of each channel's std)")
        stats_ok = args.stats_rtol is None or diff <= args.stats_rtol
    elif norm:  # an export of a checkpoint that stores none: the training split's, as tessera eval
        print("statistics: none in the export; recomputed from the training split")
        norm = recomputed
    loss, rel, n = field_loss(model, f[split], norm, args.batch)
    print(f"relative L2 error {rel:.9g}")
    if args.expect_rel_l2 is not None:
        d = abs(rel - args.expect_rel_l2) / abs(args.expect_rel_l2)
        print(f"tessera eval said relative L2 error {args.expect_rel_l2:.9g}: relative difference {d:.3g}")
        stats_ok = stats_ok and d <= args.rtol
    return loss, n, stats_ok


def token_loss(model, group, context, batch):
    tokens = group["tokens"][()].astype(np.int64)
    windows = (len(tokens) - 1) // context  # sample s: tokens [sT, sT + T), labels one later
    x = torch.from_numpy(tokens[:windows * context].reshape(windows, context))
    y = torch.from_numpy(tokens[1:windows * context + 1].reshape(windows, context))
    total = 0.0
    for begin in range(0, windows, batch):
        logits = model(x[begin:begin + batch])
        per_window = F.cross_entropy(logits.transpose(1, 2), y[begin:begin + batch], reduction="none").mean(dim=1)
        total += per_window.sum().item()
    return total / windows, windows


# --- Hugging Face directories (transformers from PyPI; nothing else needs it) ------------------

HF_MODELS = ("GPT2LMHeadModel", "LlamaForCausalLM", "MistralForCausalLM")


def hf_architecture(folder):
    config = json.loads((Path(folder) / "config.json").read_text())
    arch = (config.get("architectures") or [None])[0]
    if arch not in HF_MODELS:
        raise SystemExit(f"load_export: error: {folder}/config.json: architectures {config.get('architectures')}, "
                         f"expected one of {', '.join(HF_MODELS)}")
    return arch, config


def check_rope_theta(model, config, folder):
    """Fails unless the loaded model's RoPE frequencies are config.json's rope_theta (top-level as
    transformers 4 writes it, or under rope_parameters as transformers 5 does)."""
    theta = config.get("rope_theta", (config.get("rope_parameters") or {}).get("rope_theta", 10000.0))
    hd = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    want = 1.0 / (float(theta) ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    found = [b for n, b in model.named_buffers() if n.endswith("inv_freq")]
    if not found or any(b.shape != want.shape or not torch.allclose(b.double(), want, rtol=1e-5, atol=0) for b in found):
        raise SystemExit(f"load_export: error: {folder}: transformers {sys.modules['transformers'].__version__} "
                         f"did not build RoPE with config.json's rope_theta {theta} (transformers 4.x ignores "
                         f"transformers 5's \"rope_parameters\"); use transformers 5")


def load_hf(folder):
    """(model in float32 as stored, its class name, max context) of a Hugging Face directory."""
    transformers = require("load_export", "transformers")
    transformers.utils.logging.disable_progress_bar()
    arch, config = hf_architecture(folder)
    model = getattr(transformers, arch).from_pretrained(folder).eval()
    if arch == "MistralForCausalLM" and model.config.sliding_window != config.get("sliding_window"):
        raise SystemExit(f"load_export: error: {folder}: transformers {transformers.__version__} built a sliding "
                         f"window of {model.config.sliding_window}, config.json says {config.get('sliding_window')}")
    if arch in ("LlamaForCausalLM", "MistralForCausalLM"):
        check_rope_theta(model, config, folder)
        return model, arch, config["max_position_embeddings"]
    return model, arch, config["n_positions"]


def hf_evaluate(args):
    """The token loss of a Hugging Face causal LM directory, as `tessera eval` computes it."""
    require("load_export", "transformers")
    if not args.data:
        raise SystemExit(f"load_export: error: {args.export} is a Hugging Face directory: --data FILE is required")
    model, arch, context = load_hf(args.export)
    model = model.double()
    context = args.context or context
    split = args.split or "val"
    with torch.no_grad(), h5py.File(args.data, "r") as f:
        loss, n = token_loss(lambda x: model(input_ids=x).logits, f[split], context, args.batch)
    print(f"{args.export}: loss {loss:.9g} on {args.data} /{split} ({n} windows of {context} tokens; loss per token; "
          f"{arch} in float64)")
    return loss


def evaluate(args):
    if Path(args.export).is_dir():
        loss, ok = hf_evaluate(args), True
        return check_loss(args, loss, ok)
    state, _, config = load_export(args.export)
    model = build(state, config)
    data, split = deck_data(config, args.data, args.split)
    ok = True
    with torch.no_grad(), h5py.File(data, "r") as f:
        group = f[split]
        if config["kind"] == "unet":
            loss, n, ok = unet_eval(model, config, f, split, args)
            what = "samples; loss of the standardised fields" if config.get("normalization") else "samples"
        elif config["kind"] == "gpt":
            loss, n = token_loss(model, group, config["context"], args.batch)
            what = f"windows of {config['context']} tokens; loss per token"
        else:
            loss, n = supervised_loss(model, group, args.batch)
            what = "samples"
    print(f"{args.export}: loss {loss:.9g} on {data} /{split} ({n} {what})")
    return check_loss(args, loss, ok)


def check_loss(args, loss, ok):
    if args.expect_loss is not None:
        rel = abs(loss - args.expect_loss) / max(abs(args.expect_loss), 1e-30)
        print(f"tessera eval said {args.expect_loss:.9g}: relative difference {rel:.3g} (tolerance {args.rtol:g})")
        if not rel <= args.rtol:
            return 1
    return 0 if ok else 1


def hf_generate(args):
    model, _, context = load_hf(args.dir)
    tokens = list(os.fsencode(args.prompt))  # the prompt's bytes, as the command line gave them
    start = len(tokens)
    with torch.no_grad():
        for _ in range(args.tokens):  # greedy, the last `context` tokens, as tessera generate
            window = torch.tensor([tokens[-context:]])
            tokens.append(int(model(input_ids=window).logits[0, -1].argmax()))
    sys.stdout.buffer.write(bytes(tokens) + b"\n")  # byte tokens, as tessera generate prints them
    sys.stdout.flush()
    ok = True
    if args.expect is not None:
        same = bytes(tokens) == os.fsencode(args.expect)
        print(f"hf-generate: the output is {'' if same else 'NOT '}the expected text", file=sys.stderr)
        ok = ok and same
    if args.expect_ids is not None:
        want = [int(t) for t in args.expect_ids.split(",") if t.strip()]
        same = tokens[start:] == want
        print(f"hf-generate: new ids {','.join(map(str, tokens[start:]))}: {'' if same else 'NOT '}the expected ids",
              file=sys.stderr)
        ok = ok and same
    return 0 if ok else 1


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    e = sub.add_parser("eval", help="evaluate an export as tessera eval does")
    e.add_argument("export", help=".safetensors or .pt written by tessera export (its .json beside it), or a "
                                  "Hugging Face LlamaForCausalLM directory")
    e.add_argument("--data", help="dataset (default: the deck's data.path; required for a directory)")
    e.add_argument("--split", help="split (default: the deck's data.test_split; \"val\" for a directory)")
    e.add_argument("--context", type=int, help="a directory: tokens per window (default: max_position_embeddings)")
    e.add_argument("--batch", type=int, default=256, help="samples per forward")
    e.add_argument("--expect-loss", type=float, help="the loss tessera eval printed")
    e.add_argument("--rtol", type=float, default=1e-5, help="relative tolerance for --expect-loss and --expect-rel-l2")
    e.add_argument("--expect-rel-l2", type=float, help="a unet: the relative L2 error tessera eval printed")
    e.add_argument("--stats-rtol", type=float,
                   help="a unet: the largest difference allowed between the export's normalisation statistics "
                        "and those recomputed from the training split, relative to each channel's std")
    g = sub.add_parser("hf-generate", help="greedy text from a GPT-2 or Llama directory with transformers")
    g.add_argument("dir", help="directory written by tessera export --hf-gpt2 (or a LlamaForCausalLM one)")
    g.add_argument("--prompt", required=True)
    g.add_argument("--tokens", type=int, default=50)
    g.add_argument("--expect", help="exit 1 unless the output (prompt and new bytes) is this text, byte for byte")
    g.add_argument("--expect-ids", help="exit 1 unless the new tokens are these ids (comma-separated)")
    args = parser.parse_args()
    return evaluate(args) if args.command == "eval" else hf_generate(args)


if __name__ == "__main__":
    sys.exit(main())
