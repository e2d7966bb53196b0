STEP_DECORATORS_DESC = [
    ("torch_distributed", ".torch_distributed.decorator.TorchDistributedDecorator"),
    # not "slurm": metaflow-slurm's decorator has that name (backends/slurm_decorator.py)
    ("torch_slurm", ".torch_distributed.backends.slurm_decorator.TorchSlurmDecorator"),
]

# `python flow.py --with batch torch-distributed preflight` (preflight/cli.py)
CLIS_DESC = [
    ("torch-distributed", ".torch_distributed.preflight.cli.cli"),
]
