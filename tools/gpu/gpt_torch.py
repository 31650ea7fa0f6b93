#!/usr/bin/env python3
"""The PyTorch peer of Tessera's GPT on a CUDA device: the model of ../shared/peers/gpt_mini.py
(nanoGPT-style byte-level GPT: pre-LN blocks, GELU MLP 4x wider, head tied to the token
embedding, no dropout, AdamW), run on the GPU for a throughput side by side with `tessera train`.

usage: gpt_torch.py --data FILE [--layers 12 --heads 12 --embd 768 --block 1024 --batch 8]
                    [--steps 30 --warm 10] [--amp bf16|fp32] [--sdpa] [--compile] [--csv FILE]

--amp bf16 runs the forward under torch.autocast(bfloat16) (fp32 master weights, as Tessera's
train.precision = "bf16"); --sdpa uses F.scaled_dot_product_attention(is_causal=True) (flash
attention on Hopper) in place of the explicit masked softmax; --compile wraps the model in
torch.compile. tokens/s is the median over the steps after --warm, each step timed between two
torch.cuda.synchronize() calls; MFU counts 6N + 12LTC FLOPs per token (nanoGPT's estimate_mfu,
N without the position embedding) against --peak TFLOP/s (989: H100 SXM dense bf16).
One line `SUMMARY key=value ...` at the end, and a CSV row with --csv.
"""
import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from require import require  # noqa: E402  (tools/require.py: one line naming what to install)

np, torch = require('gpt_torch', 'numpy', 'torch')
import torch.nn as nn  # noqa: E402  (torch imports)
import torch.nn.functional as F  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument('--data', required=True, help='a text file; its bytes are the tokens')
p.add_argument('--layers', type=int, default=12)
p.add_argument('--heads', type=int, default=12)
p.add_argument('--embd', type=int, default=768)
p.add_argument('--block', type=int, default=1024)
p.add_argument('--batch', type=int, default=8)
p.add_argument('--steps', type=int, default=30)
p.add_argument('--warm', type=int, default=10)
p.add_argument('--lr', type=float, default=1e-3)
p.add_argument('--amp', choices=['fp32', 'bf16'], default='bf16')
p.add_argument('--sdpa', action='store_true')
p.add_argument('--compile', action='store_true')
p.add_argument('--peak', type=float, default=989.0, help='TFLOP/s the MFU is taken against')
p.add_argument('--csv', default='', help='append one row of results to this CSV file')
p.add_argument('--device', default='cuda', help='cuda, or cpu for a smoke test of the script')
a = p.parse_args()
if a.steps <= a.warm:
    p.error(f'--steps {a.steps} must exceed --warm {a.warm}')
dev = torch.device(a.device)
if dev.type == 'cuda' and not torch.cuda.is_available():
    raise SystemExit('gpt_torch.py: error: no CUDA device visible to PyTorch')
sync = torch.cuda.synchronize if dev.type == 'cuda' else (lambda: None)
torch.manual_seed(0)
V, T, C, L, H = 256, a.block, a.embd, a.layers, a.heads


class Block(nn.Module):
    def __init__(s):
        super().__init__()
        s.ln1, s.attn, s.proj = nn.LayerNorm(C), nn.Linear(C, 3 * C), nn.Linear(C, C)
        s.ln2, s.fc, s.fc2 = nn.LayerNorm(C), nn.Linear(C, 4 * C), nn.Linear(4 * C, C)
        s.register_buffer('mask', torch.tril(torch.ones(T, T, dtype=torch.bool)).view(1, 1, T, T))

    def forward(s, x):
        B, t, _ = x.shape
        q, k, v = s.attn(s.ln1(x)).split(C, dim=2)
        q, k, v = [z.view(B, t, H, C // H).transpose(1, 2) for z in (q, k, v)]
        if a.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // H))
            att = att.masked_fill(~s.mask[:, :, :t, :t], float('-inf')).softmax(-1)
            y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, t, C)
        x = x + s.proj(y)
        return x + s.fc2(F.gelu(s.fc(s.ln2(x))))


class GPT(nn.Module):
    def __init__(s):
        super().__init__()
        s.wte, s.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        s.blocks = nn.ModuleList([Block() for _ in range(L)])
        s.lnf = nn.LayerNorm(C)
        s.head = nn.Linear(C, V, bias=False)
        s.head.weight = s.wte.weight  # tied
        for n, q in s.named_parameters():
            if q.dim() >= 2:
                last = n.endswith('fc2.weight') or n.endswith('proj.weight')
                nn.init.normal_(q, 0.0, 0.02 / math.sqrt(2 * L) if last else 0.02)

    def forward(s, idx, tgt):
        B, t = idx.shape
        x = s.wte(idx) + s.wpe(torch.arange(t, device=idx.device))
        for b in s.blocks:
            x = b(x)
        logits = s.head(s.lnf(x))
        return F.cross_entropy(logits.view(-1, V).float(), tgt.view(-1))


raw = np.fromfile(a.data, dtype=np.uint8)
if raw.size < T + 2:
    raise SystemExit(f'gpt_torch.py: error: {a.data} holds {raw.size} bytes, fewer than --block + 2')
data = torch.from_numpy(raw.astype(np.int64)).to(dev)
g = torch.Generator(device='cpu').manual_seed(1)


def batch():
    ix = torch.randint(data.numel() - T - 1, (a.batch,), generator=g).to(dev)
    offs = ix[:, None] + torch.arange(T, device=dev)[None, :]
    return data[offs], data[offs + 1]


m = GPT().to(dev)
fwd = torch.compile(m) if a.compile else m
opt_args = dict(lr=a.lr, betas=(0.9, 0.95), weight_decay=0.1)
opt = torch.optim.AdamW(m.parameters(), **opt_args, **({'fused': True} if dev.type == 'cuda' else {}))
n_total = sum(q.numel() for q in m.parameters())
n_model = n_total - m.wpe.weight.numel()
flops_tok = 6 * n_model + 12 * L * T * C
dev_name = torch.cuda.get_device_name() if dev.type == 'cuda' else 'cpu'
print(f'config: torch {torch.__version__} device {dev_name} amp={a.amp} sdpa={a.sdpa} '
      f'compile={a.compile} L={L} H={H} C={C} T={T} V={V} batch={a.batch} params={n_total} '
      f'flops/token(6N+12LTC)={flops_tok / 1e9:.3f}G', flush=True)

times, losses = [], []
for step in range(a.steps):
    x, y = batch()
    sync()
    t0 = time.perf_counter()
    with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=a.amp == 'bf16'):
        loss = fwd(x, y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    sync()
    times.append(time.perf_counter() - t0)
    losses.append(loss.item())
    if step % 10 == 0 or step == a.steps - 1:
        print(f'step {step}: loss {losses[-1]:.4f} step_time {times[-1] * 1e3:.1f} ms', flush=True)

med = statistics.median(times[a.warm:])
tps = a.batch * T / med
tflops = tps * flops_tok / 1e12
mem_gb = torch.cuda.max_memory_allocated() / 2**30 if dev.type == 'cuda' else 0.0
label = f"torch-{'compile' if a.compile else 'eager'}-{'sdpa' if a.sdpa else 'math'}-{a.amp}"
print(f'SUMMARY who={label} tokens_per_s={tps:.0f} median_step_ms={med * 1e3:.2f} tflops={tflops:.1f} '
      f'mfu={100 * tflops / a.peak:.1f}% max_mem_gib={mem_gb:.1f} loss={losses[0]:.3f}->{losses[-1]:.3f}',
      flush=True)
if a.csv:
    new = not os.path.exists(a.csv)
    with open(a.csv, 'a') as f:
        if new:
            f.write('who,layers,heads,width,context,batch,tokens_per_s,median_step_ms,tflops,mfu_percent,max_mem_gib\n')
        f.write(f'{label},{L},{H},{C},{T},{a.batch},{tps:.0f},{med * 1e3:.2f},{tflops:.1f},'
                f'{100 * tflops / a.peak:.1f},{mem_gb:.1f}\n')
