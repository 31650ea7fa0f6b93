#!/usr/bin/env python3
"""The deterministic damage test (docs/robustness.md, ctest label `damage`).

From real files that the built tessera writes here on 2 ranks (a supervised dataset, a language
dataset, a checkpoint of each model), it makes damaged copies: truncations at a spread of
offsets, byte flips in the superblock, in metadata (object headers found through h5py, and the
structures HDF5 marks with a signature: header continuations, v2 B-trees, fractal and global
heaps; the files are in HDF5 1.10 format, whose metadata carries checksums) and
in raw data (the middle of the largest dataset). Each copy goes through the commands that read
such a file, on 2 ranks, each under a timeout:
  dataset     check, train, eval (--checkpoint: the good checkpoint)
  checkpoint  train --resume PATH (the damaged file in place of the newest checkpoint of a copy
              of the run that wrote it), eval --checkpoint, inspect, diff (against the good one)
The promise (DESIGN.md): exit 0 (damage that no check can see) or exit 2 with exactly one
`tessera: error:` line on stderr; a failing `train --resume` leaves its run directory byte for
byte as it was. Anything else (another exit code, an internal error, a signal, a timeout) fails
the test. It prints every run, then a table of outcomes by command.

Usage: test_damage.py --tessera BIN --seed-data BIN --mpirun tools/mpirun.sh --work DIR
Environment: TESSERA_DAMAGE_TIMEOUT (seconds per command, default 90; a run takes 1-3 s).
"""
import argparse
import collections
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py

RANKS = 2
TIMEOUT = float(os.environ.get("TESSERA_DAMAGE_TIMEOUT", "90"))
ERROR_LINE = re.compile(r"^tessera: error: ", re.M)
# mpirun's report of a rank killed by a signal, or the rank's own report of one it caught.
SIGNAL_LINE = re.compile(r"on signal (\d+)|Signal: [^\n]*\((\d+)\)")

MLP_DECK = """# The damage test's MLP: 16 features, 3 classes (tessera_fuzz_seed_data)
[run]
seed = 5
[model]
kind = "mlp"
hidden = [64, 64]
[optimizer]
kind = "sgd"
lr = 0.05
momentum = 0.9
[train]
steps = 4
global_batch = 32
log_every = 1
[eval]
every_epoch = false
at_end = true
batch = 64
[checkpoint]
every_steps = 2
keep = 2
"""

GPT_DECK = """# The damage test's GPT: byte tokens (tessera prepare text)
[run]
seed = 5
[data]
test_split = "val"
[model]
kind = "gpt"
layers = 1
heads = 2
width = 16
context = 16
[optimizer]
kind = "adamw"
lr = 0.001
[train]
steps = 2
global_batch = 8
log_every = 1
[eval]
every_epoch = false
at_end = true
batch = 32
[checkpoint]
every_steps = 0
keep = 1
"""


class Runner:
    """Runs tessera on RANKS ranks with a timeout and names the outcome."""

    def __init__(self, args, log_dir):
        self.tessera = args.tessera
        self.mpirun = args.mpirun
        self.log_dir = log_dir
        # Every damaged input ends in an error exit on both ranks at once. Open MPI then waits
        # twice odls_base_sigkill_timeout (1 s by default) before it reaps the job: 2 s of each of
        # the ~170 runs. 0 reaps it at once; a rank that had not ended (the ranks disagreeing)
        # is then killed, which the outcome reports as a signal, so the test stays as strict.
        self.env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMPI_MCA_odls_base_sigkill_timeout="0")
        self.count = 0

    def __call__(self, *argv):
        """Returns (outcome, detail, seconds); outcome is one of: exit 0, exit 2, exit 2 with
        N error lines, internal error, exit N, signal N, timeout."""
        cmd = [self.mpirun, "-n", str(RANKS), self.tessera, *map(str, argv)]
        self.count += 1
        log = self.log_dir / f"{self.count:03d}.log"
        start = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=self.env,
                                start_new_session=True, text=True, errors="replace")
        try:
            out, err = proc.communicate(timeout=TIMEOUT)
            timed_out = False
        except subprocess.TimeoutExpired:
            stop_group(proc)
            out, err = proc.communicate()
            timed_out = True
        seconds = time.monotonic() - start
        log.write_text(f"$ {' '.join(cmd)}\n--- exit {proc.returncode}\n--- stdout\n{out}\n--- stderr\n{err}")
        errors = ERROR_LINE.findall(err)
        first_error = next((l for l in err.splitlines() if "error" in l.lower()), err.strip()[:200])
        sig = SIGNAL_LINE.search(err)
        if timed_out:
            return "timeout", f"no exit after {TIMEOUT:.0f} s ({log.name})", seconds
        if proc.returncode < 0 or sig:
            number = -proc.returncode if proc.returncode < 0 else int(sig.group(1) or sig.group(2))
            return f"signal {number}", f"{first_error} ({log.name})", seconds
        if "internal error" in err:
            internal = next(l for l in err.splitlines() if "internal error" in l)
            return "internal error", f"{internal} ({log.name})", seconds
        if proc.returncode == 0:
            return "exit 0", "", seconds
        if proc.returncode == 2 and len(errors) == 1:
            return "exit 2", first_error, seconds
        if proc.returncode == 2:
            return f"exit 2 with {len(errors)} error lines", f"{first_error} ({log.name})", seconds
        return f"exit {proc.returncode}", f"{first_error} ({log.name})", seconds


def stop_group(proc):
    """mpirun forwards SIGTERM to its ranks; what is left is killed."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def tree_hash(root):
    """{relative path: sha256} of every file under root."""
    out = {}
    for path in sorted(Path(root).rglob("*")):
        if path.is_file():
            out[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


# --- Damage -------------------------------------------------------------------------------

# Fields of the structures HDF5 marks with a signature (HDF5 file format specification), as
# offsets from the signature. Tessera writes its files in the 1.10 format (libver V110): version 2
# object headers, v2 B-trees and fractal heaps, all with checksums; the global heap (variable-length
# strings) and raw data carry none. Version 0/1 structures are kept for files written by others.
SIGNATURE_FIELDS = {
    ("TREE", "entries used"): 6, ("TREE", "first child address"): 32,     # v1 B-tree node
    ("HEAP", "data segment size"): 8, ("HEAP", "data segment address"): 24,  # local heap
    ("SNOD", "symbol count"): 6, ("SNOD", "first object header address"): 16,  # symbol table node
    ("GCOL", "collection size"): 8, ("GCOL", "first object size"): 24,    # global heap
    ("OCHK", "first message type"): 4, ("OCHK", "first message size"): 5,  # header continuation
    ("BTHD", "root node address"): 16, ("BTHD", "record size"): 10,       # v2 B-tree header
    ("BTLF", "first record"): 6,                                          # v2 B-tree leaf
    ("FRHP", "table width"): 110, ("FRHP", "root block address"): 132,    # fractal heap header
    ("FHDB", "heap header address"): 5,                                   # fractal heap direct block
}
# Inside a version-1 object header: message count, header size, first message's size, and the
# first message's data (for a dataset, the dataspace: its first dimension's lowest byte).
OBJECT_FIELDS = {"messages": 2, "header size": 8, "first message size": 18, "dataspace dim": 32}
# Superblock version 0: size of offsets, end-of-file address, root group object header address;
# versions 2 and 3 (the 1.10 format) place them otherwise.
SUPERBLOCK_FIELDS = {"size of offsets": 13, "end of file": 41, "root object header": 64}
SUPERBLOCK_V2_FIELDS = {"size of offsets": 9, "end of file": 28, "root object header": 36}


def object_header_v2_fields(data, addr):
    """The fields of a version-2 object header ("OHDR") at addr: the flags byte says whether
    times (16 bytes) and attribute phase values (4) are present and how wide chunk 0's size is;
    the first message follows (type, size, flags, creation order if tracked, its data)."""
    flags = data[addr + 5]
    at = addr + 6 + (16 if flags & 0x20 else 0) + (4 if flags & 0x10 else 0)
    chunk_size = at
    message = at + (1 << (flags & 0x03))
    data_at = message + 4 + (2 if flags & 0x04 else 0)
    fields = {"messages": addr + 4, "header size": chunk_size, "first message size": message + 1}
    if data[message] == 1:  # a dataspace message (version 2): version, rank, flags, type, dims
        fields["dataspace dim"] = data_at + 4
    return fields


class Damage:
    """A list of (name, function of the pristine bytes -> damaged bytes) for one file."""

    def __init__(self, path):
        self.path = Path(path)
        self.data = self.path.read_bytes()
        self.cases = []

    def flip(self, name, offset, mask=0xFF):
        if offset >= len(self.data):
            return
        def damage(b, offset=offset, mask=mask):
            b = bytearray(b)
            b[offset] ^= mask
            return bytes(b)
        self.cases.append((f"{name} @{offset}", damage))

    def truncations(self, count):
        size = len(self.data)
        for k in range(count):
            cut = size * k // count
            self.cases.append((f"truncated to {cut} of {size} bytes", lambda b, cut=cut: b[:cut]))

    def superblock(self, fields):
        table = SUPERBLOCK_FIELDS if self.data[8] < 2 else SUPERBLOCK_V2_FIELDS
        for field in fields:
            self.flip(f"superblock v{self.data[8]} {field}", table[field])

    def object_header(self, obj, fields):
        """Fields of obj's object header; "messages" is the version byte of a version-2 header
        (which counts no messages)."""
        with h5py.File(self.path, "r") as f:
            addr = h5py.h5o.get_info(f[obj].id).addr
        if self.data[addr:addr + 4] == b"OHDR":
            offsets = object_header_v2_fields(self.data, addr)
        else:
            offsets = {k: addr + v for k, v in OBJECT_FIELDS.items()}
        for field in fields:
            if field not in offsets:
                sys.exit(f"test_damage: {obj} in {self.path} has no {field} where expected")
            self.flip(f"object header {obj} {field}", offsets[field])

    def structure(self, signature, field):
        """A field of the first structure with this signature (SIGNATURE_FIELDS)."""
        at = self.data.find(signature.encode())
        if at < 0:
            sys.exit(f"test_damage: {self.path} has no {signature}; choose other structures")
        self.flip(f"{signature} {field}", at + SIGNATURE_FIELDS[(signature, field)])

    def raw_middle(self, dataset, mask=0xFF, element=1):
        """Flips a byte in the middle of a contiguous dataset's raw data; element > 1 aligns it
        to an element's lowest byte (a float's last mantissa bits: no NaN, no check can see it)."""
        with h5py.File(self.path, "r") as f:
            d = f[dataset]
            offset, size = d.id.get_offset(), d.id.get_storage_size()
        middle = offset + (size // 2) // element * element
        self.flip(f"raw data of {dataset}, middle", middle, mask)

    def write(self, case, out):
        _, damage = self.cases[case]
        Path(out).write_bytes(damage(self.data))


# --- The test -----------------------------------------------------------------------------

class DamageTest:
    def __init__(self, args):
        self.args = args
        self.work = Path(args.work)
        shutil.rmtree(self.work, ignore_errors=True)
        (self.work / "logs").mkdir(parents=True)
        self.run = Runner(args, self.work / "logs")
        self.results = []  # (file kind, case, command, outcome, detail, seconds)
        self.failures = []

    def record(self, kind, case, command, result, ok_outcomes=("exit 0", "exit 2")):
        outcome, detail, seconds = result
        self.results.append((kind, case, command, outcome, detail, seconds))
        print(f"{kind:<10} {case:<52} {command:<7} {outcome:<8} {seconds:5.1f}s  {detail}", flush=True)
        if outcome not in ok_outcomes:
            self.failures.append(f"{kind} / {case} / {command}: {outcome}: {detail}")

    def must(self, result, what):
        if result[0] != "exit 0":
            sys.exit(f"test_damage: {what} failed: {result}")

    def prepare(self):
        """The pristine files and runs, all written by the built tessera (2 ranks)."""
        w = self.work
        subprocess.run([self.args.seed_data, w, "960", "160"], check=True)
        (w / "mlp.toml").write_text(MLP_DECK)
        (w / "gpt.toml").write_text(GPT_DECK)
        text = "".join(f"{i:05d} In the beginning was the deck, and every key had its line.\n"
                       for i in range(600))
        (w / "text.txt").write_text(text)
        self.must(self.run("prepare", "text", "--out", w / "tokens.h5", "--val-fraction", "0.2",
                           w / "text.txt"), "prepare text")
        self.must(self.run("train", w / "mlp.toml", "--set", f"data.path={w / 'supervised.h5'}",
                           "--set", f"run.output_dir={w / 'mlp_run'}"), "training the MLP")
        self.must(self.run("train", w / "gpt.toml", "--set", f"data.path={w / 'tokens.h5'}",
                           "--set", f"run.output_dir={w / 'gpt_run'}"), "training the GPT")
        self.mlp_checkpoint = w / "mlp_run/checkpoints/step_00000004.h5"
        self.gpt_checkpoint = w / "gpt_run/checkpoints/step_00000002.h5"

    def dataset_cases(self, kind, damage, deck, good_checkpoint):
        w = self.work
        for i, (case, _) in enumerate(damage.cases):
            data = w / f"damaged_{kind}.h5"
            damage.write(i, data)
            run_dir = w / f"run_{kind}"
            shutil.rmtree(run_dir, ignore_errors=True)
            data_set = f"data.path={data}"
            self.record(kind, case, "check", self.run("check", deck, "--set", data_set))
            self.record(kind, case, "train", self.run("train", deck, "--set", data_set, "--set",
                                                      f"run.output_dir={run_dir}"))
            self.record(kind, case, "eval", self.run("eval", deck, "--set", data_set,
                                                     "--checkpoint", good_checkpoint))

    def checkpoint_cases(self, damage):
        w = self.work
        deck, data = w / "mlp.toml", f"data.path={w / 'supervised.h5'}"
        for i, (case, _) in enumerate(damage.cases):
            # train --resume PATH: the damaged file in place of the newest checkpoint of a copy
            # of the run that wrote it; a failure must leave that run as it was.
            run_dir = w / "resume_run"
            shutil.rmtree(run_dir, ignore_errors=True)
            shutil.copytree(w / "mlp_run", run_dir)
            damaged = run_dir / "checkpoints" / self.mlp_checkpoint.name
            damage.write(i, damaged)
            before = tree_hash(run_dir)
            result = self.run("train", deck, "--set", data, "--set", f"run.output_dir={run_dir}",
                              "--set", "train.steps=6", "--resume", damaged)
            if result[0] != "exit 0" and tree_hash(run_dir) != before:
                result = ("lost", f"the run directory changed ({result[0]}: {result[1]})", result[2])
            self.record("checkpoint", case, "resume", result)
            self.record("checkpoint", case, "eval", self.run("eval", deck, "--set", data,
                                                             "--checkpoint", damaged))
            self.record("checkpoint", case, "inspect", self.run("inspect", damaged))
            self.record("checkpoint", case, "diff", self.run("diff", damaged, self.mlp_checkpoint))

    def summary(self):
        outcomes = sorted({r[3] for r in self.results}, key=lambda o: (o != "exit 0", o != "exit 2", o))
        by = collections.Counter((r[0], r[2], r[3]) for r in self.results)
        rows = list(dict.fromkeys((r[0], r[2]) for r in self.results))  # in order of appearance
        print(f"\n{'file':<10} {'command':<8} " + " ".join(f"{o:>10}" for o in outcomes))
        for kind, command in rows:
            print(f"{kind:<10} {command:<8} " + " ".join(f"{by[(kind, command, o)]:>10}" for o in outcomes))
        total = collections.Counter(r[3] for r in self.results)
        print(f"{'all':<10} {'':<8} " + " ".join(f"{total[o]:>10}" for o in outcomes))
        cases = len({(r[0], r[1]) for r in self.results})
        seconds = sum(r[5] for r in self.results)
        print(f"\n{cases} damaged files, {len(self.results)} runs, {seconds:.0f} s of runs")
        if self.failures:
            print(f"\n{len(self.failures)} runs broke the promise (exit 0, or exit 2 with one "
                  "`tessera: error:` line; nothing lost):")
            for f in self.failures:
                print("  " + f)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tessera", required=True)
    parser.add_argument("--seed-data", required=True, help="tessera_fuzz_seed_data")
    parser.add_argument("--mpirun", required=True, help="tools/mpirun.sh")
    parser.add_argument("--work", required=True)
    args = parser.parse_args()

    t = DamageTest(args)
    t.prepare()
    w = t.work

    supervised = Damage(w / "supervised.h5")
    supervised.truncations(8)
    supervised.superblock(["size of offsets", "root object header"])
    supervised.object_header("train/inputs", ["messages", "dataspace dim"])
    supervised.object_header("train/labels", ["header size"])
    supervised.structure("OCHK", "first message type")
    supervised.structure("OCHK", "first message size")
    supervised.structure("GCOL", "collection size")
    supervised.structure("GCOL", "first object size")
    supervised.raw_middle("train/inputs")
    supervised.raw_middle("train/labels")

    tokens = Damage(w / "tokens.h5")
    tokens.truncations(4)
    tokens.superblock(["end of file"])
    tokens.object_header("train/tokens", ["dataspace dim"])
    tokens.structure("OCHK", "first message size")
    tokens.structure("GCOL", "collection size")
    tokens.raw_middle("train/tokens")

    checkpoint = Damage(t.mlp_checkpoint)
    checkpoint.truncations(8)
    checkpoint.superblock(["size of offsets", "root object header"])
    checkpoint.object_header("model/layers.0.weight", ["messages", "dataspace dim"])
    checkpoint.object_header("train", ["first message size"])
    checkpoint.structure("BTHD", "root node address")
    checkpoint.structure("BTLF", "first record")
    checkpoint.structure("FRHP", "root block address")
    checkpoint.structure("FHDB", "heap header address")
    checkpoint.structure("OCHK", "first message type")
    checkpoint.structure("GCOL", "collection size")
    checkpoint.structure("GCOL", "first object size")
    checkpoint.raw_middle("model/layers.0.weight", mask=0x01, element=4)

    t.dataset_cases("supervised", supervised, w / "mlp.toml", t.mlp_checkpoint)
    t.dataset_cases("tokens", tokens, w / "gpt.toml", t.gpt_checkpoint)
    t.checkpoint_cases(checkpoint)
    t.summary()
    return 1 if t.failures else 0


if __name__ == "__main__":
    sys.exit(main())
