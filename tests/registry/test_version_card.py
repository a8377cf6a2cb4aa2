"""``GET /api/v1/models/{m}/versions/{n}/card``: the model card in Markdown, every section under its heading with the
version's real values, user text escaped, downloadable; a deleted version's card is its tombstone.

Benchmarks are written through the record service the inference processes use, and the derived version through
the upload service with a derivation, as the derive job does, with chosen numbers, so the card's text is exact.
"""

from __future__ import annotations

import json
import re

import pytest
from django.test import TestCase
from django.utils import timezone

from onnxkit.sandbox import ChildOutcome
from registry import services, serving
from registry.derive.services import derive_claim, derive_request
from registry.lifecycle.card import SECTION_TITLES, md_text
from registry.models import ModelVersion, Role
from registry.uploads import LocalUpload, version_upload
from tests.support.onnx_models import add_model_bytes
from tests.support.people import Person, make_person
from tests.support.registry import create_model, promote

pytestmark = pytest.mark.django_db

CPU = "CPUExecutionProvider"
RUN = "https://runs.example.com/exp/7?tab=metrics"
CARD = "/api/v1/models/demo/versions/{}/card"


@pytest.fixture
def mia() -> Person:
    return make_person("mia", Role.MAINTAINER)


@pytest.fixture
def ada() -> Person:
    return make_person("ada", Role.APPROVER)


def record_benchmark(version: ModelVersion, p99_ms: float) -> None:
    job = serving.benchmark_claim(provider=CPU, host_kind="cpu", worker_id="test")
    assert job is not None and job.version == version.version
    numbers = {"p50_ms": p99_ms / 2, "p99_ms": p99_ms, "throughput": {"32": 1900.0}, "load_seconds": 0.25}
    serving.benchmark_record(benchmark_id=job.benchmark_id, outcome=ChildOutcome(reply=numbers))


def derived(parent: ModelVersion, person: Person) -> ModelVersion:
    """An fp16 child of ``parent`` made as the derive job makes it, with a chosen accuracy delta."""
    job = derive_request(version=parent, recipe="fp16", options={}, actor=person.actor)
    assert derive_claim(job_id=job.pk)
    accuracy = {
        "against": parent.version,
        "inputs": "synthetic",
        "outputs": {"y": {"max_abs_diff": 0.00048828125, "mean_abs_diff": 0.0001, "cosine": 0.9999997}},
    }
    recipe = {"recipe": "fp16", "options": {}, "libraries": {"onnx": "1.17.0"}}
    derivation = services.Derivation(parent=parent, recipe=recipe, accuracy=accuracy, job_id=job.pk)
    with TestCase.captureOnCommitCallbacks(execute=True):
        version = version_upload(
            model=parent.model,
            source=LocalUpload([("model.onnx", add_model_bytes(bias=1.5))]),
            actor=person.actor,
            derivation=derivation,
        )
    version.refresh_from_db()
    return version


@pytest.fixture
def history(mia: Person, ada: Person) -> tuple[ModelVersion, ModelVersion]:
    """v1 (with its lineage and a benchmark) served on production from ada's approval until v2, its fp16 child."""
    create_model(mia)
    datasets = json.dumps([{"name": "imagenet|1k", "digest": "sha256:0c1d"}])
    response = mia.upload(
        "demo",
        [("model.onnx", add_model_bytes(bias=1.0))],
        description="<b>first</b> *cut* [x](javascript:alert(1))",
        source_run_url=RUN,
        source_commit="4f2a9c1d",
        source_datasets=datasets,
    )
    assert response.status_code == 201, response.content
    v1 = ModelVersion.objects.get(version=1)
    record_benchmark(v1, p99_ms=12.5)
    promote(mia, ada, 1)
    v2 = derived(v1, mia)
    assert v2.status == "ready", v2.errors
    promote(mia, ada, 2)
    ModelVersion.objects.filter(pk=v1.pk).update(last_served_at=timezone.now())
    return v1, v2


def headings(text: str) -> list[str]:
    return [line[3:] for line in text.splitlines() if line.startswith("## ")]


def section(text: str, title: str) -> str:
    """The Markdown of one section, from its heading to the next."""
    return re.split(r"^## ", text, flags=re.MULTILINE)[SECTION_TITLES.index(title) + 1]


def test_the_card_lists_every_section_with_the_versions_values(mia, ada, history):
    v1, _ = history
    response = mia.get(CARD.format(1))
    assert response.status_code == 200
    assert response["Content-Type"] == "text/markdown; charset=utf-8"
    assert response["Content-Disposition"] == 'attachment; filename="demo-v1-card.md"'
    text = response.content.decode()
    assert text.startswith("# Model card: demo v1\n")
    assert headings(text) == list(SECTION_TITLES)

    summary = section(text, "Summary")
    assert f"- **sha256:** {v1.sha256}" in summary
    assert "- **Uploaded by:** mia" in summary and "- **Lifecycle:** active" in summary
    assert "- **Status:** ready" in summary
    # What a person typed is escaped: no HTML, no emphasis, no link.
    assert r"- **Description:** \<b\>first\</b\> \*cut\* \[x\](javascript:alert(1))" in summary
    assert f"| model.onnx | model | {v1.size_bytes} bytes | {v1.sha256} |" in summary

    assert r"| input | x | FP32 | \[-1, 4\] |" in section(text, "Signature")  # rendered: [-1, 4]
    validation = section(text, "Validation")
    assert "- **Result:** ready" in validation and "**Errors:** none" in validation
    benchmarks = section(text, "Benchmarks")
    assert f"| {CPU} | cpu | succeeded | 0.25 s | 6.25 ms | 12.50 ms | batch 32: 1900/s |" in benchmarks
    assert "- **Measured:** none: it was not derived by the registry" in section(text, "Accuracy deltas")
    provenance = section(text, "Provenance")
    signature = v1.signatures.get()
    assert f"| registry | modelyard | {signature.key_id} |" in provenance

    lineage = section(text, "Lineage")
    assert f"- **Training run:** [{md_text(RUN)}](<{RUN}>)" in lineage
    assert "- **Code commit:** 4f2a9c1d" in lineage and "- **Parent:** none" in lineage
    assert r"| imagenet\|1k | sha256:0c1d |" in lineage  # a | in a name does not split the table's cell
    assert "| [v2](<http://testserver/ui/models/demo/versions/2>) | derived by the registry (fp16) |" in lineage

    promotions = section(text, "Promotion history")
    move = re.search(
        r"^\| [0-9-]+ [0-9:]+ UTC \| production \| approval \| none \| (\w+) \| (\w+) \|", promotions, re.M
    )
    assert move is not None and move.group(2) == "ada", promotions  # the approver of the request
    assert re.search(r"\| #\d+ \| production \| move \| approved \| mia \| .* \| ada \|", promotions)

    served = section(text, "Served")
    assert "- **Aliases on it now:** none" in served
    assert (
        "- **Last loaded by an inference process:** " in served
        and "**Last loaded by an inference process:** none" not in served
    )
    assert re.search(r"^\| production \| [0-9-]+ [0-9:]+ UTC \| [0-9-]+ [0-9:]+ UTC \| \w+ \| \w+ \|$", served, re.M)


def test_a_derived_versions_card_has_its_accuracy_delta_and_parent(mia, history):
    text = mia.get(CARD.format(2)).content.decode()
    assert headings(text) == list(SECTION_TITLES)
    accuracy = section(text, "Accuracy deltas")
    assert "- **Against:** v1" in accuracy and "- **On:** synthetic inputs" in accuracy
    assert "| y | 0.0004882812 | 0.0001 | 0.9999997 | none |" in accuracy
    lineage = section(text, "Lineage")
    assert "- **Parent:** [v1](<http://testserver/ui/models/demo/versions/1>)" in lineage
    assert "- **Parent is:** derived by the registry (fp16)" in lineage
    assert "- **Aliases on it now:** production" in section(text, "Served")
    assert "| production | " in section(text, "Served") and "| now |" in section(text, "Served")
    kinds = {s.kind for s in ModelVersion.objects.get(version=2).signatures.all()}
    assert kinds == {"registry", "derivation"}
    assert "| derivation | modelyard |" in section(text, "Provenance")


def test_a_fresh_version_says_none_in_each_empty_section(mia):
    create_model(mia)
    assert mia.upload("demo", [("model.onnx", add_model_bytes(bias=1.0))]).status_code == 201
    text = mia.get(CARD.format(1)).content.decode()
    assert headings(text) == list(SECTION_TITLES)
    for line in (
        "**Moves to this version:** none",
        "**Promotion requests:** none",
        "**Periods an alias pointed at it:** none",
        "**Datasets:** none",
        "**Children:** none",
        "- **Training run:** none",
        "- **Legal hold:** none",
        "**Warnings:** none",
    ):
        assert line in text, line


def test_a_deleted_versions_card_is_its_tombstone(mia, history):
    v1, _ = history
    root = make_person("root", Role.ADMIN)
    deleted_by = root.actor.user
    ModelVersion.objects.filter(pk=v1.pk).update(
        deleted_at=timezone.now(), deleted_by=deleted_by, delete_reason="trained on withdrawn data"
    )
    response = mia.get(CARD.format(1))
    assert response.status_code == 200
    summary = section(response.content.decode(), "Summary")
    assert "- **Lifecycle:** deleted" in summary
    assert "- **Deleted by:** root" in summary and "- **Why:** trained on withdrawn data" in summary
    assert "- **Its files:** being removed from storage" in summary


def test_any_signed_in_user_reads_a_card_and_nobody_else(mia, outsider, history):
    assert outsider.get(CARD.format(1)).status_code == 200
    anonymous = mia.client.get(CARD.format(1))
    assert anonymous.status_code == 401
    missing = mia.get(CARD.format(9))
    assert (missing.status_code, missing.json()["error"]) == (404, "model 'demo' has no version 9")
    assert mia.get("/api/v1/models/nope/versions/1/card").status_code == 404


def test_multi_line_errors_are_fenced_so_nothing_in_them_is_markup(mia):
    create_model(mia)
    assert mia.upload("demo", [("model.onnx", add_model_bytes(bias=1.0))]).status_code == 201
    ModelVersion.objects.filter(version=1).update(
        status="failed", errors=["bad graph\n```\n# not a heading\n<script>x</script>"], warnings=["one *line*"]
    )
    text = mia.get(CARD.format(1)).content.decode()
    validation = section(text, "Validation")
    assert "````text\nbad graph\n```\n# not a heading\n<script>x</script>\n````" in validation
    assert r"- one \*line\*" in validation
    assert headings(text) == list(SECTION_TITLES)
