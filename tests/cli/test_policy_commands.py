"""``modelyard policy show|set|check`` against a live server, and how ``show`` prints a policy.

The server is ``modelyard serve`` on the embedded default (this package's ``live`` fixture).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable

import onnx
import pytest

from modelyard.client import Client, Policy, Promotion
from modelyard.client.commands import _policy_lines
from tests.support.embedded import LiveServer
from tests.support.onnx_models import add_model

SIGNATURE = "the candidate's inputs or outputs are not compatible with the current version's"
TAGGED = {"name": "tagged", "expr": '"validated" in candidate.tags', "message": "not validated"}
SECOND = {
    "name": "second-approver",
    "expr": 'approvals.exists(a, "approver" in a.roles && a.user != requester.user)',
    "message": "needs an approver other than the requester",
}
SMALL = {
    "name": "small",
    "expr": "current == null ||\n  candidate.size_bytes <= current.size_bytes * 2 // at most double",
    "message": "more than twice the size",
}

Run = Callable[..., subprocess.CompletedProcess[str]]


def runner(live: LiveServer, token: str) -> Run:
    def run(*args: str, expect: int = 0, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        done = live.run(*args, "--token", token, stdin=stdin)
        assert done.returncode == expect, f"{args}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
        return done

    return run


@pytest.fixture(scope="module")
def people(live: LiveServer) -> tuple[str, str]:
    """The tokens of a maintainer (pat) and an approver (ann)."""
    return live.createtoken("pat", "maintainer"), live.createtoken("ann", "approver")


def two_versions(live: LiveServer, people: tuple[str, str], name: str) -> None:
    """``name`` v1 and v2 (same signature), v1 on ``staging`` (unprotected) and on ``production`` (protected)."""
    owner, approver = Client(live.url, people[0]), Client(live.url, people[1])
    folder = live.folder / name
    folder.mkdir()
    for number, bias in ((1, 1.0), (2, 2.0)):
        onnx.save(add_model(bias=bias), folder / f"v{number}.onnx")
        assert owner.wait_ready(name, owner.push(name, folder / f"v{number}.onnx").version).version == number
    assert owner.promote(name, "staging", 1) is not None
    request = owner.promote(name, "production", 1, reason="launch")
    assert isinstance(request, Promotion)
    approver.approve(request.id, reason="ok")


def write(live: LiveServer, name: str, data: object) -> str:
    """A file in the commands' folder holding ``data`` as JSON (a str as it is); its name."""
    (live.folder / name).write_text(data if isinstance(data, str) else json.dumps(data))
    return name


def moment(text: str | None) -> str:
    assert text
    return text[:19].replace("T", " ")


def test_show_a_builtin_policy_then_set_one_from_a_file_and_from_stdin(live, people):
    two_versions(live, people, "sets")
    run = runner(live, people[0])

    fresh = run("policy", "show", "sets", "staging")
    assert (fresh.stdout, fresh.stderr) == (
        "Policy 0 of 'staging' of 'sets': built-in, from the alias's settings (no policy written yet)\n"
        "  compatible-signature: size(signature.breaking) == 0\n"
        f"    message: {SIGNATURE}\n",
        "",
    )
    assert json.loads(run("policy", "show", "sets", "staging", "--json").stdout) == {
        "model": "sets",
        "alias": "staging",
        "number": 0,
        "builtin": True,
        "rules": [
            {
                "name": "compatible-signature",
                "expr": "size(signature.breaking) == 0",
                "message": SIGNATURE,
                "builtin": True,
            }
        ],
        "created_by": None,
        "created_at": None,
        "reason": "",
        "pending": None,
    }

    # A file holding a list of rules.
    rules = write(live, "rules.json", [TAGGED, SMALL])
    done = run("policy", "set", "sets", "staging", rules, "--reason", "release checklist")
    assert (done.stdout, done.stderr) == ("Policy 1 of 'staging' of 'sets' is in force (2 rule(s)).\n", "")
    written = json.loads(run("policy", "show", "sets", "staging", "--json").stdout)
    assert run("policy", "show", "sets", "staging").stdout == (
        f"Policy 1 of 'staging' of 'sets': set by pat at {moment(written['created_at'])} (release checklist)\n"
        '  tagged: "validated" in candidate.tags\n'
        "    message: not validated\n"
        "  small: current == null ||\n"
        "           candidate.size_bytes <= current.size_bytes * 2 // at most double\n"
        "    message: more than twice the size\n"
    )

    # stdin, holding {"rules": [...]}: what `policy show --json` prints goes back as it is.
    done = run("policy", "set", "sets", "staging", "-", stdin=json.dumps(written))
    assert done.stdout == "Policy 2 of 'staging' of 'sets' is in force (2 rule(s)).\n"
    again = json.loads(run("policy", "show", "sets", "staging", "--json").stdout)
    assert (again["number"], again["rules"], again["reason"]) == (2, written["rules"], "")
    assert run("policy", "show", "sets", "staging").stdout.splitlines()[0] == (
        f"Policy 2 of 'staging' of 'sets': set by pat at {moment(again['created_at'])}"
    )

    # No rules at all: every version passes.
    done = run("policy", "set", "sets", "staging", "-", "--json", stdin="[]")
    assert json.loads(done.stdout)["number"] == 3 and json.loads(done.stdout)["rules"] == []
    assert run("policy", "show", "sets", "staging").stdout.splitlines()[1:] == ["  no rules: every version passes"]


def test_a_rule_that_does_not_compile_is_shown_where_it_fails(live, people):
    two_versions(live, people, "faulty")
    run = runner(live, people[0])
    bad = {"name": "fast-enough", "expr": "benchmark.slowdown_percent <=\n  10 &&", "message": ""}
    rules = write(live, "faulty.json", {"rules": [TAGGED, bad]})

    refused = run("policy", "set", "faulty", "staging", rules, expect=1)

    assert (refused.stdout, refused.stderr) == (
        "",
        "modelyard policy: rule 'fast-enough', line 2, column 8: syntax error: the expression ends too early\n"
        "    10 &&\n"
        "         ^\n",
    )
    as_json = run("policy", "set", "faulty", "staging", rules, "--json", expect=1)
    error = "rule 'fast-enough', line 2, column 8: syntax error: the expression ends too early"
    assert json.loads(as_json.stdout) == {
        "error": error,
        "detail": {"rule": "fast-enough", "line": 2, "column": 8, "error": error},
        "status": 400,
    }

    typo = write(live, "typo.json", [{"name": "typo", "expr": "size(signature.breaking) == 0 && banchmark.x"}])
    unknown = run("policy", "set", "faulty", "staging", typo, expect=1).stderr.splitlines()
    assert unknown[0].startswith("modelyard policy: rule 'typo', line 1, column 34: unknown variable 'banchmark'")
    assert unknown[1:] == [
        "  size(signature.breaking) == 0 && banchmark.x",
        "                                   ^",
    ]

    # A fault of no position (two rules of one name) is the message alone.
    twice = run("policy", "set", "faulty", "staging", write(live, "twice.json", [TAGGED, TAGGED]), expect=1)
    assert twice.stderr == "modelyard policy: rule 'tagged': two rules have this name\n"
    # Nothing was written.
    assert json.loads(run("policy", "show", "faulty", "staging", "--json").stdout)["number"] == 0


@pytest.mark.parametrize(
    ("content", "error"),
    [
        ("{not json", "not JSON: Expecting property name enclosed in double quotes at line 1, column 2"),
        ("", "not JSON: Expecting value at line 1, column 1"),
        ({"rule": [TAGGED]}, 'expected a JSON list of rules, or an object {"rules": [...]}'),
        ('"tagged"', 'expected a JSON list of rules, or an object {"rules": [...]}'),
        ([TAGGED, "second"], 'rule 2 is not an object of strings "name", "expr" and "message"'),
        ([{"name": "x"}], 'rule 1 is not an object of strings "name", "expr" and "message"'),
        ([{**TAGGED, "message": 3}], 'rule 1 is not an object of strings "name", "expr" and "message"'),
        (
            [{"name": "x", "expr": "true", "mesage": "typo"}],
            'rule 1 has an unknown key \'mesage\' (a rule has "name", "expr" and "message")',
        ),
    ],
)
def test_a_file_that_is_not_a_policy_is_a_usage_error(live, people, content, error):
    run = runner(live, people[0])
    path = write(live, "bad.json", content)

    done = run("policy", "set", "anything", "staging", path, expect=2)
    assert (done.stdout, done.stderr) == ("", f"modelyard policy: bad.json: {error}\n")
    piped = run("policy", "set", "anything", "staging", "-", expect=2, stdin=(live.folder / path).read_text())
    assert piped.stderr == f"modelyard policy: stdin: {error}\n"


def test_a_missing_file_is_a_usage_error_and_a_missing_argument_argparse_s(live, people):
    run = runner(live, people[0])
    missing = run("policy", "set", "anything", "staging", "nowhere.json", expect=2)
    assert (missing.stdout, missing.stderr) == ("", "modelyard policy: nowhere.json: No such file or directory\n")
    assert run("policy", "set", "anything", "staging", expect=2).stderr.endswith(
        "error: the following arguments are required: FILE\n"
    )
    assert run("policy", "check", "anything", "staging", "two", expect=2).stderr.endswith(
        "error: argument VERSION: invalid int value: 'two'\n"
    )


def test_set_on_a_protected_alias_waits_for_approval(live, people):
    two_versions(live, people, "guarded")
    run = runner(live, people[0])
    rules = write(live, "guarded.json", [TAGGED])

    asked = run("policy", "set", "guarded", "production", rules, "--reason", "tighten")

    shown = json.loads(run("policy", "show", "guarded", "production", "--json").stdout)
    promotion = shown["pending"]["promotion"]
    assert (asked.stdout, asked.stderr) == (
        f"'production' of 'guarded' is protected: policy 1 is waiting for approval in promotion request {promotion}.\n"
        f"Another approver runs: modelyard approve {promotion}\n",
        "",
    )
    assert run("policy", "show", "guarded", "production").stdout == (
        "Policy 0 of 'production' of 'guarded': built-in, from the alias's settings (no policy written yet)\n"
        "  compatible-signature: size(signature.breaking) == 0\n"
        f"    message: {SIGNATURE}\n"
        f"Pending: policy 1, waiting for approval in promotion request {promotion}:\n"
        '  tagged: "validated" in candidate.tags\n'
        "    message: not validated\n"
    )
    # Another change waits until this one is decided.
    again = run("policy", "set", "guarded", "production", rules, expect=1)
    assert again.stderr == (
        f"modelyard policy: policy 1 of 'production' is waiting for approval in promotion request {promotion}; "
        "cancel it first\n"
    )

    approved = runner(live, people[1])("approve", str(promotion), "--reason", "agreed")
    assert approved.stdout == (
        f"Approved promotion {promotion}: the new policy of 'production' of 'guarded' is in force.\n"
    )
    now = json.loads(run("policy", "show", "guarded", "production", "--json").stdout)
    assert run("policy", "show", "guarded", "production").stdout == (
        f"Policy 1 of 'production' of 'guarded': set by pat at {moment(now['created_at'])} (tighten)\n"
        '  tagged: "validated" in candidate.tags\n'
        "    message: not validated\n"
    )


def test_check_prints_each_rule_and_exits_0_only_when_all_pass(live, people):
    two_versions(live, people, "checked")
    run = runner(live, people[0])
    run("policy", "set", "checked", "staging", write(live, "checked.json", [TAGGED, SECOND]))

    failing = run("policy", "check", "checked", "staging", "2", expect=1)
    assert (failing.stdout, failing.stderr) == (
        "FAIL tagged: not validated\nWAIT second-approver: decided at approval\n",
        "",
    )
    Client(live.url, people[0]).update_version("checked", 2, tags=["validated"])
    waiting = run("policy", "check", "checked", "staging", "2", expect=1)
    assert waiting.stdout == "PASS tagged\nWAIT second-approver: decided at approval\n"
    as_json = run("policy", "check", "checked", "staging", "2", "--json", expect=1)
    assert json.loads(as_json.stdout) == {
        "version": 2,
        "policy": 1,
        "builtin": False,
        "passed": False,
        "rules": [
            {"name": "tagged", "passed": True, "why": "", "waiting": False},
            {"name": "second-approver", "passed": False, "why": "decided at approval", "waiting": True},
        ],
    }

    run("policy", "set", "checked", "staging", "-", stdin=json.dumps([TAGGED, {"name": "bare", "expr": "1 > 2"}]))
    bare = run("policy", "check", "checked", "staging", "2", expect=1)
    assert bare.stdout == "PASS tagged\nFAIL bare: rule bare failed\n"
    run("policy", "set", "checked", "staging", "-", stdin=json.dumps([TAGGED]))
    passing = run("policy", "check", "checked", "staging", "2")
    assert (passing.stdout, passing.stderr) == ("PASS tagged\n", "")
    assert json.loads(run("policy", "check", "checked", "staging", "2", "--json").stdout)["passed"] is True
    # The built-in policy of an alias never written to: the signature check.
    assert run("policy", "check", "checked", "production", "2").stdout == "PASS compatible-signature\n"

    # Refusals: the server's words, exit 1.
    missing = run("policy", "check", "checked", "staging", "9", expect=1)
    assert (missing.stdout, missing.stderr) == ("", "modelyard policy: model 'checked' has no version 9\n")
    nowhere = run("policy", "show", "checked", "canary", expect=1)
    assert nowhere.stderr == "modelyard policy: model 'checked' has no alias 'canary'\n"


def test_show_prints_who_wrote_it_and_every_line_of_each_rule():
    policy = Policy.from_json(
        {
            "model": "resnet",
            "alias": "production",
            "number": 3,
            "builtin": False,
            "rules": [
                {"name": "signed", "expr": "provenance.signed", "message": "", "builtin": False},
                {"name": "fast", "expr": "benchmark.slowdown_percent\n<= 10", "message": "too\nslow", "builtin": False},
            ],
            "created_by": None,
            "created_at": "2025-03-02T10:14:07.5+00:00",
            "reason": "  ",
            "pending": {"number": 4, "promotion": 17, "rules": []},
        }
    )
    assert _policy_lines(policy) == [
        "Policy 3 of 'production' of 'resnet': set by - at 2025-03-02 10:14:07",
        "  signed: provenance.signed",
        "  fast: benchmark.slowdown_percent",
        "        <= 10",
        "    message: too slow",
        "Pending: policy 4, waiting for approval in promotion request 17:",
        "  no rules: every version passes",
    ]


def test_the_policy_commands_are_listed(live):
    done = live.run("policy", "--help")
    assert done.returncode == 0, done.stderr
    assert "{show,set,check}" in done.stdout
    assert "FILE" in live.run("policy", "set", "--help").stdout
