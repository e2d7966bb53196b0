"""The gang's card while the gang runs, end to end: a 2 nodes x 2 gang that trains for about
30 s, every rank calling current.torch_distributed.progress and record, watched through
Metaflow's own `card server` as a user watches it: the page the server serves changes while the
step runs (its reload token and its data update's change, the percent done grows), and once
the task ended the server serves the final card, whose token tells the viewer to stop. Then a
gang with the live card off: only the final card, no data update."""

import json
import re
import socket
import time
import urllib.error
import urllib.request

from tests.support import FlowRunner, card_json

FLOW = "live_card_flow.py"
LIVE = {"METAFLOW_TORCH_DISTRIBUTED_CARD_REFRESH": 2,
        # a probe every second (hang_timeout / 20), so each draw has fresh samples
        "METAFLOW_TORCH_DISTRIBUTED_HANG_TIMEOUT": 20,
        "TD_STEPS": 100, "TD_STEP_S": 0.3}
# Seconds the run may take (it trains for about 30 s), and the card server to answer.
RUN_TIMEOUT = 240
SERVER_TIMEOUT = 60


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(port, path):
    """(status, body) of GET `path` on the card server."""
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d/%s" % (port, path), timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as ex:
        return ex.code, ex.read().decode()


def _page(html):
    """(reload token, the card's data as a dict) of a card page."""
    token = re.search(r'METAFLOW_RELOAD_TOKEN = "([^"]*)"', html).group(1)
    return token, json.loads(card_json(html))


def _components(data):
    """Every component of a card's data, depth first."""
    found = []

    def walk(node):
        if isinstance(node, dict):
            if "type" in node and node.get("type") != "page":
                found.append(node)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(data["components"])
    return found


def _percent(data):
    """Rank 0's percent done as the page says it, or None."""
    for c in _components(data):
        found = re.search(r"\*\*Progress:\*\* (\d+)% \(step (\d+) of 100, rank 0\)",
                          c.get("source") or "")
        if found:
            return int(found.group(1))
    return None


def _live_table(data):
    return next(c for c in _components(data) if c["type"] == "table"
                and c["columns"][:3] == ["Rank", "Node", "Doing"])


def test_card_server_shows_the_gang_live_then_final(tmp_path):
    runner = FlowRunner(tmp_path)
    run = runner.popen(FLOW, "run", env=LIVE)
    server = None
    try:
        latest = tmp_path / ".metaflow" / "LiveCardFlow" / "latest_run"
        deadline = time.monotonic() + SERVER_TIMEOUT
        while not (latest.exists() and latest.read_text().strip()):
            assert run.poll() is None and time.monotonic() < deadline, "the run did not start"
            time.sleep(0.2)
        run_id = latest.read_text().strip()
        port = _free_port()
        server = runner.popen(FLOW, "card", "server", "--run-id", run_id, "--port", str(port),
                              "--poll-interval", "1")
        # the train task's card, as the viewer lists it
        card = None
        while card is None:
            assert run.poll() is None, "the run ended before card server listed a card of train"
            assert time.monotonic() < deadline + SERVER_TIMEOUT, "card server listed no card"
            try:
                status, body = _get(port, "runinfo")
            except OSError:  # not listening yet
                status = None
            if status == 200:
                card = next((c["card"] for c in json.loads(body)["cards"]
                             if "/train/" in c["task"]
                             and c["card_object"]["type"] == "torch_distributed"), None)
            time.sleep(0.5)
        # what the viewer polls, while the step runs: the data update, then the page
        seen = []  # (data update's token, page's token, percent) per change
        while run.poll() is None:
            status, body = _get(port, "data/" + card)
            status_page, html = _get(port, "card/" + card)
            if status == 200 and status_page == 200 and run.poll() is None:
                token, data = _page(html)
                update = json.loads(body)["payload"]["reload_token"]
                if not seen or seen[-1][1] != token:
                    seen.append((update, token, _percent(data), data))
            time.sleep(0.5)
        out, err = run.communicate(timeout=RUN_TIMEOUT)
        assert run.returncode == 0, out[-3000:] + err[-3000:]
        live = [s for s in seen if s[1].startswith("live-")]
        assert len(live) >= 3, [s[:3] for s in seen]
        # each draw has a token of its own, and the data update the viewer reads names it
        assert all(update.startswith("live-") for update, _, _, _ in live), [s[:3] for s in live]
        percents = [p for _, _, p, _ in live if p is not None]
        assert len(percents) >= 3 and percents == sorted(percents) and percents[-1] > percents[0], \
            [s[:3] for s in live]
        data = live[-1][3]
        assert any("running" in (c.get("source") or "") for c in _components(data))
        assert any("left at" in (c.get("source") or "") for c in _components(data)), data
        table = _live_table(data)
        assert [row[0] for row in table["data"]] == ["0", "1", "2", "3"], table
        for row in table["data"]:
            rank_step = re.fullmatch(r"(\d+) of 100", row[5])
            # every rank, node 1's through the gang's store, said its step and a loss
            assert rank_step and int(rank_step.group(1)) > 0, row
            assert float(row[3]) > 0 and float(row[6]) > 0, row
            assert row[7].startswith("loss="), row
        assert any(row[8].startswith("step ") for row in table["data"] if row[0] == "0"), table
        charts = [c["spec"] for c in _components(data) if c["type"] == "vegaChart"]
        loss = next(c for c in charts if c["title"] == "loss (rank 0, so far)")
        assert len(loss["data"]["values"]) >= 5, loss
        # the task ended: the final card, and the update that stops the viewer
        status, body = _get(port, "data/" + card)
        assert status == 200 and json.loads(body)["payload"]["reload_token"] == "final", body
        assert json.loads(body)["is_complete"] is True
        status, html = _get(port, "card/" + card)
        token, final = _page(html)
        assert status == 200 and token == "final"
        sources = [c.get("source") or "" for c in _components(final)]
        assert "## Gang of step train, attempt 0" in sources, sources
        assert "### Outcome: success\n\nEvery rank finished its step body." in sources
        assert not any(s.startswith("### Now") for s in sources)
    finally:
        for proc in (run, server):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.communicate()
    runner.assert_no_leftovers()


def test_without_the_live_card_only_the_final_card_is_saved(tmp_path):
    runner = FlowRunner(tmp_path)
    res = runner.run(FLOW, env=dict(LIVE, METAFLOW_TORCH_DISTRIBUTED_CARD_REFRESH=0,
                                    TD_STEPS=20, TD_STEP_S=0.2))
    assert res.returncode == 0, res
    cards = tmp_path / ".metaflow" / "mf.cards" / "LiveCardFlow"
    [page] = list(cards.glob("runs/*/steps/train/tasks/*/cards/torch_distributed-*.html"))
    assert _page(page.read_text())[0] == "final"
    assert not list(cards.glob("runs/*/steps/train/tasks/*/runtime/*")), "a data update"
