"""What the registry API answers, as typed records; each keeps the whole answer in ``raw`` for ``--json``."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Self


class _Record:
    """Build from an answer: the fields the record names, the whole answer in ``raw``."""

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Self:
        names = {f.name for f in fields(cls) if f.init} - {"raw"}  # type: ignore[arg-type]
        return cls(**{name: data[name] for name in names if name in data}, raw=data)  # type: ignore[call-arg]


@dataclass(frozen=True)
class Model(_Record):
    name: str
    description: str = ""
    tags: list[str] = field(default_factory=list)
    last_version: int = 0
    serving_strategy: str = ""
    created_by: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class File(_Record):
    name: str
    role: str = ""
    sha256: str = ""
    size_bytes: int = 0
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class Version(_Record):
    model: str
    version: int
    status: str
    description: str = ""
    tags: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    sha256: str = ""
    size_bytes: int = 0
    signature: dict[str, Any] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    created_by: str | None = None
    created_at: str = ""
    # Its lineage: the parent's number (a derivation's, or one its uploader named), the training run, the
    # code's commit and the datasets [{"name", "digest"}].
    derived_from: int | None = None
    source_run_url: str = ""
    source_commit: str = ""
    source_datasets: list[dict[str, str]] = field(default_factory=list)
    # {"state": "active"|"archived"|"deleted", "archived_at", "archived_by", "hold": {at, by, reason}|None,
    #  "deleted": {at, by, reason, files_removed, files_removed_at}|None, "last_served_at"}
    lifecycle: dict[str, Any] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def state(self) -> str:
        """``active``, ``archived`` or ``deleted`` (a tombstone)."""
        return str(self.lifecycle.get("state", "active"))

    @property
    def files(self) -> list[File]:
        return [File.from_json(item) for item in self.raw.get("files") or []]

    @property
    def model_file(self) -> File:
        return next(f for f in self.files if f.role == "model")


@dataclass(frozen=True)
class Alias(_Record):
    alias: str
    version: int | None = None
    protected: bool = False
    served: bool = False
    require_signature: bool = False  # only a version its uploader signed (or derived from one) can be set
    trusted_signers: list[str] = field(default_factory=list)  # by these signers only; empty: any trusted one
    cache: dict[str, int] | None = None  # the response cache: {"max_bytes", "ttl_seconds"}; None when off
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class AliasMove(_Record):
    """One move of an alias: from, to, how (set, rollback, approval), who and why."""

    from_version: int | None
    to_version: int
    kind: str = ""
    reason: str = ""
    forced: bool = False
    moved_by: str | None = None
    moved_at: str = ""
    promotion: int | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class Promotion(_Record):
    """A four-eyes request on a protected alias (``kind`` move or unprotect) and its decision."""

    id: int
    kind: str
    model: str
    alias: str
    version: int | None
    state: str
    base_version: int | None = None
    reason: str = ""
    requested_by: str = ""
    decided_by: str | None = None
    decision_reason: str = ""
    expires_at: str = ""
    shadow_report: dict[str, Any] | None = None  # the candidate's shadow on the alias when it was asked for
    # The alias's policy rule by rule when it was asked for, and again at approval (None before):
    # {"policy": number, "builtin": bool, "rules": [{"name", "passed", "why", "waiting"}]}
    policy_results: dict[str, Any] | None = None
    policy_results_at_approval: dict[str, Any] | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def shadow(self) -> Shadow | None:
        """:attr:`shadow_report` as a :class:`Shadow` (its ``raw`` also has ``as_of``); None if never shadowed."""
        return Shadow.from_json(self.shadow_report) if self.shadow_report else None


@dataclass(frozen=True)
class AliasAt(_Record):
    """Which version an alias pointed to at a time (``version`` None: none yet)."""

    alias: str
    at: str
    version: int | None = None
    since: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class AuditVerdict(_Record):
    """``GET /audit/verify``: whether the hash chain holds, and where it first breaks."""

    ok: bool
    checked: int = 0
    first_bad_seq: int | None = None
    reason: str = ""
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class AuditEvent(_Record):
    """One event of the audit log, with its place in the hash chain."""

    seq: int
    at: str
    actor: str
    action: str
    target_type: str = ""
    target: str = ""
    model: str = ""
    before: Any = None
    after: Any = None
    hash: str = ""
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class Webhook(_Record):
    """An endpoint the registry POSTs signed events to."""

    id: int
    url: str
    events: list[str] = field(default_factory=list)
    model: str | None = None
    active: bool = True
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class Delivery(_Record):
    """One event sent (or being sent) to a webhook: its attempts and how the last one went."""

    id: str
    event: str
    status: str
    attempts: int = 0
    model: str = ""
    version: int | None = None
    last_status_code: int | None = None
    last_error: str = ""
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class DeriveJob(_Record):
    """A derive request: ``status`` pending, running, succeeded or failed; ``version`` the new one when it succeeded."""

    id: int
    model: str
    source_version: int
    recipe: str
    status: str
    options: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    version: int | None = None
    requested_by: str | None = None
    created_at: str = ""
    finished_at: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class InferenceJob(_Record):
    """An asynchronous inference job: ``state`` queued, running, succeeded, failed or cancelled.

    ``rows`` is known once its input is split (None before); ``rows_done`` counts the rows written.
    ``result`` is the path of its result's download once it succeeded (a batch job's), else None.
    """

    id: str
    model: str
    version: int
    state: str
    kind: str = "batch"
    ref: str = ""
    format: str = ""
    rows: int | None = None
    rows_done: int = 0
    errors: list[str] = field(default_factory=list)
    input_bytes: int = 0
    result_bytes: int = 0
    created_by: str | None = None
    created_at: str = ""
    started_at: str | None = None
    finished_at: str | None = None
    result: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def ended(self) -> bool:
        return self.state in ("succeeded", "failed", "cancelled")


@dataclass(frozen=True)
class AsyncRequest:
    """An infer-async request: its id and state, and ``location``, the path its answer is read from."""

    id: str
    state: str
    location: str


@dataclass(frozen=True)
class Benchmark(_Record):
    """One benchmark run of a version on one provider; ``numbers`` holds what it measured."""

    version: int
    provider: str
    status: str
    host_kind: str = ""
    worker_id: str = ""
    numbers: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    note: str = ""
    finished_at: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class ShadowSide(_Record):
    """One version's side of a shadow: its answers, its errors and its latency (None before it answered)."""

    answered: int = 0
    errors: int = 0
    error_rate: float | None = None
    p50_ms: float | None = None
    p99_ms: float | None = None
    last_error: str = ""
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class ShadowOutput(_Record):
    """How one output of the candidate agrees with the serving version's (None until rows were compared)."""

    rows: int = 0
    cosine_p1: float | None = None  # the 1st percentile of the rows' cosine similarity
    cosine_p50: float | None = None
    cosine_min: float | None = None
    max_abs_diff: float | None = None
    mean_abs_diff: float | None = None
    top1_agreement: float | None = None  # class scores only (2-D, more than one column)
    psi: float | None = None  # population stability index of the output values
    mismatched: int = 0  # requests whose output the candidate lacked or shaped otherwise
    mismatch: str = ""
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class Shadow(_Record):
    """A candidate ``version`` answering a ``sample`` of an alias's requests beside the version it serves.

    ``report`` is what the inference processes counted, merged: :attr:`primary`, :attr:`candidate`
    and :attr:`outputs` read it as typed parts.
    """

    id: int
    model: str
    alias: str
    version: int
    serving: int | None = None
    sample: float = 0.0
    running: bool = False
    started_by: str = ""
    started_at: str = ""
    ended_at: str | None = None
    ended_by: str | None = None
    end_reason: str = ""
    workers: int = 0  # inference processes that reported counts
    report: dict[str, Any] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def requests(self) -> int:
        """Sampled requests the candidate ran."""
        return int(self.report.get("requests") or 0)

    @property
    def compared(self) -> int:
        """Of those, the ones both versions answered."""
        return int(self.report.get("compared") or 0)

    @property
    def dropped(self) -> int:
        """Sampled requests not mirrored (a busy process, a full queue): :attr:`dropped_by_reason` says why."""
        return int(self.report.get("dropped") or 0)

    @property
    def dropped_by_reason(self) -> dict[str, int]:
        return dict(self.report.get("dropped_by_reason") or {})

    @property
    def primary(self) -> ShadowSide:
        """The serving version's side."""
        return ShadowSide.from_json(self.report.get("primary") or {})

    @property
    def candidate(self) -> ShadowSide:
        return ShadowSide.from_json(self.report.get("candidate") or {})

    @property
    def outputs(self) -> dict[str, ShadowOutput]:
        """Each output compared, by name."""
        return {name: ShadowOutput.from_json(item) for name, item in (self.report.get("outputs") or {}).items()}


@dataclass(frozen=True)
class PolicyRule(_Record):
    """One rule of an alias's promotion policy: a CEL expression that must be true, and what a failure says."""

    name: str
    expr: str
    message: str = ""
    builtin: bool = False  # made from the alias's settings (no policy written yet)
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class Policy(_Record):
    """An alias's promotion policy in force (``number`` 0 and ``builtin``: made from its settings) and a change
    waiting for approval (``pending``: its ``number``, ``promotion`` and ``rules``, else None).

    After :meth:`Client.policy_set` on a protected alias, ``promotion`` is the request the new policy
    waits for (the policy shown is still the one in force); otherwise None.
    """

    model: str
    alias: str
    number: int
    builtin: bool = False
    rules: list[PolicyRule] = field(default_factory=list)
    created_by: str | None = None
    created_at: str | None = None
    reason: str = ""
    pending: dict[str, Any] | None = None
    promotion: int | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Self:
        record = super().from_json(data)
        return replace(record, rules=[PolicyRule.from_json(item) for item in data.get("rules") or []])

    @property
    def pending_rules(self) -> list[PolicyRule]:
        """The rules of the change waiting for approval (none when nothing waits)."""
        return [PolicyRule.from_json(item) for item in (self.pending or {}).get("rules") or []]


@dataclass(frozen=True)
class RuleResult(_Record):
    """What one rule said of a version: ``why`` it did not pass; ``waiting`` when it is decided at approval."""

    name: str
    passed: bool
    why: str = ""
    waiting: bool = False
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class PolicyCheck(_Record):
    """What the alias's policy (``policy``: its number) says now of promoting ``version``; ``passed``: every rule."""

    version: int
    policy: int
    builtin: bool = False
    passed: bool = False
    rules: list[RuleResult] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Self:
        record = super().from_json(data)
        return replace(record, rules=[RuleResult.from_json(item) for item in data.get("rules") or []])

    @property
    def failing(self) -> list[RuleResult]:
        """The rules that failed (not the waiting ones): what would refuse the promotion now."""
        return [rule for rule in self.rules if not rule.passed and not rule.waiting]

    @property
    def waiting(self) -> list[RuleResult]:
        """The rules decided only at approval."""
        return [rule for rule in self.rules if rule.waiting]


@dataclass(frozen=True)
class RetentionRule(_Record):
    """A model's retention rule: the ``keep_last`` newest versions and those created, aliased or served within
    ``keep_days`` are kept; the others are archived, or deleted when ``then`` is ``delete``."""

    keep_last: int
    keep_days: int
    then: str = "archive"
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class RetentionAction(_Record):
    """What a rule does to one version (``archive``, ``delete``), or why it spares it (``keep``)."""

    version: int
    action: str
    why: str = ""
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class RetentionPlan(_Record):
    """What the next run of a rule would do (``actions``) and the versions outside both windows it spares
    (``kept``, each with why), oldest first, as of ``as_of``. Nothing is changed by asking."""

    model: str
    rule: RetentionRule
    as_of: str = ""
    actions: list[RetentionAction] = field(default_factory=list)
    kept: list[RetentionAction] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Self:
        record = super().from_json(data)
        return replace(
            record,
            rule=RetentionRule.from_json(data["rule"]),
            actions=[RetentionAction.from_json(item) for item in data.get("actions") or []],
            kept=[RetentionAction.from_json(item) for item in data.get("kept") or []],
        )
