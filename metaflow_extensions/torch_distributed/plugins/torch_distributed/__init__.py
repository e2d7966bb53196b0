# Metaflow first: importing one of our modules on its own (e.g. `...torch_distributed.errors`
# to catch TorchDistributedGangFailed) would otherwise start Metaflow's extension loading from
# inside that half-imported module, and loading this package would fail.
import metaflow  # noqa: F401
