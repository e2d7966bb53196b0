"""Checkpoint save and restore of a 200 MB state through metaflow-checkpoint (what @checkpoint
and save_sharded use), against writing and reading the same bytes with Metaflow's datastore
storage directly. docs/checkpoints.md quotes the result.

    .venv/bin/python bench/checkpoint_throughput.py [--mb 200] [--repeat 3] [--root DIR]

Runs in a fresh interpreter with the local datastore under DIR (a temporary folder by default):
both paths then write to the same disk. A checkpoint's save includes writing the state into
its folder (what torch.save into current.checkpoint.directory does), as the direct write starts
from the bytes in memory. On the local datastore metaflow-checkpoint restores by symlinking the
stored files; the restore times include reading the bytes back.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

# What one repetition does, in a process of its own (Metaflow reads its settings once).
CHILD = r"""
import io, json, os, shutil, sys, tempfile, time
from metaflow import Checkpoint
from metaflow.plugins import DATASTORES
from metaflow.metaflow_config import DEFAULT_DATASTORE

mb, repeat = int(sys.argv[1]), int(sys.argv[2])
os.environ["METAFLOW_CHECKPOINT_UID"] = "BenchFlow/1/train/2/abcdef123456/default/0"
os.environ["METAFLOW_CHECKPOINT_TASK_IDENTIFIER"] = "abcdef123456"
state = os.urandom(mb * 1024 * 1024)
source = tempfile.mkdtemp()
impl = [d for d in DATASTORES if d.TYPE == DEFAULT_DATASTORE][0]
storage = impl(impl.get_datastore_root_from_config(print))
writer = Checkpoint()
rows = []
for i in range(repeat):
    t = time.perf_counter()
    # a checkpoint is a folder of files: writing the state there (torch.save) is part of it
    with open(os.path.join(source, "state.bin"), "wb") as f:
        f.write(state)
    ref = writer.save(path=source, name="bench")
    saved = time.perf_counter() - t
    target = tempfile.mkdtemp()
    t = time.perf_counter()
    Checkpoint().load(ref, target)
    with open(os.path.join(target, "state.bin"), "rb") as f:  # read it, as a restore would
        assert len(f.read()) == len(state)
    loaded = time.perf_counter() - t
    key = "bench-direct/%d/state.bin" % i
    t = time.perf_counter()
    storage.save_bytes(iter([(key, io.BytesIO(state))]), overwrite=True)
    direct_save = time.perf_counter() - t
    t = time.perf_counter()
    with storage.load_bytes([key]) as results:
        for _, path, _ in results:
            with open(path, "rb") as f:
                assert len(f.read()) == len(state)
    direct_load = time.perf_counter() - t
    shutil.rmtree(target)
    rows.append(dict(checkpoint_save=saved, checkpoint_load=loaded,
                     direct_save=direct_save, direct_load=direct_load))
print("@@" + json.dumps(rows))
"""


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--root", default=None)
    args = parser.parse_args()
    root = args.root or tempfile.mkdtemp(prefix="bench-checkpoint-")
    env = dict(os.environ, METAFLOW_DEFAULT_DATASTORE=os.environ.get(
        "METAFLOW_DEFAULT_DATASTORE", "local"), METAFLOW_DATASTORE_SYSROOT_LOCAL=root)
    try:
        out = subprocess.run([sys.executable, "-c", CHILD, str(args.mb), str(args.repeat)],
                             env=env, capture_output=True, text=True, check=True).stdout
    finally:
        if args.root is None:
            shutil.rmtree(root, ignore_errors=True)
    rows = json.loads(out.rsplit("@@", 1)[1])
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    print("%d MB, %d repetitions, median seconds (MB/s); 1-min load average %s"
          % (args.mb, args.repeat, load))
    for what in ("save", "load"):
        mine = statistics.median(r["checkpoint_" + what] for r in rows)
        direct = statistics.median(r["direct_" + what] for r in rows)
        print("%s: metaflow-checkpoint %.2f s (%.0f MB/s), datastore directly %.2f s "
              "(%.0f MB/s), ratio %.2f" % (what, mine, args.mb / mine, direct,
                                            args.mb / direct, mine / direct))


if __name__ == "__main__":
    main()
