"""The fleet: what each inference process reports it serves."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from registry.models import InferenceWorker


def offline_after() -> timedelta:
    return timedelta(seconds=max(3 * settings.FLEET_HEARTBEAT_SECONDS, 15))


class WorkerSerializer(serializers.ModelSerializer[InferenceWorker]):
    online = serializers.SerializerMethodField()

    class Meta:
        model = InferenceWorker
        fields = [
            "worker_id",
            "host",
            "pid",
            "device",
            "provider",
            "online",
            "heartbeat_at",
            "started_at",
            "loaded",
            "errors",
        ]

    def get_online(self, worker: InferenceWorker) -> bool:
        return worker.heartbeat_at >= timezone.now() - offline_after()


class FleetList(APIView):
    @extend_schema(responses=WorkerSerializer(many=True))
    def get(self, request: Request) -> Response:
        workers = InferenceWorker.objects.order_by("worker_id")
        if request.query_params.get("online") == "true":
            workers = workers.filter(heartbeat_at__gte=timezone.now() - offline_after())
        return Response(WorkerSerializer(workers, many=True).data)


def laggards(*, model: str, alias: str, version: int) -> list[dict[str, Any]]:
    """Inference workers that do not serve ``version`` under ``alias``.

    Online workers that have not loaded it (yet, or at all), and workers that went offline within
    ``MODELYARD_FLEET_FORGET_SECONDS`` without leaving the fleet: cut off from the registry, they
    may well go on serving their last version to whoever still reaches them, which is what an
    operator waiting on a promotion needs to hear. A cleanly stopped worker has left the fleet.
    """
    now = timezone.now()
    online_since = now - offline_after()
    workers = InferenceWorker.objects.filter(heartbeat_at__gte=now - timedelta(seconds=settings.FLEET_FORGET_SECONDS))
    behind = []
    for worker in workers:
        serving = [
            row
            for row in worker.loaded
            if row.get("model") == model and alias in row.get("aliases", []) and row.get("state") == "ready"
        ]
        if any(row["version"] == version for row in serving):
            continue
        if worker.heartbeat_at < online_since:
            state, error = "offline", f"no heartbeat since {worker.heartbeat_at.isoformat()}"
        else:
            failed = [r for r in worker.loaded if r.get("model") == model and r.get("version") == version]
            state = failed[0]["state"] if failed else "not loaded"
            error = failed[0].get("error", "") if failed else ""
        behind.append(
            {
                "worker_id": worker.worker_id,
                "serving": serving[0]["version"] if serving else None,
                "state": state,
                "error": error,
            }
        )
    return behind


def wait_for_fleet(*, model: str, alias: str, version: int, timeout: float) -> list[dict[str, Any]]:
    """Poll the fleet until every online worker serves the version; returns the laggards left.

    Offline workers cannot catch up while they are cut off, so they do not hold the wait up; they
    are named among the laggards all the same.
    """
    deadline = time.monotonic() + timeout
    while True:
        behind = laggards(model=model, alias=alias, version=version)
        if all(lag["state"] == "offline" for lag in behind) or time.monotonic() >= deadline:
            return behind
        time.sleep(0.1)
