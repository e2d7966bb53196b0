"""Configuration knobs of @torch_distributed; each one is overridden by the environment
variable METAFLOW_<NAME> (for example METAFLOW_TORCH_DISTRIBUTED_RENDEZVOUS_TIMEOUT=60)."""

import os

from metaflow.metaflow_config_funcs import from_conf

from . import username as _username  # a module: Metaflow copies no module into its config

# Seconds a gang waits for every node and rank to check in before it fails, naming the
# missing ones. The decorator attribute `rendezvous_timeout` overrides it per step.
TORCH_DISTRIBUTED_RENDEZVOUS_TIMEOUT = from_conf("TORCH_DISTRIBUTED_RENDEZVOUS_TIMEOUT", 300)

# Seconds the other ranks may still run once rank 0 finished its step body (and rank 0 once
# every other rank finished) before they are failed as unfinished. Unset: the step's rendezvous
# timeout. The decorator attribute `finish_timeout` overrides it per step.
TORCH_DISTRIBUTED_FINISH_TIMEOUT = from_conf("TORCH_DISTRIBUTED_FINISH_TIMEOUT")

# How members are started: "fork" (fast: forked from the loaded task), "exec" (a fresh
# interpreter per member), or "auto" (fork where it is safe, else exec).
TORCH_DISTRIBUTED_START_METHOD = from_conf("TORCH_DISTRIBUTED_START_METHOD", "auto")

# Seconds rank 0 is given to unwind on its own after the gang failed before the task is
# ended by force (rank 0 may be blocked inside a C++ collective).
TORCH_DISTRIBUTED_ABORT_GRACE = from_conf("TORCH_DISTRIBUTED_ABORT_GRACE", 2)

# Show this package's own frames in the tracebacks of a failed rank (they are left out, so that
# a rank's traceback starts at the step's code), and every rank's traceback in full.
TORCH_DISTRIBUTED_DEBUG = from_conf("TORCH_DISTRIBUTED_DEBUG", False)

# Run a GPU topology on CPU with gloo (rehearse a GPU flow on a machine without GPUs).
TORCH_DISTRIBUTED_CPU_REHEARSAL = from_conf("TORCH_DISTRIBUTED_CPU_REHEARSAL", False)

# Seconds node 0 of a gang whose nodes are separate machines (AWS Batch) waits for a heartbeat
# from a node that has started before it fails the gang, naming that node.
TORCH_DISTRIBUTED_HEARTBEAT_TIMEOUT = from_conf("TORCH_DISTRIBUTED_HEARTBEAT_TIMEOUT", 30)

# Seconds no rank of a gang may complete a collective while some rank waits in one before the
# gang is failed as hung, naming the straggler with its stack (stacks.py); 0 turns it off.
TORCH_DISTRIBUTED_HANG_TIMEOUT = from_conf("TORCH_DISTRIBUTED_HANG_TIMEOUT", 600)

# Seconds of training over which node 0 names the straggler, the rank the others wait for
# (core/stragglers.py: from the hang probe's samples, so only while hang detection is on);
# named once half of it has passed. 0 turns it off.
TORCH_DISTRIBUTED_STRAGGLER_WINDOW = from_conf("TORCH_DISTRIBUTED_STRAGGLER_WINDOW", 120)

# Seconds every rank of a preempted gang (a SIGTERM to one of its nodes) is given to save
# before what still runs is stopped; under the schedulers' own stop timeouts (30 s).
TORCH_DISTRIBUTED_PREEMPT_GRACE = from_conf("TORCH_DISTRIBUTED_PREEMPT_GRACE", 25)

# How many times a failed gang is started again in place (same machines, same attempt) before
# its attempt fails; 0: never. The decorator attribute `max_restarts` overrides it per step.
TORCH_DISTRIBUTED_MAX_RESTARTS = from_conf("TORCH_DISTRIBUTED_MAX_RESTARTS", 0)

# Whether every gang step gets the gang's own card (type and id `torch_distributed`): its
# topology, every rank's timeline, the root cause of a failure. The decorator attribute `card`
# overrides it per step.
TORCH_DISTRIBUTED_CARD = from_conf("TORCH_DISTRIBUTED_CARD", True)

# Seconds between two draws of the gang's card while the gang runs (node 0's task draws it in
# its own process: mf/livecard.py); `card server` and the Metaflow UI reload it. 0 draws it only
# as the task ends.
TORCH_DISTRIBUTED_CARD_REFRESH = from_conf("TORCH_DISTRIBUTED_CARD_REFRESH", 10)

# What happens when a rank of a gang ran its step body without joining the gang's process
# group (its ranks trained independently): "error", "warn" or "off". Unset: "error" on steps
# that carry @torch_distributed in the flow, "warn" on steps that got it from --with.
TORCH_DISTRIBUTED_GROUP_CHECK = from_conf("TORCH_DISTRIBUTED_GROUP_CHECK")

# Metaflow's own USER setting (METAFLOW_USER), given a value only where Metaflow would find no
# user name and stop with "Unknown user": as root in a fresh container or CI runner (username.py).
USER = _username.user_name(from_conf("USER"), os.environ)
