STEP_DECORATORS_DESC = [
    ("torch_distributed", ".torch_distributed.decorator.TorchDistributedDecorator"),
]

# `python flow.py --with batch torch-distributed preflight` (preflight/cli.py)
CLIS_DESC = [
    ("torch-distributed", ".torch_distributed.preflight.cli.cli"),
]
