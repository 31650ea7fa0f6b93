"""The PyTorch peer of Tessera's U-Net (docs/models.md, "unet") on a `tessera prepare darcy` file.

The same network (two k x k "same" convolutions + activation per level, 2x2 max-pool down, 2x2
ConvTranspose2d up, skip connection concatenated after the up-sampled channels, 1x1 head), the
same data (inputs mapped by the file's scale/offset attributes; with --normalize channel, Tessera's
data.normalize default, inputs and targets standardised per channel with the training split's mean
and std, the prediction mapped back), the same training (AdamW, linear warm-up then cosine to
min_lr per step as Tessera's schedule, global batch, epochs, shuffled each epoch), the same loss
(MSE over every value of the standardised fields, averaged over the batch) and metric (the mean over
test samples of ||prediction - target|| / ||target||, in the targets' units). Initial weights are
PyTorch's own, or a Tessera checkpoint's (--init); the sample order Tessera's sampler's (--order
tessera, the default) or torch.randperm's. With both of Tessera's, the losses are Tessera's to float
rounding (docs/performance.md, "U-Net"). Prints one line per epoch and a final `SUMMARY {json}` line.

  OPENBLAS_NUM_THREADS=2 /usr/bin/python3 bench/unet_torch.py --data data/darcy64.h5 --threads 1
"""
import argparse, json, math, sys, time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
from require import require  # noqa: E402  (tools/require.py: one line naming what to install)

h5py, np, torch = require("unet_torch", "h5py", "numpy", "torch")
import torch.nn as nn  # noqa: E402  (torch imports)
import torch.nn.functional as F  # noqa: E402


class UNet(nn.Module):
    def __init__(self, cin, cout, levels, k, act):
        super().__init__()
        self.act = F.gelu if act == "gelu" else F.relu
        p = k // 2
        self.down = nn.ModuleList()
        c = cin
        for ch in levels:
            self.down.append(nn.ModuleDict({"conv1": nn.Conv2d(c, ch, k, padding=p),
                                            "conv2": nn.Conv2d(ch, ch, k, padding=p)}))
            c = ch
        self.up = nn.ModuleList()
        for l in range(len(levels) - 1):
            self.up.append(nn.ModuleDict({"upconv": nn.ConvTranspose2d(levels[l + 1], levels[l], 2, stride=2),
                                          "conv1": nn.Conv2d(2 * levels[l], levels[l], k, padding=p),
                                          "conv2": nn.Conv2d(levels[l], levels[l], k, padding=p)}))
        self.head = nn.Conv2d(levels[0], cout, 1)

    def forward(self, x):
        skips = []
        for l, d in enumerate(self.down):
            x = self.act(d["conv2"](self.act(d["conv1"](x))))
            if l + 1 < len(self.down):
                skips.append(x)
                x = F.max_pool2d(x, 2)
        for l in reversed(range(len(self.up))):
            u = self.up[l]
            x = torch.cat([u["upconv"](x), skips[l]], dim=1)
            x = self.act(u["conv2"](self.act(u["conv1"](x))))
        return self.head(x)


M64 = (1 << 64) - 1


def splitmix64(x):
    x = (x + 0x9e3779b97f4a7c15) & M64
    x = ((x ^ (x >> 30)) * 0xbf58476d1ce4e5b9) & M64
    x = ((x ^ (x >> 27)) * 0x94d049bb133111eb) & M64
    return x ^ (x >> 31)


def fnv1a(name):
    h = 0xcbf29ce484222325
    for c in name.encode():
        h = ((h ^ c) * 0x100000001b3) & M64
    return h


def tessera_permutation(samples, seed, epoch):
    """Tessera's Sampler (src/train/sampler.cpp): Fisher-Yates driven by a counter-based generator."""
    perm = list(range(samples))
    stream = (fnv1a("sampler.epoch") + epoch) & M64
    base = splitmix64(splitmix64(seed & M64) ^ stream)
    for i in range(samples - 1, 0, -1):
        u = (splitmix64(base ^ i) >> 11) * 2.0 ** -53
        j = min(int(u * (i + 1)), i)
        perm[i], perm[j] = perm[j], perm[i]
    return torch.tensor(perm)


def load(f, split):
    x = f[f"/{split}/inputs"]
    scale, offset = float(x.attrs.get("scale", 1.0)), float(x.attrs.get("offset", 0.0))
    inputs = torch.from_numpy(np.asarray(x, dtype=np.float32) * np.float32(scale) + np.float32(offset))
    return inputs, torch.from_numpy(np.asarray(f[f"/{split}/targets"], dtype=np.float32))


class Normalized(nn.Module):
    """Tessera's data.normalize (docs/data.md): the network sees (x - mean_x) / std_x and its output
    h stands for (u - mean_u) / std_u, so the prediction is std_u h + mean_u; the statistics are
    per channel ("channel", Tessera's) or per grid point ("point", the FNO papers' normaliser), over
    the training split."""

    def __init__(self, net, x, t, mode):
        super().__init__()
        self.net = net
        dims = (0, 2, 3) if mode == "channel" else (0,)
        stats = []
        for v in (x.double(), t.double()):
            mean = v.mean(dim=dims, keepdim=True)
            std = (v - mean).pow(2).mean(dim=dims, keepdim=True).sqrt()
            stats += [mean.float(), torch.where(std > 0, std, torch.ones_like(std)).float()]
        for name, v in zip(("mx", "sx", "mt", "st"), stats):
            self.register_buffer(name, v if mode == "channel" else v[0:1])

    def forward(self, x):
        return self.st * self.net((x - self.mx) / self.sx) + self.mt

    def loss(self, out, t):  # the mean squared error of the normalised fields
        return ((out - t) / self.st).pow(2).mean()


def rel_l2(model, x, t, batch):
    model.eval()
    total = 0.0
    with torch.no_grad():
        for i in range(0, len(x), batch):
            p = model(x[i:i + batch])
            d = (p - t[i:i + batch]).flatten(1).double()
            total += float((d.norm(dim=1) / t[i:i + batch].flatten(1).double().norm(dim=1)).sum())
    model.train()
    return total / len(x)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--channels", default="16,32,64")
    ap.add_argument("--kernel", type=int, default=3)
    ap.add_argument("--activation", default="gelu")
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--batch", type=int, default=20)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--min-lr", type=float, default=1e-5)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--weight-decay", type=float, default=1e-4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--init", help="initial weights: a Tessera checkpoint (its /model tensors, PyTorch's names)")
    ap.add_argument("--order", choices=["tessera", "torch"], default="tessera",
                    help="sample order: Tessera's sampler with --seed (the same batches) or torch.randperm")
    ap.add_argument("--log-steps", type=int, default=0, help="print the loss of each of the first N steps")
    ap.add_argument("--normalize", choices=["none", "channel", "point"], default="channel",
                    help="inputs and targets standardised with the training split's statistics (Tessera's data.normalize)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    with h5py.File(a.data, "r") as f:
        xtr, ttr = load(f, "train")
        xte, tte = load(f, "test")
    model = UNet(xtr.shape[1], ttr.shape[1], [int(c) for c in a.channels.split(",")], a.kernel, a.activation)
    if a.init:
        with h5py.File(a.init, "r") as f:
            model.load_state_dict({k: torch.from_numpy(np.asarray(v, dtype=np.float32)) for k, v in f["model"].items()},
                                  strict=True)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=a.weight_decay)
    if a.normalize != "none":
        model = Normalized(model, xtr, ttr, a.normalize)
    loss_of = model.loss if a.normalize != "none" else F.mse_loss
    steps_per_epoch = len(xtr) // a.batch
    total = steps_per_epoch * a.epochs

    def lr_at(step):  # step counts from 0, as Tessera's schedule (warm-up, then cosine to min_lr)
        if step < a.warmup:
            return a.lr * (step + 1) / a.warmup
        t = min(1.0, (step - a.warmup) / max(1, total - a.warmup - 1))
        return a.min_lr + 0.5 * (a.lr - a.min_lr) * (1 + math.cos(math.pi * t))

    step, train_s, rows = 0, 0.0, []
    for epoch in range(a.epochs):
        perm = tessera_permutation(len(xtr), a.seed, epoch) if a.order == "tessera" else torch.randperm(len(xtr))
        t0 = time.perf_counter()
        for b in range(steps_per_epoch):
            idx = perm[b * a.batch:(b + 1) * a.batch]
            for g in opt.param_groups:
                g["lr"] = lr_at(step)
            loss = loss_of(model(xtr[idx]), ttr[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            if step <= a.log_steps:
                print(f"step {step} loss {float(loss):.9e}", flush=True)
        dt = time.perf_counter() - t0
        train_s += dt
        err = rel_l2(model, xte, tte, 50)
        rows.append({"epoch": epoch + 1, "loss": float(loss), "test_rel_l2": err,
                     "samples_per_s": steps_per_epoch * a.batch / dt})
        print(f"epoch {epoch + 1} loss {float(loss):.3e} test rel L2 {err:.4f} samples/s {rows[-1]['samples_per_s']:.1f}",
              flush=True)
    rates = sorted(r["samples_per_s"] for r in rows)
    print("SUMMARY " + json.dumps({"test_rel_l2": rows[-1]["test_rel_l2"], "samples_per_s_median": rates[len(rates) // 2],
                                   "train_s": train_s, "steps": step, "threads": a.threads,
                                   "torch": torch.__version__}), flush=True)


if __name__ == "__main__":
    main()
