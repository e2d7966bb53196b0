"""The gang's settings: resolved and validated once, each duration with its own meaning."""

import math

import pytest

from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.errors import (
    TorchDistributedConfigError)
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.settings import (
    GangSettings, resolve)

CONFIG = {"RENDEZVOUS_TIMEOUT": 300, "FINISH_TIMEOUT": None, "HEARTBEAT_TIMEOUT": 30,
          "ABORT_GRACE": 2, "START_METHOD": "auto", "HANG_TIMEOUT": 600,
          "PREEMPT_GRACE": 25, "CARD": True}


def test_defaults_come_from_the_configuration():
    assert resolve("train", {}, CONFIG) == GangSettings(
        rendezvous_timeout_s=300.0, finish_timeout_s=300.0, heartbeat_timeout_s=30.0,
        abort_grace_s=2.0, start_method="auto", hang_timeout_s=600.0, preempt_grace_s=25.0,
        card=True)


def test_the_finish_timeout_follows_the_steps_rendezvous_timeout_unless_given():
    got = resolve("train", {"rendezvous_timeout": 20}, CONFIG)
    assert (got.rendezvous_timeout_s, got.finish_timeout_s) == (20.0, 20.0)
    got = resolve("train", {"rendezvous_timeout": 20, "finish_timeout": 900}, CONFIG)
    assert (got.rendezvous_timeout_s, got.finish_timeout_s) == (20.0, 900.0)
    got = resolve("train", {"rendezvous_timeout": 20}, dict(CONFIG, FINISH_TIMEOUT="45"))
    assert got.finish_timeout_s == 45.0


def test_attributes_win_over_the_configuration():
    got = resolve("train", {"rendezvous_timeout": "12.5", "start_method": "exec"}, CONFIG)
    assert (got.rendezvous_timeout_s, got.start_method) == (12.5, "exec")


@pytest.mark.parametrize("name", ["rendezvous_timeout", "finish_timeout"])
@pytest.mark.parametrize("value", [0, -1, "soon", True, math.inf, float("nan")])
def test_a_bad_duration_on_the_decorator_names_the_step_the_attribute_and_the_fix(name, value):
    with pytest.raises(TorchDistributedConfigError) as raised:
        resolve("train", {name: value}, CONFIG)
    text = str(raised.value)
    assert "train" in text and "%s=%r is not a positive number of seconds" % (name, value) in text
    assert "Give e.g. %s=300" % name in text


@pytest.mark.parametrize("key", ["RENDEZVOUS_TIMEOUT", "FINISH_TIMEOUT", "HEARTBEAT_TIMEOUT",
                                 "ABORT_GRACE"])
def test_a_bad_configured_duration_names_its_variable(key):
    with pytest.raises(TorchDistributedConfigError) as raised:
        resolve("train", {}, dict(CONFIG, **{key: "0"}))
    assert "METAFLOW_TORCH_DISTRIBUTED_%s='0' is not a positive number of seconds" % key \
        in str(raised.value)


def test_hang_detection_is_on_by_default_and_0_turns_it_off():
    assert resolve("train", {"hang_timeout": 45}, CONFIG).hang_timeout_s == 45.0
    assert resolve("train", {"hang_timeout": 0}, CONFIG).hang_timeout_s is None
    assert resolve("train", {}, dict(CONFIG, HANG_TIMEOUT="0")).hang_timeout_s is None
    assert resolve("train", {"hang_timeout": 30}, dict(CONFIG, HANG_TIMEOUT="0")) \
        .hang_timeout_s == 30.0


@pytest.mark.parametrize("value", [-1, "soon", True, math.inf])
def test_a_bad_hang_timeout_names_the_step_the_value_and_both_fixes(value):
    with pytest.raises(TorchDistributedConfigError) as raised:
        resolve("train", {"hang_timeout": value}, CONFIG)
    text = str(raised.value)
    assert "train" in text and "hang_timeout=%r is not a positive number of seconds" % value \
        in text
    assert "Give e.g. hang_timeout=300. Or 0 to turn it off." in text
    with pytest.raises(TorchDistributedConfigError,
                       match="METAFLOW_TORCH_DISTRIBUTED_HANG_TIMEOUT='-5'"):
        resolve("train", {}, dict(CONFIG, HANG_TIMEOUT="-5"))


def test_a_bad_start_method_is_refused():
    with pytest.raises(TorchDistributedConfigError, match="start_method='spawn' is not one of"):
        resolve("train", {"start_method": "spawn"}, CONFIG)


def test_settings_are_frozen():
    settings = resolve("train", {}, CONFIG)
    with pytest.raises(Exception):
        settings.rendezvous_timeout_s = 1


@pytest.mark.parametrize("attribute, configured, expected", [
    (None, True, True), (None, "0", False), (None, "off", False), (None, "yes", True),
    (False, True, False), (True, "0", True), ("false", True, False), (None, False, False)])
def test_the_gangs_card_is_on_unless_turned_off(attribute, configured, expected):
    assert resolve("train", {"card": attribute}, dict(CONFIG, CARD=configured)).card is expected


def test_a_card_switch_that_is_neither_on_nor_off_names_the_step_and_the_fix():
    with pytest.raises(TorchDistributedConfigError) as raised:
        resolve("train", {"card": "sometimes"}, CONFIG)
    assert "train" in str(raised.value)
    assert "card='sometimes' is neither on nor off. Give card=True or card=False." \
        in str(raised.value)
    with pytest.raises(TorchDistributedConfigError,
                       match="METAFLOW_TORCH_DISTRIBUTED_CARD='2' is neither on nor off. Give "
                             "METAFLOW_TORCH_DISTRIBUTED_CARD=1 or 0."):
        resolve("train", {}, dict(CONFIG, CARD="2"))
