#!/usr/bin/python3
"""Plot the metrics of one or more Tessera runs into one PNG.

    tools/plot_metrics.py RUN [RUN ...] --out PNG [--title T] [--logy]

RUN is a run directory (its metrics.csv, or metrics.h5 where there is no CSV), or a metrics.csv
or metrics.h5 file by name. metrics.h5 holds the same rows as one dataset per column under
/train and /eval (docs/analysis.md); it is read without a file lock, so a running job's file
can be plotted.

Panels: train and eval loss, eval accuracy (when any run has it), learning rate, samples/s, and
the step-time split of the first run (t_data, t_forward, t_backward, t_allreduce, t_optimizer,
stacked, in ms). Several runs are overlaid; each is named by its directory, or by the layout in
its summary.json when directory names collide.

Runs with Debian's Python (/usr/bin/python3: python3-numpy, python3-matplotlib, python3-h5py
for metrics.h5); no display
is needed (Agg backend). Exit codes: 0 success, 2 bad input (one line on stderr).
"""

import argparse
import csv
import json
import math
import os
import sys

from require import require

PROG = "plot_metrics"
matplotlib = require(PROG, "matplotlib")
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

# The columns DESIGN.md promises in every metrics.csv; the rest are optional.
REQUIRED_COLUMNS = ["kind", "step", "epoch", "loss", "lr", "grad_norm", "samples_per_s"]
TIME_COLUMNS = ["t_data", "t_forward", "t_backward", "t_allreduce", "t_optimizer"]


class InputError(Exception):
    """Bad input: reported as one line, exit code 2."""


def to_float(cell):
    """A metrics cell as a float; an empty or missing cell is NaN."""
    if cell is None or cell == "":
        return math.nan
    return float(cell)


def metrics_source(path):
    """The run directory and the metrics file that RUN names."""
    if os.path.isdir(path):
        csv_path = os.path.join(path, "metrics.csv")
        h5_path = os.path.join(path, "metrics.h5")
        return path, (h5_path if not os.path.isfile(csv_path) and os.path.isfile(h5_path)
                      else csv_path)
    if path.endswith((".csv", ".h5")) and os.path.isfile(path):
        return os.path.dirname(os.path.abspath(path)), path
    if path.endswith((".csv", ".h5")):
        raise InputError(f"no such file: {path}")
    raise InputError(f"no such run directory: {path}")


def read_h5(h5_path):
    """The rows of a metrics.h5 as {"train": {column: [floats]}, "eval": {...}}."""
    h5py, np = require(PROG, "h5py", "numpy")  # only needed for metrics.h5

    try:
        try:
            f = h5py.File(h5_path, "r", locking=False)  # the writer may still have it open
        except TypeError:  # h5py before 3.5
            f = h5py.File(h5_path, "r")
    except OSError as e:
        raise InputError(f"{h5_path}: cannot open as HDF5 ({e})") from None
    with f:
        fmt = f.attrs.get("format")
        fmt = fmt.decode() if isinstance(fmt, bytes) else fmt
        if fmt != "tessera-metrics":
            raise InputError(f"{h5_path}: not a Tessera metrics file (root attribute format is "
                             f"{fmt!r}, expected 'tessera-metrics')")
        rows = {}
        for kind in ("train", "eval"):
            group = f.get(kind)
            rows[kind] = {} if group is None else {
                name: [float(v) for v in np.asarray(ds[()], dtype=np.float64)]
                for name, ds in group.items()}
        return rows


class Run:
    """One run: its metrics rows split by kind, and its label."""

    def __init__(self, run):
        self.path, self.metrics_path = metrics_source(run)
        self.name = os.path.basename(os.path.normpath(os.path.abspath(self.path)))
        self.layout = None
        self.train = {}  # column -> list of floats, train rows in file order
        self.eval = {}  # column -> list of floats, eval rows in file order
        self.columns = []
        self._read()

    def _read(self):
        if self.metrics_path.endswith(".h5"):
            self._read_h5()
        else:
            self._read_csv()
        summary = os.path.join(self.path, "summary.json")
        if os.path.isfile(summary):
            try:
                with open(summary) as f:
                    self.layout = json.load(f).get("layout")
            except (OSError, ValueError):
                self.layout = None

    def _read_h5(self):
        rows = read_h5(self.metrics_path)
        missing = [c for c in REQUIRED_COLUMNS[1:] if c not in rows["train"]]
        if missing:
            raise InputError(f"{self.metrics_path}: /train lacks {','.join(missing)}")
        self.train, self.eval = rows["train"], rows["eval"]
        self.columns = ["kind"] + sorted(set(self.train) | set(self.eval))
        for group in (self.train, self.eval):
            length = len(group.get("step", []))
            for c in self.columns[1:]:
                group.setdefault(c, [math.nan] * length)

    def _read_csv(self):
        csv_path = self.metrics_path
        if not os.path.isfile(csv_path):
            raise InputError(f"{csv_path}: missing (is {self.path} a Tessera run directory?)")
        with open(csv_path, newline="") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if header is None or any(c not in header for c in REQUIRED_COLUMNS):
                seen = ",".join(header) if header else "an empty file"
                raise InputError(f"{csv_path}: expected a header with at least "
                                 f"{','.join(REQUIRED_COLUMNS)}, found {seen}")
            self.columns = header
            rows = {"train": {c: [] for c in header[1:]}, "eval": {c: [] for c in header[1:]}}
            for line_no, row in enumerate(reader, start=2):
                if not row:
                    continue
                kind = row[0]
                if kind not in rows:
                    raise InputError(f"{csv_path}:{line_no}: kind '{kind}' is neither "
                                     f"train nor eval")
                try:
                    for c, cell in zip(header[1:], row[1:]):
                        rows[kind][c].append(to_float(cell))
                except ValueError as e:
                    raise InputError(f"{csv_path}:{line_no}: {e}") from None
            self.train, self.eval = rows["train"], rows["eval"]

    def has(self, kind, column):
        """Whether a column has any value in the rows of this kind."""
        values = (self.train if kind == "train" else self.eval).get(column, [])
        return any(not math.isnan(v) for v in values)


def label_runs(runs):
    """Name runs by directory; where names collide, by layout; then by position."""
    names = [r.name for r in runs]
    labels = []
    for r in runs:
        label = r.name
        if names.count(r.name) > 1 and r.layout:
            label = f"{r.name} ({r.layout})"
        labels.append(label)
    for i, label in enumerate(labels):
        if labels.count(label) > 1:
            labels[i] = f"{label} #{i + 1}"
    return labels


def plot_series(ax, steps, values, **kwargs):
    """Plot only the points where the value exists."""
    pts = [(s, v) for s, v in zip(steps, values) if not math.isnan(v)]
    if pts:
        ax.plot([p[0] for p in pts], [p[1] for p in pts], **kwargs)


def draw_time_split(ax, run, label):
    """Stacked per-phase step time of one run, in ms."""
    present = [c for c in TIME_COLUMNS if run.has("train", c)]
    steps = run.train["step"]
    series = [[0.0 if math.isnan(v) else 1e3 * v for v in run.train[c]] for c in present]
    ax.stackplot(steps, series, labels=[c[2:] for c in present], alpha=0.85)
    ax.set_title(f"step time split ({label})")
    ax.set_ylabel("ms per step")
    ax.legend(fontsize="small", loc="upper right")


def make_figure(runs, labels, title, logy):
    panels = ["loss"]
    if any(r.has("eval", "accuracy") for r in runs):
        panels.append("accuracy")
    panels += ["lr", "samples_per_s"]
    if any(runs[0].has("train", c) for c in TIME_COLUMNS):
        panels.append("time")
    ncols = 2
    nrows = (len(panels) + 1) // ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(11, 3.4 * nrows), squeeze=False)
    axes = axes.ravel()
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, panel in zip(axes, panels):
        ax.set_xlabel("step")
        ax.grid(True, alpha=0.3)
        if panel == "time":
            draw_time_split(ax, runs[0], labels[0])
            continue
        for i, (run, label) in enumerate(zip(runs, labels)):
            color = colors[i % len(colors)]
            if panel == "loss":
                plot_series(ax, run.train["step"], run.train["loss"], color=color, lw=1,
                            label=f"{label} train")
                plot_series(ax, run.eval["step"], run.eval["loss"], color=color, ls="--",
                            marker="o", ms=4, label=f"{label} eval")
            elif panel == "accuracy":
                plot_series(ax, run.eval["step"], run.eval.get("accuracy", []), color=color,
                            marker="o", ms=4, label=label)
            else:
                plot_series(ax, run.train["step"], run.train[panel], color=color, lw=1,
                            label=label)
        ax.set_title({"loss": "loss", "accuracy": "eval accuracy", "lr": "learning rate",
                      "samples_per_s": "throughput (samples/s)"}[panel])
        if panel == "loss" and logy:
            ax.set_yscale("log")
        if ax.lines:
            ax.legend(fontsize="small")
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def main(argv):
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", metavar="RUN",
                        help="run output directories, or metrics.csv / metrics.h5 files")
    parser.add_argument("--out", required=True, metavar="PNG", help="where to write the figure")
    parser.add_argument("--title", help="figure title")
    parser.add_argument("--logy", action="store_true", help="log-scale loss axis")
    args = parser.parse_args(argv)
    try:
        runs = [Run(d) for d in args.runs]
        fig = make_figure(runs, label_runs(runs), args.title, args.logy)
        try:
            fig.savefig(args.out, dpi=80)
        except OSError as e:
            raise InputError(f"cannot write {args.out}: {e.strerror}") from None
    except InputError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    print(f"{PROG}: wrote {args.out} ({len(runs)} run{'s' if len(runs) > 1 else ''})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
