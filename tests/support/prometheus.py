"""Prometheus for the observability tests: promtool, a real Prometheus server, PromQL metric names, scrapes.

Debian's ``prometheus`` package provides both ``promtool`` and ``prometheus``; ``.ci/run`` installs
it. Where it is missing a test that needs it is skipped, except under ``CI=true``, where it fails,
so that CI cannot pass without the rules ever being checked.
"""

from __future__ import annotations

import http.client
import json
import re
import shutil
import subprocess
import tempfile
from os import environ
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.support.processes import free_port

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "rules.yml"
RULES_TEST = ROOT / "deploy" / "prometheus" / "rules.test.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "modelyard.json"


def require(tool: str) -> str:
    """The path of ``promtool`` or ``prometheus``; skips the test where it is missing (fails it under CI)."""
    found = shutil.which(tool)
    if found:
        return found
    message = f"{tool} is not installed (Debian's prometheus package: apt-get install prometheus)"
    if environ.get("CI", "").lower() in {"true", "1"}:
        pytest.fail(f"{message}; CI is set, so this is a failure, not a skip", pytrace=False)
    pytest.skip(message)


# --- PromQL -------------------------------------------------------------------------------------------

# Words of PromQL that look like metric names: operators, modifiers, and aggregation clauses.
_KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool"}
_CLAUSE = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_IDENTIFIER = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: identifiers that are not functions, keywords or labels.

    Strings, label matchers (``{...}``), range and subquery brackets (``[5m]``), aggregation clauses
    (``by (...)``) and numbers are removed first; what remains that is not called like a function is
    a metric name. Grafana's ``$variables`` are removed with the strings and matchers they sit in.
    """
    text = _STRING.sub('""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = _CLAUSE.sub(" ", text)
    text = re.sub(r"\$\w+", " ", text)
    names = set()
    for match in _IDENTIFIER.finditer(text):
        word = match.group()
        rest = text[match.end() :].lstrip()
        if word in _KEYWORDS or rest.startswith("(") or re.fullmatch(r"(?i)inf|nan", word):
            continue
        if match.start() > 0 and (text[match.start() - 1].isdigit() or text[match.start() - 1] == "."):
            continue  # the exponent or unit of a number (1e3)
        names.add(word)
    return names


def rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def rule_expressions() -> dict[str, str]:
    return {rule.get("alert") or rule["record"]: rule["expr"] for rule in rules()}


def dashboard_expressions() -> dict[str, str]:
    """Every query of the Grafana dashboard (panels and template variables), by where it is."""
    board = json.loads(DASHBOARD.read_text())
    found: dict[str, str] = {}
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            found[f"panel '{panel['title']}' {target['refId']}"] = target["expr"]
    for variable in board.get("templating", {}).get("list", []):
        if variable.get("type") == "query":
            query = variable["query"]
            text = query["query"] if isinstance(query, dict) else query
            # label_values(metric, label): the metric is the first argument
            found[f"variable '{variable['name']}'"] = re.sub(r"label_values\((.*),\s*\w+\)", r"\1", text)
    return found


# --- Scrapes ------------------------------------------------------------------------------------------


def scrape(host: str, port: int, token: str | None = None) -> str:
    conn = http.client.HTTPConnection(host, port, timeout=30)
    try:
        conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {token}"} if token else {})
        response = conn.getresponse()
        body = response.read().decode()
    finally:
        conn.close()
    assert response.status == 200, body
    return body


def samples(exposition: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample of an exposition: (name, labels, value)."""
    return [
        (sample.name, dict(sample.labels), sample.value)
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
    ]


def value(exposition: str, name: str, **labels: str) -> float:
    """The sum of the samples named ``name`` whose labels include ``labels`` (0 when there is none)."""
    return sum(v for n, lab, v in samples(exposition) if n == name and all(lab.get(k) == x for k, x in labels.items()))


# --- A real Prometheus ----------------------------------------------------------------------------------


class PrometheusServer:
    """``prometheus`` on a loopback port scraping one target every second and evaluating rules every second."""

    def __init__(self, *, target: str, rule_file: Path, token: str, folder: Path) -> None:
        self.folder = folder
        self.port = free_port()
        token_file = folder / "token"
        token_file.write_text(token)
        token_file.chmod(0o600)
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rule_file)],
            "scrape_configs": [
                {
                    "job_name": "modelyard",
                    "static_configs": [{"targets": [target]}],
                    "authorization": {"type": "Bearer", "credentials_file": str(token_file)},
                }
            ],
        }
        (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log_path = folder / "prometheus.log"
        argv = [
            require("prometheus"),
            f"--config.file={folder / 'prometheus.yml'}",
            f"--storage.tsdb.path={tempfile.mkdtemp(dir=folder)}",
            f"--web.listen-address=127.0.0.1:{self.port}",
        ]
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def api(self, path: str) -> Any:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            raw = response.read()
        finally:
            conn.close()
        try:
            body = json.loads(raw)
        except ValueError:  # "Service Unavailable" in plain text while Prometheus starts: not ready yet
            raise ConnectionError(f"prometheus answered {response.status}: {raw[:200]!r}") from None
        assert body["status"] == "success", body
        return body["data"]

    def alerts(self) -> list[dict[str, Any]]:
        try:
            return list(self.api("/api/v1/alerts")["alerts"])
        except OSError:
            if self.process.poll() is not None:
                raise AssertionError(f"prometheus exited with {self.process.returncode}:\n{self.log()}") from None
            return []

    def targets_up(self) -> bool:
        try:
            active = self.api("/api/v1/targets")["activeTargets"]
        except OSError:
            return False
        return bool(active) and all(t["health"] == "up" for t in active)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)


def promtool_run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([require("promtool"), *args], capture_output=True, text=True, timeout=120, cwd=cwd)
