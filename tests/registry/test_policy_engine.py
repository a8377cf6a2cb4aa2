"""The promotion policy engine (registry/policy/engine.py): CEL rules compiled, refused with a position, evaluated.

Pure unit tests: the evidence is the dict the promotion code passes (realistic values, built here), no database.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import pytest

from registry.policy import engine
from registry.policy.engine import (
    MAX_EVIDENCE_ITEMS,
    MAX_EVIDENCE_STRING,
    MAX_EVIDENCE_VALUES,
    MISSING,
    VARIABLES,
    CompiledRule,
    PolicyError,
    Rule,
    RuleResult,
    compile_policy,
    evaluate_policy,
)

TEN = "[1,2,3,4,5,6,7,8,9,10]"
# Six nested comprehensions over ten items: 10^6 innermost steps, far past any time limit.
MILLION_STEPS = f"{TEN}.all(a, {TEN}.all(b, {TEN}.all(c, {TEN}.all(d, {TEN}.all(e, {TEN}.all(f, true))))))"


def version(number: int, size_bytes: int, uploaded_by: str) -> dict[str, Any]:
    return {
        "number": number,
        "status": "ready",
        "size_bytes": size_bytes,
        "metadata": {"framework": "pytorch", "dataset": "imagenet-v2", "epochs": 30},
        "tags": {"team": "vision", "stage": "candidate"},
        "uploaded_by": uploaded_by,
    }


def evidence(**changes: Any) -> dict[str, Any]:
    """A promotion of version 3 over version 2, every kind of evidence present; ``changes`` replaces some."""
    values: dict[str, Any] = {
        "candidate": version(3, 1234, "alice"),
        "current": version(2, 1200, "carol"),
        "signature": {"breaking": [], "changes": ["output 'y' shape [1, 1000] -> [-1, 1000]"]},
        "provenance": {"signed": True, "signers": ["ci"]},
        "benchmark": {
            "provider": "CPUExecutionProvider",
            "batch": 1,
            "candidate": {"throughput": {"1": 100.0, "8": 610.5}, "p50_ms": 9.8, "p99_ms": 12.1},
            "current": {"throughput": {"1": 104.4, "8": 640.0}, "p50_ms": 9.4, "p99_ms": 11.6},
            "slowdown_percent": 4.2,
        },
        "accuracy": {"cosine": 0.9999, "max_abs_diff": 0.001, "top1_agreement": None},
        "shadow": {
            "requests": 1000,
            "compared": 998,
            "outputs": {"y": {"cosine_p1": 0.9995, "max_abs_diff_p99": 0.002}},
            "candidate": {"error_rate": 0.0, "p99_ms": 12.5},
            "current": {"error_rate": 0.001, "p99_ms": 11.9},
        },
        "approvals": [{"user": "bob", "roles": ["approver"]}],
        "requester": {"user": "alice", "roles": ["maintainer"]},
    }
    assert set(values) == set(VARIABLES)
    values.update(changes)
    return values


@pytest.fixture(autouse=True)
def _unhurried(settings: Any) -> None:
    """A deadline no busy CI machine reaches; the tests of the deadline set their own."""
    settings.POLICY_EVAL_TIMEOUT_MS = 10_000


def run(expr: str, facts: dict[str, Any] | None = None, message: str = "") -> RuleResult:
    [result] = evaluate_policy(compile_policy([Rule("rule", expr, message)]), evidence() if facts is None else facts)
    return result


def refusal(*rules: Rule) -> PolicyError:
    with pytest.raises(PolicyError) as caught:
        compile_policy(list(rules))
    return caught.value


def test_the_documented_variables_each_have_a_missing_evidence_reason():
    assert list(VARIABLES) == [
        "candidate",
        "current",
        "signature",
        "provenance",
        "benchmark",
        "accuracy",
        "shadow",
        "approvals",
        "requester",
    ]
    assert set(MISSING) == set(VARIABLES)
    assert MISSING["current"] == "no current version (a first promotion)"
    assert MISSING["benchmark"] == "no benchmark yet"
    assert MISSING["accuracy"] == "no accuracy delta measured"
    assert MISSING["shadow"] == "no shadow report yet"


# Compiling: what is refused, and where


def test_a_syntax_error_in_a_multi_line_expression_names_the_rule_line_and_column():
    error = refusal(
        Rule("fast", "candidate.size_bytes < 2000"),
        Rule("slow-enough", "benchmark.slowdown_percent <= 10 &&\n  accuracy.cosine > 0.999 0.5"),
    )
    assert (error.rule, error.line, error.column) == ("slow-enough", 2, 27)
    assert str(error) == "rule 'slow-enough', line 2, column 27: syntax error: unexpected '0.5'"
    assert error.detail == {"rule": "slow-enough", "line": 2, "column": 27, "error": str(error)}
    assert isinstance(error, ValueError)


def test_an_expression_that_ends_too_early_points_just_past_its_last_token():
    error = refusal(Rule("approved", "approvals.size() > 0 &&\n  (requester.user ||"))
    assert (error.line, error.column) == (2, 21)
    assert "the expression ends too early" in str(error)


def test_an_unknown_character_is_a_syntax_error_at_its_place():
    error = refusal(Rule("tilde", "candidate.number ~ 3"))
    assert (error.line, error.column) == (1, 18)
    assert "unexpected character '~'" in error.error


def test_an_unknown_variable_is_refused_with_its_line_and_column():
    error = refusal(Rule("typo", "candidate.number > 1 &&\n    benchmrk.slowdown_percent < 10"))
    assert (error.rule, error.line, error.column) == ("typo", 2, 5)
    assert error.error.startswith("unknown variable 'benchmrk'")
    assert str(error).startswith("rule 'typo', line 2, column 5: unknown variable 'benchmrk'")


def test_a_macro_bound_name_is_accepted_in_its_macro_only():
    [compiled] = compile_policy(
        [Rule("approved", 'approvals.exists(a, a.user != requester.user && "approver" in a.roles)')]
    )
    assert isinstance(compiled, CompiledRule)
    assert compiled.variables == frozenset({"approvals", "requester"})
    nested = compile_policy([Rule("nested", "approvals.all(a, a.roles.exists(r, r == 'approver' || r == 'admin'))")])
    assert nested[0].variables == frozenset({"approvals"})

    # The same name after the macro closes is a reference to nothing.
    error = refusal(Rule("leak", 'approvals.exists(a, a.user == "bob") && a.user == "bob"'))
    assert (error.line, error.column, error.error[:21]) == (1, 41, "unknown variable 'a' ")


def test_unknown_functions_and_malformed_macros_are_refused_where_they_are():
    error = refusal(Rule("f", "candidate.number > 1 && now() > 0"))
    assert (error.column, error.error) == (25, "unknown function 'now'")
    error = refusal(Rule("m", "approvals.reduce(a, b, 0, a + b) > 0"))
    assert (error.column, error.error) == (11, "unknown function 'reduce'")
    error = refusal(Rule("m", "approvals.exists(a.user, true)"))
    assert (error.column, error.error) == (18, "the first argument of exists() must be a name")
    error = refusal(Rule("m", "approvals.map(a, true, a)"))
    assert error.error == "map() takes a name and an expression"


def test_the_standard_functions_types_and_macros_compile():
    rules = [
        Rule("size", "size(approvals) == approvals.size()"),
        Rule("strings", 'candidate.uploaded_by.startsWith("al") && candidate.uploaded_by.matches("^[a-z]+$")'),
        Rule("types", "type(candidate.number) == int && int(candidate.size_bytes / 2) == 617"),
        Rule("macros", "approvals.map(a, a.user).filter(u, u != requester.user).exists_one(u, u == 'bob')"),
        Rule("has", "has(candidate.metadata.dataset)"),
        Rule("comment", "// only a signed candidate\nprovenance.signed"),
    ]
    results = evaluate_policy(compile_policy(rules), evidence())
    assert [result.as_json() for result in results] == [
        {"name": rule.name, "passed": True, "why": ""} for rule in rules
    ]


def test_too_many_rules_is_refused(settings: Any):
    settings.POLICY_MAX_RULES = 2
    rules = [Rule(f"rule-{n}", "true") for n in range(3)]
    error = refusal(*rules)
    assert (error.rule, error.line, error.column) == (None, None, None)
    assert str(error) == "a policy has at most 2 rules (MODELYARD_POLICY_MAX_RULES), this one has 3"
    assert len(compile_policy(rules[:2])) == 2


def test_a_too_long_expression_is_refused(settings: Any):
    settings.POLICY_MAX_RULE_LENGTH = 20
    assert compile_policy([Rule("short", "1 + 1 == 2 && true  ")])  # 20 characters
    error = refusal(Rule("long", "1 + 1 == 2 && true   "))
    assert error.rule == "long"
    assert error.error == "the expression is 21 characters long, at most 20 (MODELYARD_POLICY_MAX_RULE_LENGTH)"


def test_names_must_be_unique_slugs():
    error = refusal(Rule("signed", "provenance.signed"), Rule("signed", "true"))
    assert (error.rule, error.error) == ("signed", "two rules have this name")
    for bad in ["Signed", "-signed", "signed rule", "signé", "x" * 101]:
        with pytest.raises(PolicyError):
            compile_policy([Rule(bad, "true")])
    assert refusal(Rule("", "true")).error == "rule 1 has no name"
    assert compile_policy([Rule("0_ok-name", "true"), Rule("x" * 100, "true")])


def test_empty_expressions_and_long_messages_are_refused():
    assert refusal(Rule("empty", "  \n ")).error == "the expression is empty"
    assert refusal(Rule("chatty", "true", "x" * 501)).error == "the message is longer than 500 characters"
    assert compile_policy([Rule("chatty", "true", "x" * 500)])


def test_an_unterminated_string_is_refused_at_once():
    # celpy's lexer backtracks exponentially on such a string: 40 escaped backslashes would take hours.
    started = time.monotonic()
    error = refusal(Rule("evil", 'candidate.uploaded_by == "alice" ||\n  candidate.uploaded_by == "' + "\\\\" * 40))
    assert time.monotonic() - started < 2
    assert (error.line, error.column, error.error) == (2, 28, "syntax error: a string that does not end")
    assert refusal(Rule("evil", "'''" + "\\n" * 500)).error == "syntax error: a string that does not end"
    # Terminated ones, escapes and all, are fine.
    assert run('"a\\\\b\\"c" != "" && \'it\\\'s\' != "" && """two\nlines""" != ""').passed


def test_deep_nesting_is_refused_and_what_is_accepted_evaluates_within_the_default_recursion_limit():
    error = refusal(Rule("deep", "(" * 40 + "true" + ")" * 40))
    assert error.error == "the expression is nested too deeply"
    assert error.line == 1
    # celpy raises the recursion limit when its environment is made; the engine puts it back.
    limit = sys.getrecursionlimit()
    engine._environment.cache_clear()
    assert compile_policy([Rule("fresh", "true")])
    assert sys.getrecursionlimit() == limit
    deepest = "(" * 10 + "provenance.signed" + ")" * 10
    assert run(deepest).passed


# Evaluating

CASES = [
    # variable, a rule that passes on evidence(), one that fails
    ("candidate", 'candidate.status == "ready" && candidate.tags.team == "vision"', "candidate.size_bytes > 2000"),
    ("current", "current.number < candidate.number", 'current.uploaded_by == "alice"'),
    ("signature", "signature.breaking.size() == 0", "signature.changes.size() == 0"),
    ("provenance", 'provenance.signed && "ci" in provenance.signers', 'provenance.signers.exists(s, s == "ml-team")'),
    (
        "benchmark",
        "benchmark.slowdown_percent <= 10",
        'benchmark.candidate.throughput["8"] >= benchmark.current.throughput["8"]',
    ),
    ("accuracy", "accuracy.cosine >= 0.999 && accuracy.max_abs_diff < 0.01", "accuracy.cosine >= 0.99999"),
    (
        "shadow",
        "shadow.compared >= 500 && shadow.outputs.y.cosine_p1 > 0.999",
        "shadow.candidate.p99_ms < shadow.current.p99_ms",
    ),
    ("approvals", 'approvals.exists(a, "approver" in a.roles)', "approvals.size() >= 2"),
    ("requester", '"maintainer" in requester.roles', 'requester.user == "bob"'),
]


@pytest.mark.parametrize(("variable", "passing", "failing"), CASES, ids=[case[0] for case in CASES])
def test_each_variable_in_a_passing_and_a_failing_rule(variable: str, passing: str, failing: str):
    compiled = compile_policy([Rule("passes", passing), Rule("fails", failing, f"{variable} says no")])
    assert all(rule.variables == {variable} or variable in rule.variables for rule in compiled)
    assert [result.as_json() for result in evaluate_policy(compiled, evidence())] == [
        {"name": "passes", "passed": True, "why": ""},
        {"name": "fails", "passed": False, "why": f"{variable} says no"},
    ]


def test_a_failing_rule_without_a_message_says_which_rule_failed():
    assert run("approvals.size() > 3") == RuleResult("rule", False, "rule rule failed")


@pytest.mark.parametrize(
    ("variable", "expr"),
    [
        ("benchmark", "benchmark.slowdown_percent <= 10"),
        ("current", "candidate.size_bytes <= current.size_bytes * 2"),
        ("accuracy", "accuracy.cosine >= 0.999"),
        ("shadow", "shadow.candidate.error_rate <= shadow.current.error_rate"),
    ],
)
def test_missing_evidence_fails_with_its_reason(variable: str, expr: str):
    result = run(expr, evidence(**{variable: None}), message="too slow or too different")
    assert result == RuleResult("rule", False, MISSING[variable])


def test_missing_evidence_reasons_for_every_variable_a_failing_rule_lacks():
    facts = evidence(benchmark=None, shadow=None)
    result = run("benchmark.slowdown_percent < 5 && shadow.compared > 100", facts)
    assert result.why == "no benchmark yet; no shadow report yet"


def test_a_rule_may_handle_missing_evidence_itself():
    first = "current == null || candidate.size_bytes <= current.size_bytes * 2"
    assert run(first, evidence(current=None)).passed
    assert run(first).passed
    # null compares as CEL says: equal to null only.
    guarded = "current != null && current.number < candidate.number"
    assert run(guarded).passed
    assert run(guarded, evidence(current=None)).why == "no current version (a first promotion)"
    assert run("candidate != null && !(candidate.number == null) && accuracy.top1_agreement == null").passed
    # Commutative logic: an admin's request passes even before any benchmark.
    either = 'benchmark.slowdown_percent <= 10 || "admin" in requester.roles'
    assert run(either, evidence(benchmark=None, requester={"user": "root", "roles": ["admin"]})).passed
    assert run(either, evidence(benchmark=None)).why == "no benchmark yet"


def test_a_non_bool_result_fails_saying_what_it_gave():
    assert run("candidate.number").why == "the rule gave 3, not true or false"
    assert run("candidate.tags.team").why == 'the rule gave "vision", not true or false'
    assert run("accuracy.top1_agreement").why == "the rule gave null, not true or false"
    assert run("signature.breaking").why == "the rule gave [], not true or false"


def test_an_error_fails_with_a_short_reason():
    assert run("candidate.metadata.foo == 1") == RuleResult("rule", False, "error: no such key: 'foo'")
    assert run("candidate.metadata.foo == null").why == "error: no such key: 'foo'"
    assert run("candidate.metadata.foo != null").why == "error: no such key: 'foo'"
    assert run("candidate.uploaded_by > 1").why == "error: no such overload: string > int"
    assert run("candidate.number + 'x' == '3x'").why == "error: no such overload: int + string"
    assert run("approvals[5].user == 'bob'").why == "error: index out of range"
    assert run("candidate.size_bytes / (candidate.number - 3) > 0").why == "error: division by zero"
    assert run("accuracy.top1_agreement.value > 0.9").why == "error: null has no fields"


def test_a_rule_past_the_time_limit_is_cut_off_and_the_process_goes_on(settings: Any):
    settings.POLICY_EVAL_TIMEOUT_MS = 100
    compiled = compile_policy([Rule("forever", MILLION_STEPS), Rule("signed", "provenance.signed")])
    started = time.monotonic()
    results = evaluate_policy(compiled, evidence())
    elapsed = time.monotonic() - started
    assert results == [RuleResult("forever", False, "took longer than 100 ms"), RuleResult("signed", True, "")]
    assert elapsed < 5  # a hang guard: it stops at about 0.1 s
    # Usable afterwards, with the limit read at each evaluation.
    settings.POLICY_EVAL_TIMEOUT_MS = 20
    started = time.monotonic()
    assert evaluate_policy(compiled, evidence())[0].why == "took longer than 20 ms"
    assert time.monotonic() - started < 5
    assert run("provenance.signed").passed


def test_ints_and_doubles_compare_and_compute_naturally():
    assert run("benchmark.slowdown_percent <= 10").passed  # double <= int literal
    assert run("benchmark.slowdown_percent > 4").passed
    assert run("candidate.size_bytes < 1234.5 && candidate.size_bytes > 1233.9").passed  # int against double
    assert run("candidate.number == 3.0 && 3.0 == candidate.number && candidate.number != 3.5").passed
    assert run("candidate.size_bytes * 1.1 > current.size_bytes && 2 * accuracy.max_abs_diff < 0.01").passed
    assert run("candidate.size_bytes - current.size_bytes < 0.05 * current.size_bytes").passed
    assert run("shadow.requests in [1000.0, 2000.0] && !(shadow.compared in [1000.0])").passed
    assert not run("accuracy.cosine >= 1").passed
    assert run("1 < 1.5 && 2.5 > 2").passed
    # A bool is not a number.
    assert not run("provenance.signed == 1").passed


def test_has_and_the_macros_work_on_the_evidence():
    assert run("has(benchmark.slowdown_percent) && !has(benchmark.regression)").passed
    assert run("has(accuracy.top1_agreement) && accuracy.top1_agreement == null").passed
    assert run('approvals.all(a, a.user != requester.user) && approvals.exists(a, "approver" in a.roles)').passed
    assert run('benchmark.candidate.throughput.exists(batch, batch == "8")').passed
    assert not run("shadow.outputs.all(name, shadow.outputs[name].cosine_p1 > 0.9999)").passed


def test_evidence_is_bounded_before_evaluation():
    facts = evidence()
    facts["candidate"]["metadata"] = {
        "notes": "n" * 50_000,
        "layers": list(range(5000)),
        "params": {f"p{i}": i for i in range(5000)},
        "huge": 2**70,
    }
    assert run(
        f"candidate.metadata.notes.size() == {MAX_EVIDENCE_STRING} && candidate.metadata.layers.size() == "
        f"{MAX_EVIDENCE_ITEMS} && candidate.metadata.params.size() == {MAX_EVIDENCE_ITEMS}",
        facts,
    ).passed
    assert run("candidate.metadata.huge > 1e21", facts).passed
    # Concatenation is bounded too, so a rule cannot build a value far larger than its evidence.
    notes = " + ".join(["candidate.metadata.notes"] * 11)
    assert run(f"({notes}).size() > 0", facts).why == "error: the result would be longer than 100000"


def test_a_huge_evidence_value_is_cut_breadth_first_leaving_the_rest_whole():
    facts = evidence()
    # 100 lists of 1,000 before the candidate's tags: far past MAX_EVIDENCE_VALUES.
    facts["candidate"]["metadata"] = {"layers": [list(range(1000)) for _ in range(100)]}
    assert MAX_EVIDENCE_VALUES < 100 * 1000
    assert run(
        'candidate.tags.team == "vision" && candidate.uploaded_by == "alice" && provenance.signed && '
        "approvals.size() == 1 && candidate.metadata.layers.size() == 100 && "
        "candidate.metadata.layers[0].size() == 1000 && candidate.metadata.layers[99].size() == 0",
        facts,
    ).passed
    # Shared or self-holding lists (possible in a dict built in Python) end too.
    row = list(range(1000))
    loop: list[Any] = []
    loop.append(loop)
    facts["candidate"]["metadata"] = {"grid": [row] * 1000, "loop": loop}
    started = time.monotonic()
    assert run("candidate.metadata.grid.size() == 1000 && candidate.metadata.loop.size() == 1", facts).passed
    assert time.monotonic() - started < 5


def test_results_as_json():
    [ok, no] = evaluate_policy(
        compile_policy(
            [Rule("signed", "provenance.signed"), Rule("two", "approvals.size() >= 2", "needs two approvals")]
        ),
        evidence(),
    )
    assert ok.as_json() == {"name": "signed", "passed": True, "why": ""}
    assert no.as_json() == {"name": "two", "passed": False, "why": "needs two approvals"}


def test_evidence_keys_left_out_read_as_missing():
    [result] = evaluate_policy(compile_policy([Rule("fast", "benchmark.slowdown_percent < 5")]), {"candidate": {}})
    assert result.why == "no benchmark yet"
