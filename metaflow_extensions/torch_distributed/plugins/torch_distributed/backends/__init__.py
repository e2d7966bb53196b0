"""Where a gang's nodes come from beyond this machine: AWS Batch (one multi-node job),
Kubernetes (one JobSet), Step Functions and Argo Workflows (compiled at deploy time), the
node's place read from its scheduler (trampoline), and the guards of schedulers that cannot
give a gang its nodes (schedulers). Imports the core, the runtime and the Metaflow seam.
"""
