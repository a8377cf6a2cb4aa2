"""``modelyard retention show|set|clear|preview`` against a live server, and how ``preview`` prints a plan.

The server is ``modelyard serve`` on the embedded default (this package's ``live`` fixture); versions are
aged by moving their ``created_at`` back in its SQLite database, as the days would.
"""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
from collections.abc import Callable

import onnx
import pytest

from modelyard.client import Client, RetentionPlan
from modelyard.client.commands import _retention_plan_lines
from tests.support.embedded import LiveServer
from tests.support.onnx_models import add_model

Run = Callable[..., subprocess.CompletedProcess[str]]


def runner(live: LiveServer, token: str) -> Run:
    def run(*args: str, expect: int = 0) -> subprocess.CompletedProcess[str]:
        done = live.run(*args, "--token", token)
        assert done.returncode == expect, f"{args}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
        return done

    return run


@pytest.fixture(scope="module")
def people(live: LiveServer) -> tuple[str, str, str]:
    """The tokens of a maintainer (meg), an admin (adam) and a viewer (val)."""
    return (
        live.createtoken("meg", "maintainer"),
        live.createtoken("adam", "admin"),
        live.createtoken("val", "viewer"),
    )


def versions(live: LiveServer, token: str, name: str, count: int) -> None:
    owner = Client(live.url, token)
    folder = live.folder / name
    folder.mkdir()
    for number in range(1, count + 1):
        onnx.save(add_model(bias=float(number)), folder / f"v{number}.onnx")
        assert owner.wait_ready(name, owner.push(name, folder / f"v{number}.onnx").version).version == number


def age(live: LiveServer, name: str, days: int, *numbers: int) -> None:
    marks = ",".join("?" * len(numbers))
    with sqlite3.connect(live.folder / "data" / "modelyard.sqlite3") as db:
        db.execute(
            f"UPDATE registry_modelversion SET created_at = datetime(created_at, '-{days} days') "
            f"WHERE version IN ({marks}) AND model_id = (SELECT id FROM registry_registeredmodel WHERE name = ?)",
            (*numbers, name),
        )


def created(live: LiveServer, name: str, number: int) -> str:
    """The version's creation as the commands print it (minutes, UTC)."""
    with sqlite3.connect(live.folder / "data" / "modelyard.sqlite3") as db:
        (moment,) = db.execute(
            "SELECT v.created_at FROM registry_modelversion v JOIN registry_registeredmodel m ON m.id = v.model_id "
            "WHERE m.name = ? AND v.version = ?",
            (name, number),
        ).fetchone()
    return f"{moment[:16]} UTC"


AS_OF = re.compile(r" as of \d{4}-\d\d-\d\d \d\d:\d\d:\d\d:$")


def test_set_show_preview_and_clear_a_rule(live, people):
    meg, adam, val = people
    versions(live, meg, "tidy", 4)
    run, reader = runner(live, meg), runner(live, val)

    none = reader("retention", "show", "tidy")
    assert (none.stdout, none.stderr) == (
        "'tidy' has no retention rule: no version is archived or deleted by one.\n",
        "",
    )
    assert json.loads(reader("retention", "show", "tidy", "--json").stdout) == {"model": "tidy", "rule": None}

    done = run("retention", "set", "tidy", "--keep-last", "2", "--keep-days", "30")
    assert (done.stdout, done.stderr) == (
        "Retention of 'tidy' set: keep the 2 newest versions and any created, aliased or served within 30 days; "
        "archive the others.\n"
        "What the next run would do: modelyard retention preview tidy\n",
        "",
    )
    assert reader("retention", "show", "tidy").stdout == (
        "Retention of 'tidy': keep the 2 newest versions and any created, aliased or served within 30 days; "
        "archive the others.\n"
    )
    rule = {"keep_last": 2, "keep_days": 30, "then": "archive"}
    assert json.loads(reader("retention", "show", "tidy", "--json").stdout) == {"model": "tidy", "rule": rule}

    first, *rest = reader("retention", "preview", "tidy").stdout.splitlines()
    assert first.startswith("Retention of 'tidy' (keep_last 2, keep_days 30, then archive) as of ")
    assert AS_OF.search(first)
    assert rest == ["  nothing to archive"]

    age(live, "tidy", 40, 1, 2)
    adam_client = Client(live.url, adam)
    adam_client.request("POST", "/api/v1/models/tidy/versions/1/hold", json_body={"reason": "litigation"})
    plan = json.loads(reader("retention", "preview", "tidy", "--json").stdout)
    assert (plan["model"], plan["rule"]) == ("tidy", rule)
    assert [(a["version"], a["action"]) for a in plan["actions"]] == [(2, "archive")]
    assert [(k["version"], k["action"]) for k in plan["kept"]] == [(1, "keep")]
    first, *rest = reader("retention", "preview", "tidy").stdout.splitlines()
    assert AS_OF.search(first)
    assert rest == [
        f"  archive version 2: not among the 2 newest versions, created {created(live, 'tidy', 2)} (more than 30 days "
        "ago), and neither aliased nor served since then",
        "Kept, though outside both windows:",
        f"  version 1: {plan['kept'][0]['why']}",
    ]
    assert plan["kept"][0]["why"].startswith("it is under legal hold (by adam since ")

    # A rule tried before it is saved: the saved one stays.
    tried = json.loads(reader("retention", "preview", "tidy", "--keep-last", "1", "--keep-days", "30", "--json").stdout)
    assert tried["rule"] == {"keep_last": 1, "keep_days": 30, "then": "archive"}
    assert [a["version"] for a in tried["actions"]] == [2]
    assert json.loads(reader("retention", "show", "tidy", "--json").stdout)["rule"] == rule

    cleared = run("retention", "clear", "tidy")
    assert (cleared.stdout, cleared.stderr) == ("Removed the retention rule of 'tidy'.\n", "")
    assert json.loads(reader("retention", "show", "tidy", "--json").stdout)["rule"] is None
    refused = reader("retention", "preview", "tidy", expect=1)
    assert refused.stderr == (
        "modelyard retention: model 'tidy' has no retention rule; set one, or send a rule to preview\n"
    )


def test_refusals_name_what_is_wrong(live, people):
    meg, adam, val = people
    versions(live, meg, "strict", 1)
    run, reader = runner(live, meg), runner(live, val)

    bad = run("retention", "set", "strict", "--keep-last", "0", "--keep-days", "30", expect=1)
    assert (bad.stdout, bad.stderr) == ("", "modelyard retention: keep_last must be a whole number from 1 to 10000\n")
    as_json = run("retention", "set", "strict", "--keep-last", "1", "--keep-days", "40000", "--json", expect=1)
    assert json.loads(as_json.stdout) == {
        "error": "keep_days must be a whole number from 1 to 36500",
        "detail": {"field": "keep_days"},
        "status": 400,
    }
    denied = reader("retention", "set", "strict", "--keep-last", "1", "--keep-days", "30", expect=1)
    assert denied.stderr == "modelyard retention: setting a model's retention rule needs the maintainer or admin role\n"
    deletes = run("retention", "set", "strict", "--keep-last", "1", "--keep-days", "30", "--then", "delete", expect=1)
    assert deletes.stderr == "modelyard retention: a retention rule that deletes versions needs the admin role\n"
    assert json.loads(reader("retention", "show", "strict", "--json").stdout)["rule"] is None

    done = runner(live, adam)("retention", "set", "strict", "--keep-last", "1", "--keep-days", "30", "--then", "delete")
    assert done.stdout.startswith(
        "Retention of 'strict' set: keep the newest version and any created, aliased or served within 30 days; "
        "delete the others.\n"
    )
    usage = live.run("retention", "set", "strict", "--keep-last", "1", "--token", meg)
    assert usage.returncode == 2 and "the following arguments are required: --keep-days" in usage.stderr


def test_a_plan_prints_each_action_then_what_is_kept():
    plan = RetentionPlan.from_json(
        {
            "model": "m",
            "rule": {"keep_last": 1, "keep_days": 7, "then": "delete"},
            "as_of": "2026-12-01T10:00:00.5+00:00",
            "actions": [
                {"version": 1, "action": "delete", "why": "old\nand unused"},
                {"version": 3, "action": "delete", "why": "old"},
            ],
            "kept": [{"version": 2, "action": "keep", "why": "alias 'staging' points at it"}],
        }
    )

    assert _retention_plan_lines(plan) == [
        "Retention of 'm' (keep_last 1, keep_days 7, then delete) as of 2026-12-01 10:00:00:",
        "  delete version 1: old and unused",
        "  delete version 3: old",
        "Kept, though outside both windows:",
        "  version 2: alias 'staging' points at it",
    ]
