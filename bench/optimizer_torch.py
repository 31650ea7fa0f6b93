#!/usr/bin/env python3
"""The PyTorch peer of bench/optimizer_update.cpp: torch.optim.AdamW and SGD(momentum=0.9) steps
on the host, in GB/s of the same counted traffic (AdamW 28 bytes per element: p, g, m, v read,
p, m, v written; SGD 20: p, g, buf read, p, buf written), whatever the implementation moves.

    python bench/optimizer_torch.py --threads 1 [--sizes 1M,16M,64M] [--tensors 1] [--reps 9]
        [--warmup 2] [--csv PATH]

Implementations: AdamW foreach=True, fused=True (where this torch has a fused CPU AdamW), and
foreach=False (the per-tensor loop); SGD the same. The elements are one tensor (--tensors 1) or
split into --tensors equal tensors, as a model's parameters are. The hyperparameters are the
C++ program's: AdamW lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 0.01; SGD lr 1e-2,
momentum 0.9. A sample is `inner` steps (the C++ program's count: about 1 GB of AdamW traffic);
a row is the median of --reps samples after --warmup ones (the first of which makes the state).
Prints a table and writes CSV: peer,torch,cpu_capability,kernel,impl,elements,tensors,threads,
seconds,gelem_per_s,gb_per_s.
"""
import argparse
import statistics
import sys
import time

import torch


def parse_size(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    return int(s[:-1] if mult > 1 else s) * mult


def make(n, tensors, seed):
    """Parameters in [-0.1, 0.1) with gradients in [-0.01, 0.01), n elements over `tensors` tensors."""
    gen = torch.Generator().manual_seed(seed)
    bounds = [n * k // tensors for k in range(tensors + 1)]
    params = []
    for a, b in zip(bounds, bounds[1:]):
        p = torch.nn.Parameter((torch.rand(b - a, generator=gen) * 2 - 1) * 0.1)
        p.grad = (torch.rand(b - a, generator=gen) * 2 - 1) * 0.01
        params.append(p)
    return params


def configs():
    """(kernel, impl, bytes per element, constructor) for every implementation this torch has."""
    out = []
    adamw = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    sgd = dict(lr=1e-2, momentum=0.9)
    for kernel, cls, hyper, nbytes in (("adamw", torch.optim.AdamW, adamw, 28), ("sgd", torch.optim.SGD, sgd, 20)):
        for impl, flags in (("foreach", dict(foreach=True)), ("fused", dict(fused=True)), ("forloop", dict(foreach=False))):
            out.append((kernel, impl, nbytes, lambda ps, cls=cls, hyper=hyper, flags=flags: cls(ps, **hyper, **flags)))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1M,16M,64M")
    ap.add_argument("--tensors", type=int, default=1)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--csv")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    capability = torch.backends.cpu.get_cpu_capability()
    rows = []
    print(f"# torch {torch.__version__}, {torch.get_num_threads()} thread(s), CPU capability {capability}, "
          f"{args.tensors} tensor(s); median of {args.reps} after {args.warmup} warm-up")
    print(f"{'kernel':6} {'impl':8} {'elements':>10} {'ms/step':>10} {'Gelem/s':>9} {'GB/s':>8}")
    for n in map(parse_size, args.sizes.split(",")):
        inner = max(1, (1 << 25) // n)
        for kernel, impl, nbytes, build in configs():
            params = make(n, args.tensors, 1234)
            try:
                opt = build(params)
                opt.step()  # makes the state; a fused CPU optimizer this torch lacks fails here
            except (RuntimeError, ValueError) as e:
                print(f"{kernel:6} {impl:8} {n:>10} not available: {str(e).splitlines()[0]}")
                continue
            times = []
            for r in range(args.warmup + args.reps):
                t0 = time.perf_counter()
                for _ in range(inner):
                    opt.step()
                s = (time.perf_counter() - t0) / inner
                if r >= args.warmup:
                    times.append(s)
            s = statistics.median(times)
            gelem = n / s / 1e9
            print(f"{kernel:6} {impl:8} {n:>10} {s * 1e3:10.3f} {gelem:9.3f} {gelem * nbytes:8.2f}", flush=True)
            rows.append(("torch", torch.__version__, capability, kernel, impl, n, args.tensors, args.threads, s, gelem,
                         gelem * nbytes))
            del opt, params
    if args.csv:
        with open(args.csv, "w") as f:
            f.write("peer,torch,cpu_capability,kernel,impl,elements,tensors,threads,seconds,gelem_per_s,gb_per_s\n")
            for r in rows:
                f.write(",".join(str(x) for x in r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
