"""The web UI's forms: what each page accepts, with the REST API's limits and wording.

A form only checks shape (lengths, patterns, numbers); the rules of the registry stay in the
services, whose refusals the views show as they come.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django import forms
from django.utils import timezone

from registry.models import NAME_PATTERN, Batching, PriorityClass, Role, tags_problem

NAME_MESSAGE = (
    "invalid model name: use 1-64 characters of lowercase letters, digits, '.', '_' or '-', "
    "starting with a letter or digit"
)


class UiForm(forms.Form):
    def error_text(self) -> str:
        """Every error on one line, each after its field's name, for the page's alert."""
        return "; ".join(
            f"{field}: {' '.join(str(error) for error in errors)}"
            if field != "__all__"
            else " ".join(str(error) for error in errors)
            for field, errors in self.errors.items()
        )


class ReasonForm(UiForm):
    """The reason given with a decision or rollback: the API's limits, and no NUL (PostgreSQL refuses it)."""

    reason = forms.CharField(required=False, max_length=2000)


class TagsField(forms.CharField):
    """Tags as one line, separated by commas or spaces; the API's limits (``registry.models.tags_problem``)."""

    def to_python(self, value: Any) -> list[str]:  # type: ignore[override]
        text = super().to_python(value) or ""
        tags = list(dict.fromkeys(tag for tag in re.split(r"[,\s]+", text) if tag))
        if problem := tags_problem(tags):
            raise forms.ValidationError(problem)
        return tags


class ModelEditForm(UiForm):
    description = forms.CharField(required=False, max_length=10_000, widget=forms.Textarea)
    tags = TagsField(required=False, max_length=4000)


class VersionEditForm(ModelEditForm):
    """A version's description and tags, edited after its upload."""


class ModelBatchingForm(UiForm):
    """Whether a model's concurrent requests are merged, and into batches of how many rows (empty: unchanged)."""

    batching = forms.ChoiceField(choices=Batching.choices)
    max_batch_size = forms.IntegerField(required=False, min_value=0, max_value=4096)


class ModelCreateForm(ModelEditForm):
    name = forms.RegexField(NAME_PATTERN, max_length=64, error_messages={"invalid": NAME_MESSAGE})


class PromotionRequestForm(UiForm):
    alias = forms.RegexField(
        NAME_PATTERN,
        max_length=64,
        error_messages={"invalid": "use lowercase letters, digits, '.', '_' or '-', starting with a letter or digit"},
    )
    version = forms.IntegerField(min_value=1)
    reason = forms.CharField(required=False, max_length=2000)
    force = forms.BooleanField(required=False)


class NamesField(forms.CharField):
    """Names on one line, separated by commas or spaces; an empty box is no names."""

    def to_python(self, value: Any) -> list[str]:  # type: ignore[override]
        text = super().to_python(value) or ""
        return list(dict.fromkeys(name for name in re.split(r"[,\s]+", text) if name))


class AliasSignatureForm(UiForm):
    """Whether an alias requires an uploader's signature, and by which of MODELYARD_TRUSTED_SIGNERS (empty: any)."""

    require_signature = forms.BooleanField(required=False)
    trusted_signers = NamesField(required=False, max_length=4000)


class AliasCacheForm(UiForm):
    """An alias's response cache: both bounds turn it on, both empty turn it off (their ranges are the service's)."""

    max_bytes = forms.IntegerField(required=False)
    ttl_seconds = forms.IntegerField(required=False)


# What an empty Sample box stands for: the API's default (``registry/api/shadow_views.py``).
SHADOW_DEFAULT_SAMPLE = 0.1


class ShadowStartForm(UiForm):
    """A candidate version to mirror a share of an alias's requests; the share's range is the service's rule."""

    version = forms.IntegerField(min_value=1)
    sample = forms.FloatField(required=False)

    def clean_sample(self) -> float:
        sample = self.cleaned_data.get("sample")
        return SHADOW_DEFAULT_SAMPLE if sample is None else float(sample)


# The largest count a rollout's whole-number settings are stored in (PostgreSQL's integer).
ROLLOUT_MAX_COUNT = 2_147_483_647
STEP_PATTERN = re.compile(r"[0-9]{1,9}")


class StepsField(forms.CharField):
    """A rollout's steps as one line of percentages ("5, 25, 50, 100"), separated by commas or spaces.

    Empty stands for the service's default steps (None); that the steps increase and lie from 1 to 100
    is the service's rule, so its refusal is what the page shows.
    """

    def to_python(self, value: Any) -> list[int] | None:  # type: ignore[override]
        text = super().to_python(value) or ""
        parts = [part for part in re.split(r"[,\s]+", text) if part]
        if not parts:
            return None
        steps = []
        for part in parts:
            number = part.removesuffix("%")
            if not STEP_PATTERN.fullmatch(number):
                raise forms.ValidationError(
                    f"each step is a whole percentage, separated by commas or spaces, e.g. 5, 25, 50, 100; not {part!r}"
                )
            steps.append(int(number))
        return steps


class RolloutStartForm(UiForm):
    """A stepped rollout of a candidate version on an alias: the version, and optional settings.

    Each empty box stands for the service's default (``registry.rollout.services.DEFAULTS``); the limits
    are the REST API's (``registry/api/rollout_views.py``).
    """

    version = forms.IntegerField(min_value=1)
    steps = StepsField(required=False, max_length=400)
    step_seconds = forms.IntegerField(required=False, min_value=1, max_value=7 * 24 * 3600)
    max_error_rate = forms.FloatField(required=False, min_value=0, max_value=1)
    max_p99_ratio = forms.FloatField(required=False, min_value=0.01)
    min_requests = forms.IntegerField(required=False, min_value=1, max_value=ROLLOUT_MAX_COUNT)
    reason = forms.CharField(required=False, max_length=2000)


RETENTION_THEN = [("archive", "archive"), ("delete", "delete")]
RETENTION_BOTH = "give both Keep last and Keep days, or leave both empty to remove the rule"


class RetentionForm(UiForm):
    """A model's retention rule: both numbers make a rule, both empty remove it (``cleaned_data["rule"]`` is None).

    The ranges, and who may set a rule that deletes, are the service's rules (``registry.lifecycle.retention``).
    """

    keep_last = forms.IntegerField(required=False)
    keep_days = forms.IntegerField(required=False)
    then = forms.ChoiceField(choices=RETENTION_THEN, required=False)

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if self.errors:
            return data
        keep_last, keep_days = data.get("keep_last"), data.get("keep_days")
        if keep_last is None and keep_days is None:
            data["rule"] = None
        elif keep_last is None or keep_days is None:
            raise forms.ValidationError(RETENTION_BOTH)
        else:
            data["rule"] = {"keep_last": keep_last, "keep_days": keep_days, "then": data.get("then") or "archive"}
        return data


ROLE_CHOICES = [(role.value, role.value) for role in Role]


class ModelPatternsField(forms.CharField):
    """A token's model patterns as one line, separated by commas or spaces (``fraud-*, churn``)."""

    def to_python(self, value: Any) -> list[str]:  # type: ignore[override]
        text = super().to_python(value) or ""
        return [part for part in re.split(r"[,\s]+", text) if part]


class TokenCreateForm(UiForm):
    name = forms.CharField(required=False, max_length=100)
    expires_days = forms.IntegerField(required=False, min_value=1, max_value=3650)
    # None ticked: the token carries all of its user's roles; some: only those (each must be the user's).
    roles = forms.MultipleChoiceField(choices=ROLE_CHOICES, required=False)
    models = ModelPatternsField(required=False, max_length=2000)
    # Only admins are shown the select; left out (or empty), the token is of the normal class.
    priority = forms.ChoiceField(choices=PriorityClass.choices, required=False)


class TokenRotateForm(UiForm):
    overlap_hours = forms.IntegerField(required=False, min_value=0, max_value=24 * 90)


class UserInviteForm(UiForm):
    username = forms.CharField(max_length=150)
    roles = forms.MultipleChoiceField(choices=ROLE_CHOICES, required=False)
    # Empty: the user gets no password, and the page shows a set-password link to hand over instead.
    password = forms.CharField(required=False, max_length=128, strip=False)


class UserAccessForm(UiForm):
    roles = forms.MultipleChoiceField(choices=ROLE_CHOICES, required=False)
    is_active = forms.BooleanField(required=False)


def local_time(text: str, zone: str) -> datetime:
    """``text`` (ISO, as ``<input type=datetime-local>`` sends it) as an aware time; ValueError says what is wrong."""
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"{text!r} is not a date and time such as 2026-01-31T14:30") from None
    where = ""
    if not timezone.is_aware(value):
        try:
            tz = ZoneInfo(zone) if zone else ZoneInfo("UTC")
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown time zone {zone!r}") from None
        value, where = value.replace(tzinfo=tz), f" ({tz.key})"
    try:
        value.astimezone(UTC)  # what the database compares: 0001-01-01 in Tokyo is still year 0 in UTC
    except OverflowError:
        raise ValueError(f"{text.strip()!r}{where} must be a time between 0001-01-01 and 9999-12-31 in UTC") from None
    return value
