"""Whether a version's concurrent requests are merged, and why: the version API and page, the model's form.

The model's ``batching`` (auto: as validation's check found; on; off) and ``max_batch_size`` (0: the
model does not batch) decide it with the version's ``batch_check`` (``tests/registry/test_batch_check.py``).
"""

from __future__ import annotations

import pytest

from registry.models import AuditEvent, ModelVersion, RegisteredModel, Role
from tests.support.onnx_models import first_dim_model
from tests.support.people import login_person
from tests.support.registry import create_model, upload_versions

pytestmark = pytest.mark.django_db

UNSAFE = (
    "output 'y' of two synthetic samples run together differs from each run alone by up to 0.438 "
    "(tolerance 0.0001): the first dimension is not a batch"
)
SAFE = (
    "two synthetic samples run together gave the outputs each gave alone (largest difference 0, "
    "tolerance 0.0001): the first dimension is a batch"
)


@pytest.fixture
def maintainer():
    return login_person("mia", Role.MAINTAINER)


@pytest.fixture
def viewer():
    return login_person("vic", Role.VIEWER)


def upload(person, kind: str) -> int:
    response = person.upload("demo", [("model.onnx", first_dim_model(kind).SerializeToString())])
    assert response.status_code == 201, response.content
    return response.json()["version"]


def batching_of(person, number: int) -> dict:
    return person.get(f"/api/v1/models/demo/versions/{number}").json()["batching"]


def test_a_version_whose_first_dimension_is_not_a_batch_is_served_without_merging(maintainer):
    create_model(maintainer)
    number = upload(maintainer, "softmax0")
    assert batching_of(maintainer, number) == {
        "merges": False,
        "reason": UNSAFE,
        "check": "unsafe",
        "check_note": UNSAFE,
    }
    page = maintainer.client.get(f"/ui/models/demo/versions/{number}").content.decode()
    assert '<dd class="wrap" id="batching" data-merges="false"><strong>requests not merged</strong>: ' in page
    assert "differs from each run alone by up to 0.438" in page


def test_a_batch_safe_version_merges_and_the_page_says_why(maintainer):
    create_model(maintainer)
    [version] = upload_versions(maintainer, [1.0])
    assert batching_of(maintainer, version.version) == {
        "merges": True,
        "reason": SAFE,
        "check": "safe",
        "check_note": SAFE,
    }
    page = maintainer.client.get(f"/ui/models/demo/versions/{version.version}").content.decode()
    assert 'data-merges="true"><strong>requests merged</strong>: two synthetic samples run together' in page


def test_the_model_setting_turns_merging_on_or_off_whatever_the_check_found(maintainer):
    create_model(maintainer)
    unsafe, safe = upload(maintainer, "softmax0"), upload(maintainer, "softmax1")
    assert maintainer.patch("/api/v1/models/demo", {"batching": "on"}).status_code == 200
    assert batching_of(maintainer, unsafe)["merges"] is True
    assert batching_of(maintainer, unsafe)["reason"] == f"the model's batching is on (validation: {UNSAFE})"
    assert batching_of(maintainer, safe)["reason"] == "the model's batching is on"
    assert maintainer.patch("/api/v1/models/demo", {"batching": "off"}).status_code == 200
    assert batching_of(maintainer, safe) == {
        "merges": False,
        "reason": "the model's batching is off",
        "check": "safe",
        "check_note": SAFE,
    }


def test_max_batch_size_0_never_merges_even_when_batching_is_on(maintainer):
    create_model(maintainer)
    number = upload(maintainer, "softmax1")
    response = maintainer.patch("/api/v1/models/demo", {"batching": "on", "max_batch_size": 0})
    assert response.status_code == 200, response.content
    assert batching_of(maintainer, number)["merges"] is False
    assert batching_of(maintainer, number)["reason"] == "the model's max_batch_size is 0: it does not batch"
    assert b"requests never merged (max_batch_size 0)" in maintainer.client.get("/ui/models/demo").content


def test_a_version_validated_before_the_check_is_served_without_merging_and_says_so(maintainer):
    create_model(maintainer)
    [version] = upload_versions(maintainer, [1.0])
    ModelVersion.objects.filter(pk=version.pk).update(batch_check="unchecked", batch_note="")
    assert batching_of(maintainer, version.version) == {
        "merges": False,
        "reason": "validated before Modelyard checked whether requests may be merged; unchecked, it is served "
        "without merging (set the model's batching to on to merge)",
        "check": "unchecked",
        "check_note": "",
    }


def test_the_batching_form_with_only_its_required_field_keeps_max_batch_size(maintainer):
    create_model(maintainer)
    response = maintainer.client.post("/ui/models/demo/batching", {"batching": "off", "max_batch_size": ""})
    assert (response.status_code, response["Location"]) == (302, "/ui/models/demo")
    model = RegisteredModel.objects.get(name="demo")
    assert (model.batching, model.max_batch_size) == ("off", 32)
    event = AuditEvent.objects.get(action="model.update")
    assert (event.actor, event.before, event.after) == ("mia", {"batching": "auto"}, {"batching": "off"})
    assert b"requests never merged (batching off)" in maintainer.client.get("/ui/models/demo").content


def test_the_batching_form_takes_max_batch_size_0(maintainer):
    create_model(maintainer)
    response = maintainer.client.post("/ui/models/demo/batching", {"batching": "auto", "max_batch_size": "0"})
    assert response.status_code == 302
    model = RegisteredModel.objects.get(name="demo")
    assert (model.batching, model.max_batch_size) == ("auto", 0)


@pytest.mark.parametrize(
    ("data", "error"),
    [
        ({"batching": "maybe"}, "batching: Select a valid choice. maybe is not one of the available choices."),
        (
            {"batching": "on", "max_batch_size": "-1"},
            "max_batch_size: Ensure this value is greater than or equal to 0.",
        ),
        (
            {"batching": "on", "max_batch_size": "5000"},
            "max_batch_size: Ensure this value is less than or equal to 4096.",
        ),
        ({}, "batching: This field is required."),
    ],
)
def test_a_bad_batching_form_is_400_with_the_message(maintainer, data, error):
    create_model(maintainer)
    response = maintainer.client.post("/ui/models/demo/batching", data)
    assert (response.status_code, response.context["error"]) == (400, error)
    model = RegisteredModel.objects.get(name="demo")
    assert (model.batching, model.max_batch_size) == ("auto", 32)


def test_a_viewer_cannot_change_batching_and_the_refusal_is_audited(maintainer, viewer):
    create_model(maintainer)
    response = viewer.client.post("/ui/models/demo/batching", {"batching": "off"})
    assert (response.status_code, response.context["error"]) == (
        403,
        "changing a model's batching needs the maintainer role",
    )
    assert RegisteredModel.objects.get(name="demo").batching == "auto"
    assert list(AuditEvent.objects.filter(action="access.denied").values_list("target", flat=True)) == [
        "POST /ui/models/demo/batching"
    ]
    assert b'id="batching"' not in viewer.client.get("/ui/models/demo").content
