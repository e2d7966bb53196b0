"""The gang's card, end to end: a 2 nodes x 2 gang (no @card asked for) whose rank 3 is
SIGKILLed in its first attempt and succeeds on retry. One run gives both of the gang's cards: the
failed attempt's (root cause, who was stopped) and the retry's (success, every attempt). Then the
failed card is rendered in a real browser (headless Chromium) to a PNG. Last, the user's own
card beside the gang's: exactly as the user built it."""

import json
import re
import shutil
import subprocess

import pytest

from tests.support import FlowRunner, card_charts, card_json

GANG = {"TD_NODES": 2, "TD_NPROC": 2}
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def card_run(tmp_path_factory):
    """The run, and the data of each of its train task's cards, oldest attempt first."""
    runner = FlowRunner(tmp_path_factory.mktemp("card"))
    res = runner.run("gang_flow.py", "--with", "retry:times=1,minutes_between_retries=0",
                     env=dict(GANG, TD_FAIL_RANK=3, TD_FAIL_WHEN="in_collective",
                              TD_FAIL_HOW="sigkill", TD_FAIL_ATTEMPT=0))
    assert res.returncode == 0, res
    run_id = re.search(r"run-id (\d+)", res.output).group(1)
    task = re.search(r"%s/train/(\d+)" % run_id, res.output).group(1)
    pathspec = "%s/train/%s" % (run_id, task)
    listed = runner.cli("gang_flow.py", "card", "list", pathspec)
    assert listed.returncode == 0, listed
    cards = []
    for card_id, card_type, card_hash in re.findall(
            r"Card Id: (\w+)\s+Card Type: (\w+)\s+Card Hash: (\w+)", listed.output):
        out = runner.root / ("card-%s.html" % card_hash)
        got = runner.cli("gang_flow.py", "card", "get", pathspec, "--hash", card_hash, str(out))
        assert got.returncode == 0, got
        html = out.read_text()
        cards.append(dict(path=out, html=html, data=card_json(html),
                          type=(card_id, card_type)))
    runner.assert_no_leftovers()
    return dict(cards=sorted(cards, key=lambda c: "attempt 1" in c["data"]), root=runner.root)


def timeline(card):
    bars, markers, charts = card_charts(card["data"])
    return bars, markers, charts


def test_both_attempts_have_a_card(card_run):
    cards = card_run["cards"]
    assert len(cards) == 2  # the gang's own, one per attempt, with no @card on the step
    assert all(c["type"] == ("torch_distributed", "torch_distributed") for c in cards)
    assert "Gang of step train, attempt 0" in cards[0]["data"]
    assert "Gang of step train, attempt 1" in cards[1]["data"]


def test_failed_attempt_card_names_the_root_cause(card_run):
    failed = card_run["cards"][0]["data"]
    assert "### Outcome: failed" in failed
    assert "**Root cause:** rank 3 (node 1, local rank 1) was killed by SIGKILL." in failed
    # the killed rank's last lines, as it wrote them just before the SIGKILL
    assert "last words of rank 3" in failed
    assert "rank 3 failing now (in_collective, sigkill)" in failed
    assert "Stopped because of it" in failed
    bars, markers, _ = timeline(card_run["cards"][0])
    assert {b["rank"] for b in bars} == {0, 1, 2, 3}
    states = {b["rank"]: b["state"] for b in bars}
    assert states[3] == "failed"
    assert {states[r] for r in (0, 1, 2)} <= {"stopped", "peer failed"}
    assert {"abort", "nodes joined", "gang ended"} <= {m["name"] for m in markers}


def test_retry_card_shows_success_every_rank_and_every_attempt(card_run):
    card = card_run["cards"][1]
    assert "### Outcome: success" in card["data"]
    assert "### Attempts" in card["data"]
    assert "rank 3 (node 1, local rank 1) was killed by SIGKILL." in card["data"]  # attempt 0
    bars, markers, charts = timeline(card)
    # every rank of both nodes, from its start through init_process_group to its end
    assert {(b["rank"], b["state"]) for b in bars} == {
        (r, s) for r in range(4) for s in ("starting", "finished")}
    assert {b["node"] for b in bars if b["rank"] in (2, 3)} == {1}
    assert {"nodes joined", "rendezvous done", "gang ended"} <= {m["name"] for m in markers}
    scalars = next(c for c in charts if "samples_per_s" in str(c.get("title")))
    assert sorted(v["value"] for v in scalars["data"]["values"]) == [100.0, 101.0, 102.0, 103.0]
    for rank in range(4):
        assert "hello from rank %d" % rank in card["data"]
        assert "stderr of rank %d" % rank in card["data"]


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (Debian: apt-get "
                    "install chromium; .ci/run installs it)")
def test_failed_card_renders_in_a_browser(card_run, tmp_path):
    """Headless Chromium loads the card with no network: no console error, and vega-embed drew
    the timeline (an <svg> or <canvas> inside the chart's element)."""
    page = card_run["cards"][0]["path"]
    png = tmp_path / "card.png"
    args = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--user-data-dir=%s" % (tmp_path / "profile"), "--window-size=1200,2200",
            "--virtual-time-budget=8000", "--enable-logging=stderr", "--v=0"]
    dom = subprocess.run(args + ["--dump-dom", page.as_uri()], capture_output=True, text=True,
                         timeout=120)
    shot = subprocess.run(args + ["--screenshot=%s" % png, page.as_uri()], capture_output=True,
                          text=True, timeout=120)
    assert dom.returncode == 0 and shot.returncode == 0, dom.stderr[-3000:] + shot.stderr[-3000:]
    console = [line for line in (dom.stderr + shot.stderr).splitlines()
               if "CONSOLE" in line or "Uncaught" in line]
    assert not [line for line in console if "error" in line.lower()], console
    charts = re.findall(r'<div[^>]*class="[^"]*vega-embed[^"]*"[^>]*>.*?</div>', dom.stdout,
                        re.S)
    assert charts, dom.stdout[-3000:]
    assert re.search(r"vega-embed.*?<(svg|canvas)", dom.stdout, re.S), dom.stdout[-3000:]
    assert "Root cause" in dom.stdout
    assert png.stat().st_size > 10000
    # the phases' labels as drawn: apart on the failed card and on the retry's
    _assert_labels_apart(dom.stdout)
    retry = subprocess.run(args + ["--dump-dom", card_run["cards"][1]["path"].as_uri()],
                           capture_output=True, text=True, timeout=120)
    assert retry.returncode == 0, retry.stderr[-3000:]
    _assert_labels_apart(retry.stdout)


# Vertical labels of 10 px type: their left edges at least this far apart do not overlap.
LABEL_APART_PX = 12


def _assert_labels_apart(dom):
    """The timeline's phase labels, as vega drew them into the page's SVG, do not overlap."""
    group = re.search(r'<g class="mark-text role-mark layer_2_marks".*?</g>', dom, re.S)
    assert group, dom[-3000:]
    drawn = re.findall(r'transform="translate\(([\d.]+),[^"]*rotate\(270\)[^"]*"[^>]*>([^<]+)<',
                       group.group(0))
    assert any("gang ended" in name for _, name in drawn) and len(drawn) >= 2, drawn
    xs = sorted(float(x) for x, _ in drawn)
    assert all(b - a >= LABEL_APART_PX for a, b in zip(xs, xs[1:])), drawn


# -- the user's own cards beside the gang's -----------------------------------------------------

def _cards(runner, flow, pathspec):
    """{(card id, card type): the card's data as JSON} of every card of task `pathspec`."""
    listed = runner.cli(flow, "card", "list", pathspec)
    assert listed.returncode == 0, listed
    found = {}
    for card_id, card_type, card_hash in re.findall(
            r"Card Id: (\w+)\s+Card Type: (\w+)\s+Card Hash: (\w+)", listed.output):
        out = runner.root / ("card-%s.html" % card_hash)
        got = runner.cli(flow, "card", "get", pathspec, "--hash", card_hash, str(out))
        assert got.returncode == 0, got
        found[(card_id, card_type)] = json.loads(card_json(out.read_text()))
    return found


def _train_task(res):
    run_id = re.search(r"run-id (\d+)", res.output).group(1)
    return "%s/train/%s" % (run_id, re.search(r"%s/train/(\d+)" % run_id, res.output).group(1))


def _contents(card):
    """The components on the page of a blank card, without their random ids."""
    def bare(node):
        if isinstance(node, dict):
            return {k: bare(v) for k, v in node.items() if k != "id"}
        return [bare(v) for v in node] if isinstance(node, list) else node

    (page,) = card["components"]
    return bare(page["contents"])


@pytest.mark.parametrize("gang_card, method", [("on", "fork"), ("off", "fork"), ("on", "exec")])
def test_the_users_own_card_is_exactly_as_built(tmp_path, gang_card, method):
    """Metaflow's DefaultEditableCardTest, on a gang: rank 0's current.card.append lands in the
    user's editable card, which holds that and nothing of the gang's; the gang's card is beside
    it unless METAFLOW_TORCH_DISTRIBUTED_CARD=0 (it wrote into the user's card before). Rank 0
    forked from the task, or exec'd (a spin-step of the task), hands the component back."""
    runner = FlowRunner(tmp_path)
    env = {"METAFLOW_TORCH_DISTRIBUTED_START_METHOD": method}
    if gang_card == "off":
        env["METAFLOW_TORCH_DISTRIBUTED_CARD"] = "0"
    res = runner.run("card_flow.py", "--with", "card:type=blank", env=env)
    assert res.returncode == 0, res
    cards = _cards(runner, "card_flow.py", _train_task(res))
    # what Metaflow makes of the one Markdown("79") the user appended, and nothing else
    assert _contents(cards[("None", "blank")]) == [
        {"type": "section", "contents": [{"type": "markdown", "source": "\n79"}]}]
    if gang_card == "on":
        assert set(cards) == {("None", "blank"), ("torch_distributed", "torch_distributed")}
        gang = json.dumps(cards[("torch_distributed", "torch_distributed")])
        assert "Gang of step train, attempt 0" in gang and "### Outcome: success" in gang
        assert '"79"' not in gang
    else:
        assert set(cards) == {("None", "blank")}


def test_without_a_card_of_the_users_the_gangs_card_takes_no_component(tmp_path):
    """The gang's card is not editable: with no card of the user's, current.card.append goes
    nowhere, as on a plain step, and the gang's card shows only the gang."""
    runner = FlowRunner(tmp_path)
    res = runner.run("card_flow.py")
    assert res.returncode == 0, res
    cards = _cards(runner, "card_flow.py", _train_task(res))
    assert set(cards) == {("torch_distributed", "torch_distributed")}
    gang = json.dumps(cards[("torch_distributed", "torch_distributed")])
    assert "Gang of step train, attempt 0" in gang and '"79"' not in gang
    # and only the gang step gets one
    run_id = _train_task(res).split("/")[0]
    assert "Card not found" in runner.cli("card_flow.py", "card", "list",
                                          "%s/start/1" % run_id).output


def test_the_task_draws_the_gangs_card_itself(tmp_path):
    """No `card create` process draws the gang's card (one ran at the end of every gang task,
    about 0.5 s of its time): with a `card create` that cannot run, the gang's card of the
    run is there all the same when the run is over, and complete."""
    runner = FlowRunner(tmp_path)
    res = runner.run("card_flow.py", env={"TD_CARD_CREATE_FAILS": "1"})
    assert res.returncode == 0, res
    assert "Card render failed" not in res.output
    cards = _cards(runner, "card_flow.py", _train_task(res))
    assert set(cards) == {("torch_distributed", "torch_distributed")}
    gang = json.dumps(cards[("torch_distributed", "torch_distributed")])
    assert "Gang of step train, attempt 0" in gang and "### Outcome: success" in gang
    assert "### Timeline" in gang and "### Last lines of each rank" in gang
