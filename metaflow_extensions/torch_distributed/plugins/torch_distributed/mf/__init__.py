"""Everything that touches Metaflow: the one module that reaches its internals (internals),
the spin-step command, `current.torch_distributed`, @checkpoint on every rank, the group check,
the gang's record and card, @timeout's timer, the supported versions, the attempt's secret.
Imports the core and the runtime.
"""
