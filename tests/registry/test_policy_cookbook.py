"""docs/registry-api/policy.md against the rule engine (registry/policy/engine.py): its cookbook's rules compile, pass
on a good promotion and fail on a bad one with their message (or the reason of the evidence they lack); its other
JSON examples parse and their rules compile; its variables table names exactly the engine's variables.

Pure unit tests: the page is read from disk, the evidence is built here as the promotion code passes it.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from registry.models import Alias
from registry.policy.engine import MISSING, VARIABLES, PolicyError, Rule, compile_policy, evaluate_policy
from registry.policy.rules import builtin_rules

PAGE = Path(__file__).resolve().parents[2] / "docs" / "registry-api" / "policy.md"
JSON_BLOCK = re.compile(r"^```json\n(.*?)\n```$", re.DOTALL | re.MULTILINE)


@pytest.fixture(autouse=True)
def _documented_limits(settings: Any) -> None:
    """The defaults the page quotes, whatever the environment says; and room for a busy test machine."""
    settings.POLICY_MAX_RULES = 50
    settings.POLICY_MAX_RULE_LENGTH = 2000
    settings.POLICY_EVAL_TIMEOUT_MS = 10_000


def section(heading: str) -> str:
    """The page's text under a level-2 heading, up to the next one."""
    text = PAGE.read_text()
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def cookbook() -> list[dict[str, Any]]:
    return [json.loads(block) for block in JSON_BLOCK.findall(section("Cookbook"))]


def rule(entry: dict[str, Any]) -> Rule:
    return Rule(entry["name"], entry["expr"], entry["message"])


def version(number: int, size_bytes: int, uploaded_by: str, **fields: Any) -> dict[str, Any]:
    return {
        "number": number,
        "status": "ready",
        "size_bytes": size_bytes,
        "metadata": {"framework": "pytorch", "epochs": 30},
        "tags": ["vision"],
        "uploaded_by": uploaded_by,
        **fields,
    }


def good() -> dict[str, Any]:
    """Version 7 (uploaded by CI, validated, shadowed for a day) over version 6, asked for by dave, approved by bob."""
    return {
        "candidate": version(
            7,
            98_812_344,
            "ci-bot",
            metadata={"framework": "pytorch", "dataset": "imagenet-v2", "epochs": 30},
            tags=["vision", "validated"],
        ),
        "current": version(6, 97_540_112, "carol"),
        "signature": {"breaking": [], "changes": ["output 'logits' shape [1, 1000] -> [-1, 1000]"]},
        "provenance": {"signed": True, "signers": ["ci"]},
        "benchmark": {
            "provider": "CPUExecutionProvider",
            "batch": 1,
            "candidate": {"throughput": {"1": 100.0}},
            "current": {"throughput": {"1": 104.0}},
            "slowdown_percent": 3.8,
        },
        "accuracy": {"cosine": 0.99991, "max_abs_diff": 0.0012, "top1_agreement": 0.9962},
        "shadow": {
            "requests": 14_210,
            "compared": 14_188,
            "dropped": 37,
            "dropped_by_reason": {"busy": 37},
            "primary": {"answered": 14_210, "errors": 3, "error_rate": 0.000211, "p50_ms": 7.07, "p99_ms": 11.9},
            "candidate": {"answered": 14_188, "errors": 2, "error_rate": 0.000141, "p50_ms": 8.41, "p99_ms": 14.1},
            "outputs": {
                "logits": {
                    "rows": 14_188,
                    "cosine_p1": 0.99962,
                    "cosine_p50": 0.99993,
                    "cosine_min": 0.99871,
                    "max_abs_diff": 0.0041,
                    "mean_abs_diff": 0.0003,
                    "top1_agreement": 0.9971,
                    "psi": 0.0011,
                    "mismatched": 0,
                    "mismatch": "",
                },
                "embedding": {
                    "rows": 14_188,
                    "cosine_p1": 0.99994,
                    "cosine_p50": 0.99998,
                    "cosine_min": 0.9999,
                    "max_abs_diff": 0.0007,
                    "mean_abs_diff": 0.0001,
                    "top1_agreement": None,
                    "psi": 0.0002,
                    "mismatched": 0,
                    "mismatch": "",
                },
            },
        },
        "approvals": [{"user": "bob", "roles": ["approver"]}],
        "requester": {"user": "dave", "roles": ["maintainer"]},
    }


def setting(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """A change to the good evidence: ``value`` at the dotted ``path``."""

    def change(evidence: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        target = evidence
        for key in parents:
            target = target[key]
        target[last] = value

    return change


def removing(path: str) -> Callable[[dict[str, Any]], None]:
    def change(evidence: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        target = evidence
        for key in parents:
            target = target[key]
        del target[last]

    return change


MESSAGE = object()  # the failing rule's own message is the expected why

# (rule, what makes the promotion bad, the why expected: MESSAGE or the MISSING reason of a variable)
BAD: list[tuple[str, str, Callable[[dict[str, Any]], None], object]] = [
    ("signed-by-ci", "unsigned", setting("provenance", {"signed": False, "signers": []}), MESSAGE),
    ("signed-by-ci", "signed by someone else", setting("provenance.signers", ["alice-laptop"]), MESSAGE),
    ("signed-by-ci", "no provenance", setting("provenance", None), "provenance"),
    ("fast-enough", "12.5% slower", setting("benchmark.slowdown_percent", 12.5), MESSAGE),
    ("fast-enough", "not benchmarked", setting("benchmark", None), "benchmark"),
    ("shadow-agreement", "too few comparisons", setting("shadow.compared", 998), MESSAGE),
    ("shadow-agreement", "one output drifted", setting("shadow.outputs.embedding.cosine_p1", 0.9981), MESSAGE),
    ("shadow-agreement", "never shadowed", setting("shadow", None), "shadow"),
    ("shadow-errors", "fails more often", setting("shadow.candidate.error_rate", 0.0125), MESSAGE),
    ("shadow-errors", "never shadowed", setting("shadow", None), "shadow"),
    ("size-at-most-double", "three times the size", setting("candidate.size_bytes", 3 * 97_540_112), MESSAGE),
    ("dataset-recorded", "no dataset", removing("candidate.metadata.dataset"), MESSAGE),
    ("validated", "not tagged", setting("candidate.tags", ["vision"]), MESSAGE),
    ("validated", "no tags at all", setting("candidate.tags", []), MESSAGE),
    ("not-own-upload", "the uploader asks", setting("requester.user", "ci-bot"), MESSAGE),
    (
        "second-approver",
        "approved by the requester",
        setting("approvals", [{"user": "dave", "roles": ["approver"]}]),
        MESSAGE,
    ),
    (
        "second-approver",
        "approved without the role",
        setting("approvals", [{"user": "bob", "roles": ["maintainer"]}]),
        MESSAGE,
    ),
    ("second-approver", "not approved yet", setting("approvals", None), "approvals"),
    ("top1-agreement", "97% top-1 agreement", setting("accuracy.top1_agreement", 0.97), MESSAGE),
    ("top1-agreement", "not measured", setting("accuracy", None), "accuracy"),
]


def test_the_cookbook_has_exactly_ten_rules_each_a_name_an_expression_and_a_message():
    rules = cookbook()
    assert len(rules) == 10, [entry.get("name") for entry in rules]
    for entry in rules:
        assert set(entry) == {"name", "expr", "message"}, entry
        assert all(isinstance(value, str) and value for value in entry.values()), entry


@pytest.mark.parametrize("entry", cookbook(), ids=lambda entry: entry["name"])
def test_each_cookbook_rule_compiles_on_its_own(entry):
    [compiled] = compile_policy([rule(entry)])
    assert compiled.variables <= set(VARIABLES)


def test_the_cookbook_rules_compile_together_as_one_policy_and_a_good_promotion_passes_them_all():
    compiled = compile_policy([rule(entry) for entry in cookbook()])
    results = evaluate_policy(compiled, good())
    assert [(result.name, result.passed, result.why) for result in results] == [
        (entry["name"], True, "") for entry in cookbook()
    ]


def test_every_cookbook_rule_has_bad_promotions_here_and_every_bad_one_is_for_a_cookbook_rule():
    assert {name for name, *_ in BAD} == {entry["name"] for entry in cookbook()}


@pytest.mark.parametrize(("name", "case", "change", "expected"), BAD, ids=[f"{name}: {case}" for name, case, *_ in BAD])
def test_each_cookbook_rule_fails_a_bad_promotion_with_its_message_or_the_missing_evidence(
    name, case, change, expected
):
    entry = next(entry for entry in cookbook() if entry["name"] == name)
    evidence = copy.deepcopy(good())
    change(evidence)
    [alone] = evaluate_policy(compile_policy([rule(entry)]), evidence)
    why = entry["message"] if expected is MESSAGE else MISSING[str(expected)]
    assert (alone.passed, alone.why) == (False, why), case
    # In the whole policy the same rule fails the same way, and the others are not disturbed.
    together = {
        result.name: result
        for result in evaluate_policy(compile_policy([rule(entry) for entry in cookbook()]), evidence)
    }
    assert (together[name].passed, together[name].why) == (False, why)


def test_a_first_promotion_passes_the_size_rule_without_a_current_version():
    entry = next(entry for entry in cookbook() if entry["name"] == "size-at-most-double")
    evidence = good()
    evidence["current"] = None
    assert evaluate_policy(compile_policy([rule(entry)]), evidence)[0].passed


def test_top1_agreement_passes_outputs_that_are_not_class_scores():
    entry = next(entry for entry in cookbook() if entry["name"] == "top1-agreement")
    evidence = good()
    evidence["accuracy"]["top1_agreement"] = None
    assert evaluate_policy(compile_policy([rule(entry)]), evidence)[0].passed


def test_every_json_example_on_the_page_parses_and_every_rule_in_it_compiles():
    blocks = JSON_BLOCK.findall(PAGE.read_text())
    assert len(blocks) > 10
    rules: list[dict[str, Any]] = []

    def collect(value: Any) -> None:
        if isinstance(value, dict):
            if "expr" in value:
                rules.append(value)
            for item in value.values():
                collect(item)
        elif isinstance(value, list):
            for item in value:
                collect(item)

    for block in blocks:
        collect(json.loads(block))
    for entry in rules:
        compile_policy([Rule(entry["name"], entry["expr"], entry.get("message", ""))])
    # The built-in rules, as the table writes them (X a number).
    builtin = re.findall(r"^\| `([a-z-]+)` \| `([^`]+)` \|", section("Built-in rules"), re.MULTILINE)
    assert [name for name, _ in builtin] == ["compatible-signature", "max-slowdown", "min-cosine", "max-abs-diff"]
    written = [(name, expr.replace("\\|", "|").replace("X", "0.5")) for name, expr in builtin]
    compile_policy([Rule(name, expr) for name, expr in written])
    # What the registry makes of an alias with those settings is what the table says.
    alias = Alias(max_slowdown_percent=0.5, min_cosine=0.5, max_abs_diff=0.5)
    assert [(rule.name, rule.expr) for rule in builtin_rules(alias)] == written


def test_the_example_evidence_has_every_variable():
    example = next(
        json.loads(block) for block in JSON_BLOCK.findall(section("Variables")) if '"candidate"' in block[:20]
    )
    assert list(example) == list(VARIABLES)


def test_the_variables_table_lists_exactly_the_engines_variables_with_their_missing_reasons():
    rows = {}
    for line in section("Variables").splitlines():
        found = re.match(r"^\| `([a-z_]+)` \|", line)
        if found:
            rows[found.group(1)] = line
    assert list(rows) == list(VARIABLES)
    for name, line in rows.items():
        assert f"`{MISSING[name]}`" in line, f"the row of {name} does not give its reason: {MISSING[name]}"


def without_epochs(evidence: dict[str, Any]) -> None:
    del evidence["candidate"]["metadata"]["epochs"]


# What "Writing rules: what to expect of CEL" and "Limits" say, against the engine: (expression, a change to the
# good evidence or None, the why expected: "" for a pass).
NOTES: list[tuple[str, Callable[[dict[str, Any]], None] | None, str]] = [
    ("benchmark.slowdown_percent <= 10", None, ""),
    ("candidate.size_bytes < 1.5e9", None, ""),
    ("2500 / 1200 == 2", None, ""),
    ("true == 1", None, "rule r failed"),
    ("accuracy.top1_agreement != null", None, ""),
    (
        "shadow.primary.error_rate < 0.01",
        setting("shadow.primary.error_rate", None),
        "error: no such overload: null < double",
    ),
    ("candidate.metadata.epochs >= 10", without_epochs, "error: no such key: 'epochs'"),
    ("has(candidate.metadata.epochs) && candidate.metadata.epochs >= 10", without_epochs, "rule r failed"),
    ('"dataset" in candidate.metadata', None, ""),
    ("has(accuracy.top1_agreement)", setting("accuracy.top1_agreement", None), ""),
    ("candidate.metadata.epochs >= 10 && false", without_epochs, "rule r failed"),
    ("candidate.metadata.epochs >= 10 || true", without_epochs, ""),
    ("false || candidate.metadata.epochs >= 10", without_epochs, "error: no such key: 'epochs'"),
    ("shadow.outputs.all(o, shadow.outputs[o].cosine_p1 > 0.999)", None, ""),
    ("benchmark.slowdown_percent", None, "the rule gave 3.8, not true or false"),
    ("size(candidate.metadata.big) == 1000", setting("candidate.metadata.big", list(range(5000))), ""),
    ('candidate.uploaded_by.startsWith("ci") && candidate.uploaded_by.matches("^[a-z-]+$")', None, ""),
    ("requester.user != candidate.uploaded_by", setting("candidate.uploaded_by", None), ""),
]


@pytest.mark.parametrize(("expr", "change", "why"), NOTES, ids=[expr for expr, *_ in NOTES])
def test_the_notes_on_writing_rules_say_what_the_engine_does(expr, change, why):
    evidence = copy.deepcopy(good())
    if change is not None:
        change(evidence)
    [result] = evaluate_policy(compile_policy([Rule("r", expr)]), evidence)
    assert (result.passed, result.why) == (not why, why)


# (expression, the engine's refusal, what the page quotes of it)
REFUSALS = [
    ("max(1, 2) == 2", "unknown function 'max'", "unknown function 'max'"),
    ('candidate.metadata.?dataset == "x"', "syntax error: unexpected '?'", "candidate.metadata.?dataset"),
    (
        "benchmarks.slowdown_percent <= 10",
        "unknown variable 'benchmarks' (known: candidate, current, ",
        "unknown variable 'benchmarks' (known: candidate, current, ",
    ),
    (
        "benchmark.slowdown_percent <== 10",
        "rule 'fast-enough', line 1, column 30: syntax error: unexpected character '='",
        "rule 'fast-enough', line 1, column 30: syntax error: unexpected character '='",
    ),
    ("(" * 12 + "true" + ")" * 12, "the expression is nested too deeply", "the expression is nested too deeply"),
    (
        'candidate.uploaded_by == "ci',
        "syntax error: a string that does not end",
        "syntax error: a string that does not end",
    ),
    (
        "x" * 2100,
        "the expression is 2100 characters long, at most 2000 (MODELYARD_POLICY_MAX_RULE_LENGTH)",
        "the expression is 2100 characters long, at most 2000 (MODELYARD_POLICY_MAX_RULE_LENGTH)",
    ),
]


@pytest.mark.parametrize(("expr", "error", "quoted"), REFUSALS, ids=[error for _, error, _ in REFUSALS])
def test_the_refusals_the_page_quotes_are_the_engines(expr, error, quoted):
    with pytest.raises(PolicyError) as refused:
        compile_policy([Rule("fast-enough", expr)])
    assert error in str(refused.value)
    assert quoted in PAGE.read_text()


def test_too_many_rules_is_refused_as_the_page_says():
    with pytest.raises(PolicyError) as refused:
        compile_policy([Rule(f"r{i}", "true") for i in range(51)])
    assert refused.value.detail["rule"] is None
    assert str(refused.value) == "a policy has at most 50 rules (MODELYARD_POLICY_MAX_RULES), this one has 51"
    assert str(refused.value) in PAGE.read_text()
