from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from rest_framework import serializers
from rest_framework.fields import empty
from rest_framework.utils import html

from registry.lifecycle.lineage import PARENT_PROBLEM
from registry.models import (
    NAME_PATTERN,
    Batching,
    ModelFile,
    ModelVersion,
    RegisteredModel,
    ServingStrategy,
    tags_problem,
)


class ModelSerializer(serializers.ModelSerializer[RegisteredModel]):
    created_by = serializers.CharField(source="created_by.username", default=None, allow_null=True, read_only=True)

    class Meta:
        model = RegisteredModel
        fields = [
            "name",
            "description",
            "tags",
            "serving_strategy",
            "batching",
            "max_batch_size",
            "max_queue_delay_us",
            "max_queue_size",
            "instances",
            "last_version",
            "retention",
            "created_by",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields


class FormListField(serializers.ListField):
    """A list that a form sends as repeated fields, where one empty field (``-F tags=``, a box left empty) is no items.

    DRF reads that field as a list of one empty string, which no item allows. No items is the empty list,
    or, with ``empty_is_unset``, the field not sent at all (for a list that may not be empty).
    """

    def __init__(self, *args: Any, empty_is_unset: bool = False, **kwargs: Any) -> None:
        self.empty_is_unset = empty_is_unset
        super().__init__(*args, **kwargs)

    def get_value(self, dictionary: Any) -> Any:
        value = super().get_value(dictionary)
        if html.is_html_input(dictionary) and isinstance(value, list) and value and not any(value):
            return empty if self.empty_is_unset else []
        return value


class FormJSONField(serializers.JSONField):
    """Any JSON value in a JSON body. A form field holds JSON text or, when it is not JSON, a plain string
    (``-F recipe=fp16``); an empty one is not sent."""

    def get_value(self, dictionary: Any) -> Any:
        if not (html.is_html_input(dictionary) and self.field_name in dictionary):
            return super().get_value(dictionary)
        text = dictionary[self.field_name]
        if text == "":
            return empty
        try:
            return json.loads(text)
        except ValueError:
            return text


class TagsField(FormListField):
    """A model's or a version's tags, within ``MODELYARD_MAX_TAGS`` and ``MODELYARD_MAX_TAG_CHARS``."""

    child = serializers.CharField()

    def to_internal_value(self, data: Any) -> list[str]:
        if isinstance(data, list) and len(data) > settings.MAX_TAGS:  # before looking at each one
            raise serializers.ValidationError(tags_problem(data))
        tags: list[str] = super().to_internal_value(data)
        if problem := tags_problem(tags):
            raise serializers.ValidationError(problem)
        return tags


class ReasonInput(serializers.Serializer[Any]):
    """The optional reason of an action on an alias or a rollout (a rollback, a pause), kept in its audit event."""

    reason = serializers.CharField(required=False, allow_blank=True, default="", max_length=2000)


class ModelCreateInput(serializers.Serializer[Any]):
    name = serializers.RegexField(
        NAME_PATTERN,
        max_length=64,
        error_messages={
            "invalid": "invalid model name: use 1-64 characters of lowercase letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        },
    )
    description = serializers.CharField(required=False, allow_blank=True, default="", max_length=10_000)
    tags = TagsField(required=False, default=list)


class ModelUpdateInput(serializers.Serializer[Any]):
    description = serializers.CharField(required=False, allow_blank=True, max_length=10_000)
    tags = TagsField(required=False)
    serving_strategy = serializers.ChoiceField(choices=ServingStrategy.values, required=False)
    # auto: merge concurrent requests when validation found it safe; on, off: whatever it found
    batching = serializers.ChoiceField(choices=Batching.values, required=False)
    # 0: the model does not batch (Triton's max_batch_size 0): requests are never merged
    max_batch_size = serializers.IntegerField(min_value=0, max_value=4096, required=False)
    max_queue_delay_us = serializers.IntegerField(min_value=0, max_value=10_000_000, required=False)
    max_queue_size = serializers.IntegerField(min_value=1, max_value=1_000_000, required=False)
    # null: by provider (1 on the CPU, 2 on a GPU)
    instances = serializers.IntegerField(min_value=1, max_value=16, required=False, allow_null=True)


class FileSerializer(serializers.ModelSerializer[ModelFile]):
    class Meta:
        model = ModelFile
        fields = ["name", "role", "sha256", "size_bytes"]


class VersionSerializer(serializers.ModelSerializer[ModelVersion]):
    model = serializers.CharField(source="model.name", read_only=True)
    files = FileSerializer(many=True, read_only=True)
    created_by = serializers.CharField(source="created_by.username", default=None, allow_null=True, read_only=True)
    derived_from = serializers.IntegerField(
        source="derived_from.version", default=None, allow_null=True, read_only=True
    )
    batching = serializers.SerializerMethodField()
    lifecycle = serializers.SerializerMethodField()

    class Meta:
        model = ModelVersion
        fields = [
            "model",
            "version",
            "status",
            "description",
            "tags",
            "metadata",
            "sha256",
            "size_bytes",
            "files",
            "signature",
            "ir_version",
            "opset",
            "producer",
            "errors",
            "warnings",
            "created_by",
            "created_at",
            "validated_at",
            "derived_from",
            "recipe",
            "accuracy",
            "source_run_url",
            "source_commit",
            "source_datasets",
            "batching",
            "lifecycle",
        ]
        read_only_fields = fields

    def get_batching(self, version: ModelVersion) -> dict[str, Any]:
        """Whether inference processes merge its concurrent requests and why; what validation's check found."""
        decision = version.batching_decision()
        return {
            "merges": decision.merges,
            "reason": decision.reason,
            "check": version.batch_check,
            "check_note": version.batch_note,
        }

    def get_lifecycle(self, version: ModelVersion) -> dict[str, Any]:
        """Active, archived or deleted (a tombstone: who, when, why, whether its files are gone), and any legal hold."""
        return {
            "state": version.lifecycle,
            "archived_at": version.archived_at,
            "archived_by": _username(version.archived_by),
            "hold": None
            if version.held_at is None
            else {"at": version.held_at, "by": _username(version.held_by), "reason": version.hold_reason},
            "deleted": None
            if version.deleted_at is None
            else {
                "at": version.deleted_at,
                "by": _username(version.deleted_by),
                "reason": version.delete_reason,
                "files_removed": version.purged_at is not None,
                "files_removed_at": version.purged_at,
            },
            "last_served_at": version.last_served_at,
        }


def _username(user: Any) -> str | None:
    return user.username if user is not None else None


class VersionUpdateInput(serializers.Serializer[Any]):
    """What may change on a version after its upload: its files and metadata never do."""

    description = serializers.CharField(required=False, allow_blank=True, max_length=10_000)
    tags = TagsField(required=False)
    # Its lineage, changed only by its uploader or an admin; registry/lifecycle/lineage.py checks each value.
    source_run_url = serializers.CharField(
        required=False, allow_blank=True, help_text="the training run: an http or https URL; empty clears it"
    )
    source_commit = serializers.CharField(
        required=False, allow_blank=True, help_text="the code's commit: 7 to 64 hex characters; empty clears it"
    )
    source_datasets = FormJSONField(
        required=False, help_text='the datasets it was trained on: [{"name": ..., "digest": ...}]; [] clears them'
    )
    # DRF's metaclass takes declared fields off the class, so this does not shadow Field.parent at run time.
    parent = serializers.IntegerField(  # type: ignore[assignment]
        required=False,
        allow_null=True,
        min_value=1,
        error_messages={key: PARENT_PROBLEM for key in ("invalid", "min_value", "max_string_length")},
        help_text="the number of an earlier version of the model it came from; null clears it",
    )
