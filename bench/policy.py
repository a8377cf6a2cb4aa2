"""Policy benchmark: what compiling and evaluating an alias's promotion policy costs, and how fast a runaway rule stops.

    .venv/bin/python bench/policy.py [--runs 50]

What it does, in this process only (no server, no database):

1. takes the ten rules of the cookbook in ``docs/registry-api/policy.md`` (the same blocks
   ``tests/registry/test_policy_cookbook.py`` checks) and realistic evidence that passes all of them;
2. times the first compile in the process (the CEL grammar is built once), then ``--runs`` compiles
   and evaluations of the ten rules, and of the largest policy the default settings allow
   (``MODELYARD_POLICY_MAX_RULES``, 50: the ten rules five times, renamed);
3. times a rule of 10^6 steps (six nested ``all`` macros over ten items) against the default
   deadline (``MODELYARD_POLICY_EVAL_TIMEOUT_MS``, 100 ms): it must fail as out of time, near the deadline.

It prints min, median and max of each and writes bench/results/policy.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import run_in_workdir

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "registry-api" / "policy.md"

EVIDENCE: dict[str, Any] = {
    "candidate": {
        "number": 7,
        "status": "ready",
        "size_bytes": 90_000_000,
        "metadata": {"dataset": "msmarco-2026-10"},
        "tags": ["validated"],
        "uploaded_by": "ci",
    },
    "current": {
        "number": 5,
        "status": "ready",
        "size_bytes": 88_000_000,
        "metadata": {},
        "tags": ["validated"],
        "uploaded_by": "ci",
    },
    "signature": {"breaking": [], "changes": []},
    "provenance": {"signed": True, "signers": ["ci"]},
    "benchmark": {
        "provider": "CPUExecutionProvider",
        "batch": 32,
        "candidate": {"throughput": {"32": 410.0}},
        "current": {"throughput": {"32": 420.0}},
        "slowdown_percent": 2.4,
    },
    "accuracy": {"cosine": 0.99991, "max_abs_diff": 0.0012, "top1_agreement": 0.998},
    "shadow": {
        "requests": 4200,
        "compared": 4180,
        "dropped": 310,
        "primary": {"answered": 4200, "errors": 0, "error_rate": 0.0},
        "candidate": {"answered": 4180, "errors": 0, "error_rate": 0.0},
        "outputs": {"sentence_embedding": {"cosine_p1": 0.9996, "cosine_p50": 0.9999, "max_abs_diff": 0.002}},
    },
    "approvals": [{"user": "bob", "roles": ["approver"]}],
    "requester": {"user": "alice", "roles": ["maintainer"]},
}
RUNAWAY = "[" + ",".join(str(i) for i in range(10)) + "]"
RUNAWAY_EXPR = (
    f"{RUNAWAY}.all(a, {RUNAWAY}.all(b, {RUNAWAY}.all(c, {RUNAWAY}.all(d, {RUNAWAY}.all(e, {RUNAWAY}.all(f, true))))))"
)


def cookbook_rules() -> list[dict[str, str]]:
    text = DOC.read_text()
    section = text[text.index("## Cookbook") :]
    return [json.loads(block) for block in re.findall(r"```json\n(.*?)```", section, re.S)]


def timed(fn: Callable[[], Any], runs: int) -> dict[str, float]:
    seconds = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - started)
    return {
        "min_ms": round(min(seconds) * 1000, 2),
        "median_ms": round(statistics.median(seconds) * 1000, 2),
        "max_ms": round(max(seconds) * 1000, 2),
    }


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "modelyard.settings")
    os.environ.setdefault("MODELYARD_DATA_DIR", str(work))
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from registry.policy.engine import Rule, compile_policy, evaluate_policy

    ten = [Rule(r["name"], r["expr"], r.get("message", "")) for r in cookbook_rules()]
    assert len(ten) == 10, f"the cookbook has {len(ten)} rules"
    fifty = [Rule(f"{rule.name}-{copy}", rule.expr, rule.message) for copy in range(5) for rule in ten]

    started = time.perf_counter()
    compiled = compile_policy(ten)
    first_compile_ms = round((time.perf_counter() - started) * 1000, 1)
    results = evaluate_policy(compiled, EVIDENCE)
    failed = [r.name for r in results if not r.passed]
    assert not failed, f"cookbook rules failed on the bench's evidence: {failed}"
    compiled_fifty = compile_policy(fifty)

    [runaway] = compile_policy([Rule("runaway", RUNAWAY_EXPR)])
    stops = []
    for _ in range(5):
        started = time.perf_counter()
        [outcome] = evaluate_policy([runaway], EVIDENCE)
        stops.append(round((time.perf_counter() - started) * 1000, 1))
        assert not outcome.passed and "longer than" in outcome.why, outcome
    return {
        "runs": args.runs,
        "first_compile_ms": first_compile_ms,
        "compile_10": timed(lambda: compile_policy(ten), args.runs),
        "evaluate_10": timed(lambda: evaluate_policy(compiled, EVIDENCE), args.runs),
        "compile_50": timed(lambda: compile_policy(fifty), args.runs),
        "evaluate_50": timed(lambda: evaluate_policy(compiled_fifty, EVIDENCE), args.runs),
        "runaway_stopped_ms": stops,
        "deadline_ms": 100,
    }


def report(result: dict[str, Any]) -> None:
    print(f"first compile in the process: {result['first_compile_ms']} ms (the CEL grammar is built once)")
    print("| what | min ms | median ms | max ms |")
    print("|---|---|---|---|")
    for key, label in (
        ("compile_10", "compile the ten cookbook rules"),
        ("evaluate_10", "evaluate them"),
        ("compile_50", "compile 50 rules (the default limit)"),
        ("evaluate_50", "evaluate them"),
    ):
        t = result[key]
        print(f"| {label} | {t['min_ms']} | {t['median_ms']} | {t['max_ms']} |")
    print(f"a 10^6-step rule stopped after {result['runaway_stopped_ms']} ms (deadline {result['deadline_ms']} ms)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "results" / "policy.json")
    args = parser.parse_args(argv)
    return run_in_workdir(
        prefix="modelyard-bench-policy-",
        run=lambda work: run(args, work),
        report=report,
        output=args.output,
        keep=False,
        passed=lambda result: max(result["runaway_stopped_ms"]) < 10 * result["deadline_ms"],
    )


if __name__ == "__main__":
    sys.exit(main())
