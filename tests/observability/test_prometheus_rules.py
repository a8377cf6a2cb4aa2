"""``deploy/prometheus/rules.yml``: valid for promtool, and each alert unit-tested firing and staying quiet.

``promtool test rules`` runs ``deploy/prometheus/rules.test.yml``; the structure of that file is checked
here too, so an alert cannot be added without a series that fires it and one that does not.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from tests.support.prometheus import RULES, RULES_TEST, metric_names, promtool_run, rules

# The thresholds of the deployment guide, as the rules state them.
THRESHOLDS = {
    "ModelyardInferenceLatencyP99High": ("> 0.8", "5m"),
    "ModelyardInferenceErrorRateHigh": ("> 0.005", "5m"),
    "ModelyardInferenceSuccessRateLow": ("< 0.999", "15m"),
    "ModelyardGpuUtilisationHigh": ("> 0.95", "10m"),
    "ModelyardGpuMemoryHigh": ("> 0.9", "5m"),
}
ALSO = {
    "ModelyardFleetWorkerOffline",
    "ModelyardModelLoadFailing",
    "ModelyardModelVerifyFailed",
    "ModelyardValidationBacklogGrowing",
    "ModelyardInferenceJobQueueGrowing",
    "ModelyardAuditChainBroken",
    "ModelyardAuditChainUnverified",
    "ModelyardRegistryMetricsDown",
}


def test_promtool_checks_the_rules():
    result = promtool_run("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules())} rules found" in result.stdout


def test_promtool_unit_tests_pass():
    result = promtool_run("test", "rules", str(RULES_TEST), cwd=RULES.parent)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_unit_tests_can_fail(tmp_path):
    # The same tests against rules with a lower latency threshold: the quiet series now fire.
    (tmp_path / "rules.yml").write_text(RULES.read_text().replace("> 0.8\n", "> 0.5\n"))
    (tmp_path / "rules.test.yml").write_text(RULES_TEST.read_text())
    result = promtool_run("test", "rules", "rules.test.yml", cwd=tmp_path)
    assert result.returncode != 0
    assert "ModelyardInferenceLatencyP99High" in result.stdout + result.stderr


def test_the_rules_hold_the_deployment_guides_thresholds():
    by_name = {rule["alert"]: rule for rule in rules()}
    assert set(by_name) == set(THRESHOLDS) | ALSO
    for name, (threshold, duration) in THRESHOLDS.items():
        assert threshold in by_name[name]["expr"], name
        assert by_name[name]["for"] == duration, name
    assert all(rule["labels"]["severity"] in {"warning", "critical"} for rule in by_name.values())


def _label_values(series: str) -> dict[str, str]:
    return dict(re.findall(r'(\w+)="([^"]*)"', series))


def test_every_alert_has_a_series_that_fires_and_one_that_stays_quiet():
    spec: dict[str, Any] = yaml.safe_load(RULES_TEST.read_text())
    fires: set[str] = set()
    quiet: set[str] = set()
    durations = {rule["alert"]: rule.get("for", "0m") for rule in rules()}
    for case in spec["tests"]:
        series = [_label_values(item["series"]) for item in case["input_series"]]
        for check in case["alert_rule_test"]:
            name, expected = check["alertname"], check["exp_alerts"]
            if expected:
                fires.add(name)
                # Quiet beside it: an input series whose distinguishing label values no alert has.
                keys = {k for alert in expected for k in alert["exp_labels"] if k != "severity"}
                fired = [{k: alert["exp_labels"][k] for k in keys} for alert in expected]
                if keys and any({k: s.get(k) for k in keys} not in fired for s in series if keys <= set(s)):
                    quiet.add(name)
            elif _minutes(check["eval_time"]) > _minutes(durations[name]):
                quiet.add(name)  # nothing fires, long after its `for` would have passed
    names = set(THRESHOLDS) | ALSO
    assert fires == names
    assert quiet == names


def _minutes(duration: str) -> float:
    units = {"s": 1 / 60, "m": 1, "h": 60}
    return sum(float(n) * units[u] for n, u in re.findall(r"(\d+)([smh])", duration))


def test_metric_names_are_read_out_of_promql():
    expr = (
        'histogram_quantile(0.99, sum by (model, le) (rate(a_bucket{status=~"5..", x="or"}[5m]))) > 0.8 '
        "and on (model) b_total offset 15m unless max without (gpu) (c) / 1e3 or vector(1) or d[10m:1m]"
    )
    assert metric_names(expr) == {"a_bucket", "b_total", "c", "d"}
