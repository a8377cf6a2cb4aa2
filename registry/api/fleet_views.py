"""The fleet: what each inference process reports it serves (read through ``registry.serving``)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from registry import serving


class TrafficBucketSerializer(serializers.Serializer[serving.TrafficBucket]):
    start = serializers.FloatField(help_text="seconds since the epoch")
    seconds = serializers.FloatField(help_text="the interval's length; less for the one still filling")
    requests = serializers.IntegerField()
    # DRF takes declared fields out of the class, so this does not shadow Serializer.errors at run time.
    errors = serializers.IntegerField()  # type: ignore[assignment]
    p50_ms = serializers.FloatField(allow_null=True)
    p99_ms = serializers.FloatField(allow_null=True)


class TrafficTotalsSerializer(serializers.Serializer[serving.TrafficTotals]):
    requests = serializers.IntegerField()
    errors = serializers.IntegerField()  # type: ignore[assignment]
    latency = serializers.DictField(
        child=serializers.IntegerField(), help_text="latency bin (upper edges 0.1 ms * 2**(i/4)) -> requests"
    )


class LoadedRowSerializer(serializers.Serializer[serving.LoadedRow]):
    model = serializers.CharField()
    version = serializers.IntegerField()
    aliases = serializers.ListField(child=serializers.CharField())
    state = serializers.ChoiceField(choices=serving.LoadState.choices)
    error = serializers.CharField()
    load_seconds = serializers.FloatField(allow_null=True)
    memory_bytes = serializers.IntegerField(allow_null=True)
    provider = serializers.CharField()
    note = serializers.CharField()
    attempts = serializers.IntegerField()
    instances = serializers.IntegerField(help_text="batches run at once on the shared session; 0 when not loaded")
    batching = serializers.BooleanField(
        allow_null=True, help_text="whether it merges concurrent requests into one run; null when not loaded"
    )
    batching_reason = serializers.CharField(help_text="why it merges requests or not")
    traffic = TrafficBucketSerializer(many=True, help_text="the last minutes of requests, 10-second intervals")
    totals = TrafficTotalsSerializer(
        help_text="every request since the version loaded (what rollout steps are measured on)"
    )
    splits = serializers.DictField(
        child=serializers.IntegerField(),
        help_text="alias -> the share of its requests (percent) this version answers in a rollout",
    )
    shadows = serializers.ListField(
        child=serializers.CharField(), help_text="the aliases whose requests it answers on the side, as a shadow"
    )


class DeviceSerializer(serializers.Serializer[serving.DeviceRow]):
    index = serializers.IntegerField()
    name = serializers.CharField()
    memory_used_bytes = serializers.IntegerField(allow_null=True)
    memory_total_bytes = serializers.IntegerField(allow_null=True)


class WorkerSerializer(serializers.Serializer[serving.FleetWorker]):
    worker_id = serializers.CharField()
    host = serializers.CharField()
    pid = serializers.IntegerField()
    device = serializers.CharField()
    provider = serializers.CharField()
    online = serializers.BooleanField()
    heartbeat_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField()
    loaded = LoadedRowSerializer(many=True)
    devices = DeviceSerializer(many=True)  # GPUs and their memory in use (NVML); empty without one
    notice = serializers.CharField(help_text="why it serves on the CPU though a GPU was asked for; '' otherwise")
    # DRF takes declared fields out of the class, so this does not shadow Serializer.errors at run time.
    errors = serializers.ListField(child=serializers.CharField())  # type: ignore[assignment]


class FleetList(APIView):
    @extend_schema(responses=WorkerSerializer(many=True))
    def get(self, request: Request) -> Response:
        workers = serving.fleet_list(online_only=request.query_params.get("online") == "true")
        return Response([WorkerSerializer(worker).data for worker in workers])
