STEP_DECORATORS_DESC = [
    ("torch_distributed", ".torch_distributed.decorator.TorchDistributedDecorator"),
]
