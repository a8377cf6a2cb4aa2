"""Least-privilege tokens on a real ``modelyard serve --role inference``, over /v2 HTTP and gRPC (tritonclient).

A token limited to the ``inference`` role on ``fraud-*`` infers on ``fraud-scorer`` (real ONNX Runtime) and is
refused with 403 / PERMISSION_DENIED on ``other``; 401 / UNAUTHENTICATED is only for a missing or unknown token.
A rotated token works during its overlap and not after; taking a role from the user takes it from the token.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from django.utils import timezone
from tritonclient.utils import InferenceServerException

from inference.dataplane import NEEDS_ROLE, NEEDS_TOKEN
from registry.access import services
from registry.access.scopes import out_of_scope_message
from registry.audit.chain import SYSTEM
from registry.models import ApiToken, AuditEvent, Role
from tests.support.inference import infer_body
from tests.support.polling import eventually
from tests.support.processes import ServeProcess
from tests.support.registry import create_model, promote, upload_versions

pytestmark = pytest.mark.django_db(transaction=True)

X = np.arange(8, dtype=np.float32).reshape(2, 4)
OTHER_REFUSAL = out_of_scope_message("other", ["fraud-*"])


def infer(server: ServeProcess, model: str, token: str | None) -> tuple[int, Any]:
    return server.request("POST", f"/v2/models/{model}/infer", infer_body(X), token=token)


def grpc_infer(server: ServeProcess, model: str, token: str | None) -> np.ndarray:
    headers = {"authorization": f"Bearer {token}"} if token else None
    with grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as client:
        item = grpcclient.InferInput("x", list(X.shape), "FP32")
        item.set_data_from_numpy(X)
        answer = client.infer(model, [item], headers=headers).as_numpy("y")
        assert answer is not None
        return answer


def grpc_refusal(server: ServeProcess, model: str, token: str | None) -> tuple[str, str]:
    with pytest.raises(InferenceServerException) as caught:
        grpc_infer(server, model, token)
    return str(caught.value.status()), str(caught.value.message())


def register(owner: Any, approver: Any, name: str, bias: float) -> None:
    create_model(owner, name)
    upload_versions(owner, [bias], model=name)
    promote(owner, approver, 1, model=name)


def test_a_token_limited_to_inference_on_fraud_models_is_refused_elsewhere_with_403_over_http_and_grpc(
    owner, approver, admin, start_server
):
    register(owner, approver, "fraud-scorer", 1.0)
    register(owner, approver, "other", 2.0)
    # The pipeline's user may also maintain models; its token carries only inference, on fraud-* only.
    token, scoped = services.token_create(
        username="pipeline",
        create_user=True,
        roles=[Role.INFERENCE, Role.MAINTAINER],
        only_roles=[Role.INFERENCE],
        model_patterns=["fraud-*"],
        actor=SYSTEM,
    )
    server = start_server("scoped", extra_env={"MODELYARD_INFERENCE_PUBLIC": "false"})
    eventually(lambda: infer(server, "fraud-scorer", scoped)[0] == 200, timeout=60, what="fraud-scorer not served")
    eventually(lambda: server.request("GET", "/v2/models/other/ready", token=admin.token)[0] == 200, timeout=60)

    # HTTP: its model answers (y = x + 1, from ONNX Runtime); another model is 403 with the reason.
    status, body = infer(server, "fraud-scorer", scoped)
    assert status == 200
    assert np.array_equal(np.array(body["outputs"][0]["data"], np.float32).reshape(2, 4), X + 1)
    assert infer(server, "other", scoped) == (403, {"error": OTHER_REFUSAL})
    assert server.request("GET", "/v2/models/other", token=scoped) == (403, {"error": OTHER_REFUSAL})
    assert server.request("GET", "/v2/models/fraud-scorer", token=scoped)[0] == 200
    # The repository index shows it only its own models.
    status, index = server.request("POST", "/v2/repository/index", {}, token=scoped)
    assert status == 200
    assert {entry["name"] for entry in index} == {"fraud-scorer"}
    status, index = server.request("POST", "/v2/repository/index", {}, token=admin.token)
    assert {entry["name"] for entry in index} == {"fraud-scorer", "other"}
    # 401 only for a missing or unknown token; a maintainer's valid token without the inference role is 403.
    assert infer(server, "fraud-scorer", None) == (401, {"error": NEEDS_TOKEN})
    assert infer(server, "fraud-scorer", "my_0123456789ab_unknown") == (401, {"error": NEEDS_TOKEN})
    assert infer(server, "fraud-scorer", owner.token) == (403, {"error": NEEDS_ROLE})

    # gRPC, through tritonclient: the same verdicts.
    assert np.array_equal(grpc_infer(server, "fraud-scorer", scoped), X + 1)
    assert grpc_refusal(server, "other", scoped) == ("StatusCode.PERMISSION_DENIED", OTHER_REFUSAL)
    assert grpc_refusal(server, "fraud-scorer", owner.token) == ("StatusCode.PERMISSION_DENIED", NEEDS_ROLE)
    assert grpc_refusal(server, "fraud-scorer", None) == ("StatusCode.UNAUTHENTICATED", NEEDS_TOKEN)
    assert grpc_refusal(server, "fraud-scorer", "my_0123456789ab_unknown") == (
        "StatusCode.UNAUTHENTICATED",
        NEEDS_TOKEN,
    )
    with grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as client:
        headers = {"authorization": f"Bearer {scoped}"}
        assert client.is_model_ready("fraud-scorer", headers=headers)
        with pytest.raises(InferenceServerException) as caught:
            client.get_model_metadata("other", headers=headers)
        assert (caught.value.status(), caught.value.message()) == ("StatusCode.PERMISSION_DENIED", OTHER_REFUSAL)
        names = {model.name for model in client.get_model_repository_index(headers=headers).models}
        assert names == {"fraud-scorer"}

    # Rotation: the new token has the same limits; the old one works during the overlap, and not after it.
    rotated, fresh = services.token_rotate(token=token, overlap=timedelta(hours=24), actor=SYSTEM)
    assert (rotated.roles, rotated.model_patterns) == ([Role.INFERENCE], ["fraud-*"])
    assert infer(server, "fraud-scorer", fresh)[0] == 200
    assert infer(server, "other", fresh) == (403, {"error": OTHER_REFUSAL})
    assert infer(server, "fraud-scorer", scoped)[0] == 200  # within the overlap
    assert np.array_equal(grpc_infer(server, "fraud-scorer", scoped), X + 1)
    # The overlap passes (moved in the database, as 24 hours would): the old token is refused within the cache's TTL.
    ApiToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    eventually(lambda: infer(server, "fraud-scorer", scoped)[0] == 401, timeout=15, what="the old token still works")
    assert grpc_refusal(server, "fraud-scorer", scoped) == ("StatusCode.UNAUTHENTICATED", NEEDS_TOKEN)
    assert infer(server, "fraud-scorer", fresh)[0] == 200
    rotate = AuditEvent.objects.get(action="token.rotate", target=token.prefix)
    assert rotate.after["replaced_by"] == rotated.prefix

    # Taking the inference role from the user takes it from every token of theirs (within the cache's TTL).
    services.user_update_access(username="pipeline", roles=[Role.MAINTAINER], actor=admin.actor)
    eventually(
        lambda: infer(server, "fraud-scorer", fresh) == (403, {"error": NEEDS_ROLE}),
        timeout=15,
        what="the token kept a role its user lost",
    )
    assert grpc_refusal(server, "fraud-scorer", fresh) == ("StatusCode.PERMISSION_DENIED", NEEDS_ROLE)
    revoked = AuditEvent.objects.get(action="user.roles.revoke", target="pipeline")
    assert revoked.after == {"roles": [Role.INFERENCE]}
