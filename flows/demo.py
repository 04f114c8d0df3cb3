"""``invoke demo``: the main job end to end on a cluster the caller brings
up (tasks.py brings up the simulated one): prepare, verify communication,
deploy, ask the model the release's own chat question and show its answer,
then the status and the commands for the next steps."""

from __future__ import annotations

from typing import Callable

from rich.console import Console
from rich.markup import escape

from flows import app, status, verify
from flows import deploy as deploy_flow
from flows.binding import load
from flows.probes import chat_message, fetch, split_think
from flows.releases import current_plan
from llmdeploy.errors import LlmdeployError
from llmdeploy.deployment import Deployment
from llmdeploy.runner import Step
from roles.status import current_script, parse_status


def _answer(dep: Deployment, con: Console) -> None:
    """The chat readiness probe of the release now current (its plan.json on the nodes), asked once, with its answer shown."""
    cluster = dep.cluster
    with dep.runner() as runner:
        res = runner.run(Step(name="read current release", build=lambda n: current_script(cluster)))
        plan = current_plan(cluster, {h: (parse_status(r.stdout) if not r.failed else None) for h, r in res.items()})
        chat = next((p for p in (plan.ready if plan else []) if p.method == "POST" and p.body and p.body.get("messages")), None)
        if chat is None:
            raise LlmdeployError(f"{cluster.name}: the current release has no chat readiness check to ask")
        got = fetch(runner, cluster.node(chat.host), chat, cluster.deploy.request_timeout_s)
    if not got.ok:
        raise LlmdeployError(f"{cluster.name}: the model gave no answer: {got.problem}")
    code, body = got.status, got.body
    reasoning, content = chat_message(body)
    reasoning, content = split_think(content) or (reasoning, content)
    assert chat.body is not None  # chosen for the messages of its body
    question = chat.body["messages"][0]["content"]
    con.print(f"[bold]{escape(question)}[/] (POST {chat.path}: {code})", soft_wrap=True)
    con.print(f"[dim]<think>{escape(reasoning.strip())}</think>[/]", soft_wrap=True)
    con.print(escape(content.strip()), soft_wrap=True)


def demo(cluster_name: str, bring_up: Callable[[], int], take_down: str) -> int:
    """``bring_up()`` makes the cluster (its exit status); ``take_down``: the
    command that removes it again, said when the demo stops early."""
    con = Console()
    dep = load(cluster_name)
    steps = [
        ("sim.up", bring_up),
        ("prepare", lambda: app.prepare(cluster_name, run_checks=True)),
        ("verify-comm", lambda: verify.run(dep, con, False, False)),
        ("deploy", lambda: deploy_flow.deploy(dep, con, False, False, True, False, "demo", 0, False,
                                      lambda name, quiet: 0, lambda *a: 1)),
    ]
    for name, fn in steps:
        con.rule(f"[bold]invoke {name} --cluster {cluster_name}")
        code = fn()
        if code:
            con.print(f"[bold red]the demo stopped at {name}[/] (exit {code}); the cluster is still up: {take_down}")
            return code
    con.rule("[bold]the model's answer")
    _answer(dep, con)
    con.rule(f"[bold]invoke status --cluster {cluster_name}")
    code = status.status(dep, con, False, False)
    con.print("\nnext steps:")
    for line in (f"invoke releases --cluster {cluster_name}", f"invoke rollback --cluster {cluster_name}    # after a second deploy",
                 f"invoke stop --cluster {cluster_name}", take_down):
        con.print(f"  {line}", soft_wrap=True)
    return code
