"""The gang's settings: every knob of a step, typed and validated once, in step_init.

Each duration has its own name and meaning (seconds, `_s`); a bad value fails flow validation,
before the start step, naming the step, the setting, the value and the fix.
"""

import math
from dataclasses import dataclass
from typing import Any, Mapping, NoReturn, Optional

from ..core.errors import TorchDistributedConfigError

START_METHODS = ("auto", "fork", "exec")


@dataclass(frozen=True)
class GangSettings:
    # Every node and rank must join the gang within it; a store client waits as long to meet.
    rendezvous_timeout_s: float
    # Once rank 0 finished its body, how long the other ranks may still run (and rank 0, once
    # every other rank finished) before the stragglers are failed as unfinished.
    finish_timeout_s: float
    # How long node 0 waits for a heartbeat of a started node on another machine.
    heartbeat_timeout_s: float
    # How long a rank 0 that @timeout's alarm did not stop (stuck in native code) is given
    # before the task's own handler stops the gang (usertimer.AlarmForwarder).
    abort_grace_s: float
    # "auto", "fork" or "exec": how the members of a node are started.
    start_method: str
    # How long no rank's collective count may stand still while a rank waits in a collective
    # before the gang is failed as hung (stacks.py); None: hang detection is off (0 given).
    hang_timeout_s: Optional[float] = None
    # Once the gang is preempted (a SIGTERM to a node), how long its ranks may save before what
    # still runs is stopped (preempt.py). Under the scheduler's own stop timeout.
    preempt_grace_s: float = 25.0
    # Whether the step gets the gang's own card (card.py: GANG_CARD).
    card: bool = True
    # Seconds between two draws of that card while the gang runs (livecard.py); None: drawn
    # only as the task ends (0 given).
    card_refresh_s: Optional[float] = 10.0
    # How many times a failed gang is started again in place, within the attempt, before the
    # attempt fails (gang/leader.py, Leader._restart); 0: never, every failure is the attempt's.
    max_restarts: int = 0
    # Over how many seconds node 0 names the rank the others wait for (core/stragglers.py);
    # None: it names none (0 given).
    straggler_window_s: Optional[float] = 120.0


def resolve(step_name: str, attributes: Mapping[str, Any],
            config: Mapping[str, Any]) -> GangSettings:
    """The GangSettings of `step_name` from its decorator `attributes` (None: not given) and
    `config`, the METAFLOW_TORCH_DISTRIBUTED_* values ({short name: value}). The finish timeout
    defaults to the step's rendezvous timeout."""
    rendezvous = _seconds(step_name, "rendezvous_timeout", attributes.get("rendezvous_timeout"),
                          config["RENDEZVOUS_TIMEOUT"])
    finish = attributes.get("finish_timeout")
    if finish is None and config.get("FINISH_TIMEOUT") is None:
        finish_s = rendezvous
    else:
        finish_s = _seconds(step_name, "finish_timeout", finish, config.get("FINISH_TIMEOUT"))
    return GangSettings(
        rendezvous_timeout_s=rendezvous,
        finish_timeout_s=finish_s,
        heartbeat_timeout_s=_seconds(step_name, "heartbeat_timeout", None,
                                     config["HEARTBEAT_TIMEOUT"]),
        abort_grace_s=_seconds(step_name, "abort_grace", None, config["ABORT_GRACE"]),
        start_method=_start_method(step_name, attributes.get("start_method"),
                                   config["START_METHOD"]),
        preempt_grace_s=_seconds(step_name, "preempt_grace", attributes.get("preempt_grace"),
                                 config["PREEMPT_GRACE"]),
        hang_timeout_s=_seconds_or_off(step_name, "hang_timeout", attributes.get("hang_timeout"),
                                       config["HANG_TIMEOUT"]),
        card=_switch(step_name, "card", attributes.get("card"), config["CARD"]),
        card_refresh_s=_seconds_or_off(step_name, "card_refresh", None,
                                       config.get("CARD_REFRESH", 10)),
        max_restarts=_count(step_name, "max_restarts", attributes.get("max_restarts"),
                            config.get("MAX_RESTARTS", 0)),
        straggler_window_s=_seconds_or_off(step_name, "straggler_window", None,
                                           config.get("STRAGGLER_WINDOW", 120)),
    )


def _count(step_name: str, name: str, value: Any, configured: Any) -> int:
    """`value` (the decorator attribute) or else `configured` (its METAFLOW_ setting) as a
    whole number, 0 or more."""
    raw = configured if value is None else value
    try:
        count = int(str(raw).strip()) if not isinstance(raw, (bool, float)) else None
    except ValueError:
        count = None
    if count is not None and count >= 0:
        return count
    return _bad(step_name, "%s is not a whole number of 0 or more. Give e.g. %s." % (
        _setting(name, value, raw), _setting(name, value, 3, quote=False)))


_ON = ("1", "true", "yes", "on")
_OFF = ("0", "false", "no", "off")


def _switch(step_name: str, name: str, value: Any, configured: Any) -> bool:
    """`value` (the decorator attribute) or else `configured` (its METAFLOW_ setting) as a
    bool: True/False, or one of the words of _ON/_OFF."""
    raw = configured if value is None else value
    if isinstance(raw, bool):
        return raw
    word = str(raw).strip().lower()
    if word in _ON or word in _OFF:
        return word in _ON
    where = ("%s=%r" % (name, raw) if value is not None
             else "METAFLOW_TORCH_DISTRIBUTED_%s=%r" % (name.upper(), raw))
    return _bad(step_name, "%s is neither on nor off. Give %s." % (
        where, "%s=True or %s=False" % (name, name) if value is not None
        else "METAFLOW_TORCH_DISTRIBUTED_%s=1 or 0" % name.upper()))


def _seconds_or_off(step_name: str, name: str, value: Any,
                    configured: Any) -> Optional[float]:
    """As _seconds, where 0 turns the check off (None)."""
    raw = configured if value is None else value
    try:
        off = not isinstance(raw, bool) and float(raw) == 0
    except (TypeError, ValueError):
        off = False
    if off:
        return None
    try:
        return _seconds(step_name, name, value, configured)
    except TorchDistributedConfigError as ex:
        raise TorchDistributedConfigError(
            step_name, "%s Or 0 to turn it off." % str(ex).split(": ", 1)[-1].rstrip()) from None


def _seconds(step_name: str, name: str, value: Any, configured: Any) -> float:
    """`value` (the decorator attribute) or else `configured` (its METAFLOW_ setting) as a
    positive, finite number of seconds."""
    raw = configured if value is None else value
    try:
        seconds = float(raw)
    except (TypeError, ValueError):
        seconds = None
    if seconds is not None and not isinstance(raw, bool) and 0 < seconds and math.isfinite(seconds):
        return seconds
    return _bad(step_name, "%s is not a positive number of seconds. Give e.g. %s." % (
        _setting(name, value, raw), _setting(name, value, 300, quote=False)))


def _setting(name: str, value: Any, shown: Any, quote: bool = True) -> str:
    """`name=shown` as the user wrote it: the decorator's attribute when one was given
    (`value` not None), else its METAFLOW_TORCH_DISTRIBUTED_ variable."""
    key = name if value is not None else "METAFLOW_TORCH_DISTRIBUTED_%s" % name.upper()
    return ("%s=%r" if quote else "%s=%s") % (key, shown)


def _start_method(step_name: str, value: Any, configured: Any) -> str:
    method = configured if value is None else value
    if method not in START_METHODS:
        _bad(step_name, "start_method=%r is not one of %s." % (method, ", ".join(START_METHODS)))
    return str(method)


def _bad(step_name: str, message: str) -> NoReturn:
    raise TorchDistributedConfigError(step_name, message)
