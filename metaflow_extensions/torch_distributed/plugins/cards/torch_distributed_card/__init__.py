"""The gang's own card type, `torch_distributed`: Metaflow finds it here (plugins/cards) and
renders it with `card create` like any card. @torch_distributed puts one on every gang step
(card.py: GANG_CARD); it takes no components from the step's code, so a user's own cards and
`current.card` are exactly as the user built them."""

from typing import Any

from ...torch_distributed.mf.internals import card_base


class TorchDistributedCard(card_base()):  # type: ignore[misc]  # Metaflow's MetaflowCard
    """What the gang of one attempt did: topology, every rank's timeline, the outcome with its
    root cause, each rank's last lines and the attempts before it. Drawn from the attempt's
    gang record, kept with the task (events.py), so it needs nothing from the step's code."""

    type = "torch_distributed"
    ALLOW_USER_COMPONENTS = False
    RUNTIME_UPDATABLE = False

    def __init__(self, options: Any = None, components: Any = None, graph: Any = None,
                 flow: Any = None, **kwargs: Any) -> None:
        super().__init__()

    def render(self, task: Any) -> str:
        from ...torch_distributed.mf import card

        return card.render(task)


CARDS = [TorchDistributedCard]
