"""Node planning rules of the emulator, as tables (no processes, no servers)."""

from __future__ import annotations

import pytest

from .batch_spec import (
    BatchClientError,
    NodeLaunch,
    Placement,
    injected_environment,
    parse_target_nodes,
    plan_nodes,
)


@pytest.mark.parametrize(
    "spec, num_nodes, indices",
    [
        ("0:0", 4, [0]),
        ("1:3", 4, [1, 2, 3]),
        ("1:", 4, [1, 2, 3]),
        (":2", 4, [0, 1, 2]),
        (":", 3, [0, 1, 2]),
    ],
)
def test_target_nodes(spec, num_nodes, indices):
    assert list(parse_target_nodes(spec).indices(num_nodes)) == indices


@pytest.mark.parametrize("spec", ["1", "a:b", "3:1", "", "0:1:2"])
def test_invalid_target_nodes(spec):
    with pytest.raises(BatchClientError):
        parse_target_nodes(spec)


def container(command: str, **environment: str) -> dict:
    return {
        "image": "python:3.11",
        "command": [command],
        "environment": [{"name": k, "value": v} for k, v in environment.items()],
    }


def multinode(num_nodes: int, ranges: dict) -> dict:
    return {
        "jobDefinitionName": "gang",
        "type": "multinode",
        "nodeProperties": {
            "numNodes": num_nodes,
            "mainNode": 0,
            "nodeRangeProperties": [
                {"targetNodes": target, "container": c} for target, c in ranges.items()
            ],
        },
    }


def test_narrower_range_wins_and_overrides_apply_in_order():
    definition = multinode(4, {"0:3": container("wide", A="wide"), "2:2": container("narrow")})
    submission = {
        "nodeOverrides": {
            "nodePropertyOverrides": [
                {
                    "targetNodes": "1:",
                    "containerOverrides": {"environment": [{"name": "A", "value": "first"}]},
                },
                {
                    "targetNodes": "3:3",
                    "containerOverrides": {"environment": [{"name": "A", "value": "last"}]},
                },
            ]
        }
    }
    launches = plan_nodes(definition, submission)
    assert [launch.command for launch in launches] == [["wide"], ["wide"], ["narrow"], ["wide"]]
    assert [launch.environment.get("A") for launch in launches] == [
        "wide",
        "first",
        "first",
        "last",
    ]
    assert [launch.is_main for launch in launches] == [True, False, False, False]


def test_num_nodes_override_grows_the_open_range():
    definition = multinode(2, {"0:0": container("main"), "1:": container("child")})
    launches = plan_nodes(definition, {"nodeOverrides": {"numNodes": 4}})
    assert [launch.command for launch in launches] == [["main"]] + [["child"]] * 3


def test_container_job_merges_overrides():
    definition = {
        "jobDefinitionName": "single",
        "type": "container",
        "containerProperties": container("echo", A="1", B="2"),
    }
    [launch] = plan_nodes(
        definition,
        {"containerOverrides": {"command": ["true"], "environment": [{"name": "B", "value": "3"}]}},
    )
    assert launch.command == ["true"]
    assert launch.environment == {"A": "1", "B": "3"}


PLACEMENT = Placement(
    job_id="j",
    queue_name="q",
    compute_environment="ce",
    attempt=1,
    num_nodes=3,
    main_node=0,
    main_node_address="127.0.0.1",
)


@pytest.mark.parametrize(
    "placement, launch, expected",
    [
        (
            PLACEMENT,
            NodeLaunch(0, True, {}),
            {"AWS_BATCH_JOB_ID": "j#0", "AWS_BATCH_JOB_NODE_INDEX": "0"},
        ),
        (
            PLACEMENT,
            NodeLaunch(2, False, {}),
            {
                "AWS_BATCH_JOB_ID": "j#2",
                "AWS_BATCH_JOB_NODE_INDEX": "2",
                "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS": "127.0.0.1",
            },
        ),
    ],
)
def test_node_environment(placement, launch, expected):
    env = injected_environment(placement, launch)
    assert {k: env[k] for k in expected} == expected
    assert env["AWS_BATCH_JOB_NUM_NODES"] == "3"
    assert ("AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS" in env) == (not launch.is_main)


def test_single_node_environment_has_no_node_layout():
    single = Placement("j", "q", "ce", 1, None, None, "127.0.0.1")
    env = injected_environment(single, NodeLaunch(0, True, {}))
    assert env["AWS_BATCH_JOB_ID"] == "j"
    assert not any(name.startswith("AWS_BATCH_JOB_NODE") for name in env)
    assert not any("MAIN_NODE" in name for name in env)
