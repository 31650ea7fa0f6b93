#!/usr/bin/python3
"""Plot how the parameters of a Tessera run move across its checkpoints.

    tools/plot_checkpoints.py RUN_DIR --out PNG
    tools/plot_checkpoints.py CKPT.h5 CKPT.h5 ... --out PNG
    mpirun -n 4 tools/plot_checkpoints.py RUN_DIR --out PNG     # tensors split across ranks
    mpirun -n 4 tools/plot_checkpoints.py RUN_DIR --out PNG --parallel  # and MPI-IO, or exit 2

For every /model/<name> dataset: its L2 norm at each checkpoint, and the relative update
||w_k - w_{k-1}|| / ||w_{k-1}|| between consecutive checkpoints; one line per tensor. A RUN_DIR
stands for all of RUN_DIR/checkpoints/step_*.h5; checkpoints are ordered by their `step`
attribute. The same numbers are printed as a table.

Under mpirun with mpi4py importable, each rank reads a share of the tensors (through h5py's
MPI-IO driver when h5py was built with MPI, else serial reads of the shared files) and rank 0
gathers the norms and draws. Without mpi4py it runs serially (rank 0 of the launch draws).
--parallel insists on the parallel path: several ranks, mpi4py and an h5py built with MPI
(Debian: python3-h5py-mpi, whose h5py loads its MPI build under mpirun), and otherwise exits 2
naming what is missing.

Runs with Debian's Python (/usr/bin/python3: python3-h5py, python3-numpy, python3-matplotlib);
no display is needed (Agg backend). Exit codes: 0 success, 2 bad input (one line on stderr).
"""

import argparse
import glob
import os
import sys

from require import require

PROG = "plot_checkpoints"
h5py, np, matplotlib = require(PROG, "h5py", "numpy", "matplotlib")
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

LAUNCHER_SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "SLURM_NTASKS")
LAUNCHER_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")


class InputError(Exception):
    """Bad input: reported as one line, exit code 2."""


def launcher_value(names):
    """The first of these environment variables that an MPI launcher set, as an int, or None."""
    for name in names:
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return None


def get_comm():
    """MPI.COMM_WORLD when launched on several ranks and mpi4py imports; else None."""
    size = launcher_value(LAUNCHER_SIZE_VARS)
    if size is None or size < 2:
        return None
    try:
        from mpi4py import MPI
    except ImportError:
        if launcher_value(LAUNCHER_RANK_VARS) in (0, None):
            print(f"{PROG}: note: mpi4py is not installed; every rank runs serially and only "
                  f"rank 0 writes the figure", file=sys.stderr)
        return None
    return MPI.COMM_WORLD


def parallel_problem(comm):
    """Why --parallel cannot read with MPI-IO here, or None when it can."""
    size = launcher_value(LAUNCHER_SIZE_VARS)
    if size is None or size < 2:
        return "--parallel needs several ranks: launch it with mpirun -n N (or srun -n N), N > 1"
    if comm is None:
        return "--parallel needs mpi4py: apt-get install python3-mpi4py (or pip install mpi4py)"
    if not h5py.get_config().mpi:
        return (f"--parallel needs h5py built with MPI, and this h5py {h5py.__version__} is "
                f"serial: apt-get install python3-h5py-mpi (Debian's h5py then loads its MPI "
                f"build under mpirun), or build h5py against parallel HDF5")
    return None


def checkpoint_files(inputs):
    """Expand run directories into their checkpoints; check that every file exists."""
    files = []
    for item in inputs:
        if os.path.isdir(item):
            found = glob.glob(os.path.join(item, "checkpoints", "step_*.h5"))
            if not found:
                raise InputError(f"{item}: no checkpoints/step_*.h5 in this directory")
            files += found
        elif os.path.isfile(item):
            files.append(item)
        else:
            raise InputError(f"no such run directory or checkpoint file: {item}")
    return files


def open_file(path, comm):
    """Open a checkpoint read-only: MPI-IO driver when h5py and mpi4py allow, else serial."""
    try:
        if comm is not None and h5py.get_config().mpi:
            return h5py.File(path, "r", driver="mpio", comm=comm)
        return h5py.File(path, "r")
    except OSError as e:
        raise InputError(f"{path}: not a readable HDF5 file ({e})") from None


def model_tensors(f):
    """Names of the datasets under /model, relative to it, sorted."""
    if "model" not in f:
        raise InputError(f"{f.filename}: no /model group (not a Tessera checkpoint?)")
    names = []
    f["model"].visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
    return sorted(names)


def tensor_history(handles, name):
    """Norms of one tensor over the checkpoints and its relative updates (NaN where absent)."""
    norms, updates = [], [np.nan]
    prev = None
    for f in handles:
        key = "model/" + name
        cur = np.asarray(f[key][()], dtype=np.float64) if key in f else None
        norms.append(np.linalg.norm(cur) if cur is not None else np.nan)
        if prev is not None:
            ok = cur is not None and cur.shape == prev.shape
            prev_norm = np.linalg.norm(prev)
            updates.append(np.linalg.norm(cur - prev) / prev_norm if ok and prev_norm > 0
                           else np.nan)
        prev = cur
    return norms, updates[:len(norms)]


def compute(files, comm):
    """Steps and per-tensor (norms, updates) for all tensors, gathered on rank 0."""
    rank = comm.Get_rank() if comm is not None else 0
    size = comm.Get_size() if comm is not None else 1
    handles = [open_file(p, comm) for p in files]
    try:
        steps = [int(f.attrs["step"]) if "step" in f.attrs else -1 for f in handles]
        names = sorted(set().union(*(model_tensors(f) for f in handles)))
        mine = {n: tensor_history(handles, n) for n in names[rank::size]}
    finally:
        for f in handles:
            f.close()
    if comm is not None:
        parts = comm.gather(mine, root=0)
        mine = {k: v for part in parts or [] for k, v in part.items()}
    return steps, names, mine


def order_by_step(files):
    """Checkpoint files sorted by their step attribute (file name as a tie-break)."""
    keyed = []
    for p in files:
        try:
            with h5py.File(p, "r") as f:
                keyed.append((int(f.attrs.get("step", -1)), p))
        except OSError as e:
            raise InputError(f"{p}: not a readable HDF5 file ({e})") from None
    return [p for _, p in sorted(keyed)]


def print_table(steps, names, history):
    width = max(len(n) for n in names)
    print(f"{'tensor':<{width}}  {'step':>8}  {'norm':>12}  {'rel_update':>12}")
    for n in names:
        norms, updates = history[n]
        for s, v, u in zip(steps, norms, updates):
            upd = "-" if np.isnan(u) else f"{u:.6g}"
            print(f"{n:<{width}}  {s:>8}  {v:>12.6g}  {upd:>12}")


def draw(steps, names, history, out, title):
    fig, (ax_norm, ax_upd) = plt.subplots(1, 2, figsize=(12, 4.5))
    for n in names:
        norms, updates = history[n]
        ax_norm.plot(steps, norms, marker="o", ms=3, label=n)
        ax_upd.plot(steps[1:], updates[1:], marker="o", ms=3, label=n)
    ax_norm.set_title("parameter L2 norm ||w_k||")
    ax_upd.set_title("relative update ||w_k - w_{k-1}|| / ||w_{k-1}||")
    if len(steps) > 1 and any(np.nanmax(history[n][1][1:] + [0]) > 0 for n in names):
        ax_upd.set_yscale("log")
    for ax in (ax_norm, ax_upd):
        ax.set_xlabel("step")
        ax.grid(True, alpha=0.3)
    ax_upd.legend(fontsize="small", loc="center left", bbox_to_anchor=(1.02, 0.5))
    fig.suptitle(title or f"{len(steps)} checkpoints, steps {steps[0]}..{steps[-1]}")
    fig.tight_layout()
    try:
        fig.savefig(out, dpi=80)
    except OSError as e:
        raise InputError(f"cannot write {out}: {e.strerror}") from None


def main(argv):
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("inputs", nargs="+", metavar="RUN_DIR_or_CHECKPOINT",
                        help="a run directory, or checkpoint files")
    parser.add_argument("--out", required=True, metavar="PNG", help="where to write the figure")
    parser.add_argument("--title", help="figure title")
    parser.add_argument("--parallel", action="store_true",
                        help="insist on reading through MPI-IO on several ranks (mpi4py and an "
                             "MPI-enabled h5py); exit 2 naming what is missing otherwise")
    args = parser.parse_args(argv)
    comm = get_comm()
    rank = comm.Get_rank() if comm is not None else (launcher_value(LAUNCHER_RANK_VARS) or 0)
    try:
        if args.parallel and parallel_problem(comm):
            raise InputError(parallel_problem(comm))
        if comm is not None and not h5py.get_config().mpi and rank == 0:
            print(f"{PROG}: note: h5py is a serial build; each rank reads its tensors with "
                  f"ordinary opens (python3-h5py-mpi gives MPI-IO)", file=sys.stderr)
        files = order_by_step(checkpoint_files(args.inputs))
        steps, names, history = compute(files, comm)
        if rank == 0:
            if not names:
                raise InputError("no /model tensors in the checkpoints")
            print_table(steps, names, history)
            draw(steps, names, history, args.out, args.title)
            mode = ""
            if comm is not None:
                driver = "MPI-IO" if h5py.get_config().mpi else "serial opens"
                mode = f", read on {comm.Get_size()} ranks through {driver}"
            print(f"{PROG}: wrote {args.out} ({len(files)} checkpoints, {len(names)} tensors{mode})")
    except InputError as e:
        # Every rank sees the same input, so every rank reaches this; rank 0 reports.
        if rank == 0:
            print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
