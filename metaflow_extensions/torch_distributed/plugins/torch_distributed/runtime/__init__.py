"""One node's processes, with no Metaflow: starting and stopping members and their output
(procs), the control plane (control) and the logs of other nodes through it (remote_logs), the
watch of a node (supervisor), signals (interrupt, preempt), stacks and progress (stacks), the
OOM killer's evidence (oom). Imports the core only.
"""
