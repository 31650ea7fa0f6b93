#!/usr/bin/env python3
"""Byte-level Llama (Hugging Face transformers' LlamaForCausalLM: RMSNorm, RoPE, GQA, SiLU-gated MLP,
no biases, lm_head untied), PyTorch CPU training throughput: the peer of inputs/kjv_llama.toml.
usage: llama_torch.py --data FILE [--threads 2 --steps 40 --warm 10 --batch 16 --block 128 --layers 4 --heads 8
       --kv-heads 4 --embd 256 --ffn 704] [--amp bf16] [--attn sdpa|eager] [--compile]
Needs torch and transformers (bench/peer_venv.sh, then .venv/bin/pip install transformers)."""
import argparse, time, os, numpy as np, torch, torch.nn.functional as F
import transformers
from transformers import LlamaConfig, LlamaForCausalLM
p = argparse.ArgumentParser()
p.add_argument('--threads', type=int, default=2); p.add_argument('--data', required=True)
p.add_argument('--steps', type=int, default=40); p.add_argument('--batch', type=int, default=16)
p.add_argument('--block', type=int, default=128); p.add_argument('--layers', type=int, default=4)
p.add_argument('--heads', type=int, default=8); p.add_argument('--kv-heads', type=int, default=4)
p.add_argument('--embd', type=int, default=256); p.add_argument('--ffn', type=int, default=704)
p.add_argument('--lr', type=float, default=3e-4); p.add_argument('--warm', type=int, default=10)
p.add_argument('--amp', choices=['fp32', 'bf16'], default='fp32')   # bf16: torch.autocast on the CPU (oneDNN; AMX/AVX512-BF16 where the CPU has them)
p.add_argument('--attn', choices=['sdpa', 'eager'], default='sdpa')  # transformers' attn_implementation
p.add_argument('--compile', action='store_true')                    # torch.compile the model (inductor)
a = p.parse_args(); torch.set_num_threads(a.threads); torch.manual_seed(0)
V, T, C, L, H, KV, FF = 256, a.block, a.embd, a.layers, a.heads, a.kv_heads, a.ffn

cfg = LlamaConfig(vocab_size=V, hidden_size=C, intermediate_size=FF, num_hidden_layers=L, num_attention_heads=H,
                  num_key_value_heads=KV, max_position_embeddings=T, rope_theta=10000.0, rms_norm_eps=1e-5,
                  tie_word_embeddings=False, attention_bias=False, mlp_bias=False, hidden_act='silu',
                  bos_token_id=None, eos_token_id=None, pad_token_id=None, use_cache=False)
m = LlamaForCausalLM._from_config(cfg, attn_implementation=a.attn).train()   # transformers' init, N(0, 0.02)
fwd = torch.compile(m) if a.compile else m

raw = open(a.data, 'rb').read(); data = torch.from_numpy(np.frombuffer(raw, dtype=np.uint8).astype(np.int64))
n = int(0.9 * len(data)); tr, va = data[:n], data[n:]
g = torch.Generator().manual_seed(1)
def batch(d):
    ix = torch.randint(len(d) - T - 1, (a.batch,), generator=g)
    return torch.stack([d[i:i+T] for i in ix]), torch.stack([d[i+1:i+T+1] for i in ix])
def loss_of(x, y):   # the next token at every one of the T positions, as Tessera's windows
    logits = fwd(input_ids=x).logits
    return F.cross_entropy(logits.reshape(-1, V).float(), y.reshape(-1))

amp = (lambda: torch.autocast('cpu', dtype=torch.bfloat16)) if a.amp == 'bf16' else (lambda: torch.autocast('cpu', enabled=False))
N_total = sum(q.numel() for q in m.parameters())
N = N_total - m.model.embed_tokens.weight.numel()           # the embedding is a lookup; the untied lm_head a product
flops_tok = 6*N + 12*L*T*C                                  # as gpt_mini.py / nanoGPT (PaLM appendix B): full (non-causal) attention, H*hd = C
flops_tok_causal = 6*N + 6*L*T*C
opt = torch.optim.AdamW(m.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.1)
print(f"config: torch {torch.__version__} transformers {transformers.__version__} threads={torch.get_num_threads()} amp={a.amp} "
      f"attn={a.attn} compile={a.compile} L={L} H={H} KV={KV} C={C} F={FF} T={T} V={V} batch={a.batch} "
      f"params_total={N_total} params_nonembed(N)={N} flops/token(6N+12LTC)={flops_tok/1e6:.2f}M (causal 6N+6LTC={flops_tok_causal/1e6:.2f}M) "
      f"data={a.data} bytes={len(raw)}", flush=True)
with torch.no_grad():
    x, y = batch(va)
    with amp(): l0 = loss_of(x, y)
ts = []
for step in range(a.steps):
    x, y = batch(tr)
    t0 = time.perf_counter()
    with amp(): loss = loss_of(x, y)
    opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
    ts.append(time.perf_counter() - t0)
    if step % 10 == 0 or step == a.steps - 1: print(f"step {step}: loss {loss.item():.4f} step_time {ts[-1]*1e3:.0f} ms", flush=True)
with torch.no_grad():
    with amp(): vl = np.mean([loss_of(*batch(va)).item() for _ in range(5)])
tok = a.batch * T; w = ts[a.warm:]
med = float(np.median(w)); tps_med = tok / med; tps_all = tok * a.steps / sum(ts); tps_w = tok * len(w) / sum(w)
print(f"SUMMARY threads={a.threads} amp={a.amp} attn={a.attn} compile={a.compile}: tokens/s median-step={tps_med:.0f} "
      f"mean(steps {a.warm}..{a.steps-1})={tps_w:.0f} mean(all {a.steps})={tps_all:.0f} "
      f"median_step={med*1e3:.1f}ms achieved={tps_med*flops_tok/1e9:.1f} GFLOP/s (6N+12LTC) val_loss {l0.item():.3f}->{vl:.3f}", flush=True)
