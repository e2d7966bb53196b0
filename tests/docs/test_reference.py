"""Every attribute of current.torch_distributed, every variable a rank gets and every
configuration setting is documented."""

import fnmatch
import re

from metaflow_extensions.torch_distributed.config import mfextinit_torch_distributed as config
from metaflow_extensions.torch_distributed.plugins.torch_distributed.mf.current import \
    TorchDistributedInfo
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.envcontract import \
    FOREIGN_LAUNCHER_PREFIXES, Rendezvous, rank_env
from metaflow_extensions.torch_distributed.plugins.torch_distributed.mf.groupcheck import CHECK_ENV
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.topology import Topology
from tests.support import REPO


def page(name):
    return (REPO / "docs" / name).read_text()


def test_every_attribute_of_current_torch_distributed_is_in_the_reference():
    text = page("index.md")
    table = text[text.index("## `current.torch_distributed`"):]
    public = [n for n in vars(TorchDistributedInfo) if not n.startswith("_")]
    assert "gather" in public and "rank" in public
    for name in public:
        assert re.search(r"`%s(\(obj\))?`" % name, table), "index.md does not document %s" % name


def documented_names(text):
    """Names in backticks; a trailing or inner `*` stands for any text (`SLURM_*`)."""
    return set(re.findall(r"`([A-Z][A-Z0-9_*]*)`", text))


def test_every_variable_a_rank_can_get_is_in_environment_md():
    names = documented_names(page("environment.md"))
    rdzv = Rendezvous("10.0.0.1", 29500, "run-train-2-0")
    variables = set()
    for accelerator in ("cpu", "cuda"):
        env = rank_env(Topology(2, 4), 1, 2, rdzv, accelerator=accelerator,
                       error_file="/tmp/e.json", cuda_visible_devices="4,5,6,7")
        variables |= set(env)
    assert "RANK" in variables and "TORCH_NCCL_ASYNC_ERROR_HANDLING" in variables
    for name in sorted(variables):
        assert name in names or any(fnmatch.fnmatchcase(name, n) for n in names if "*" in n), \
            "environment.md does not document %s" % name
    for prefix in FOREIGN_LAUNCHER_PREFIXES:
        assert prefix + "*" in names, "environment.md does not say %s* is removed" % prefix


def test_every_setting_is_in_the_configuration_table():
    text = page("index.md")
    settings = ["METAFLOW_" + n for n in vars(config) if n.startswith("TORCH_DISTRIBUTED_")]
    assert settings
    for name in settings + [CHECK_ENV]:
        assert "`%s`" % name in text, "index.md does not document %s" % name
