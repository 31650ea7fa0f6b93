#!/usr/bin/env python3
"""Runs a fixed PyTorch peer script under torch.autocast('cpu', dtype=torch.bfloat16) without
changing it: the peer's --amp bf16 for scripts that have no such flag (mlp_torch.py), done the way
gpt_mini.py does it (matrix products in bf16 through oneDNN, fp32 master weights and optimizer).
Single-process runs only (autocast is per thread; --ddp's processes would not inherit it).
One autocast context spans the whole run, so its cache of bf16 weight copies is off
(cache_enabled=False): with it on, the copies would outlive the optimizer's updates (the cache is
only cleared when the outermost context exits) and the model would train on stale weights.
usage: peer_amp.py PEER_SCRIPT [its arguments...]"""
import runpy, sys
from pathlib import Path

if len(sys.argv) < 2:
    sys.exit(__doc__)
if '--ddp' in sys.argv:
    sys.exit('peer_amp.py: --ddp is not supported (autocast does not reach the spawned processes)')
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / 'tools'))
from require import require  # noqa: E402  (tools/require.py: one line naming what to install)

torch = require('peer_amp', 'torch')
sys.path.pop(0)  # the peer script's imports see the path they would without peer_amp

script, sys.argv = sys.argv[1], sys.argv[1:]
print(f"peer_amp: {script} under torch.autocast('cpu', dtype=torch.bfloat16, cache_enabled=False)", flush=True)
with torch.autocast('cpu', dtype=torch.bfloat16, cache_enabled=False):
    runpy.run_path(script, run_name='__main__')
