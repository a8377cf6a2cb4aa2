"""A version's model card: what it is, how it checked out and performed, where it came from, where it served.

The card is built once, as data (:func:`version_card`: a :class:`Card` of titled :class:`Section`), and
drawn twice: as Markdown here (:func:`card_markdown`, what ``GET .../versions/{n}/card`` answers and
``modelyard card`` saves), and as HTML by the UI's template (``templates/modelyard/ui/card.html``), which
Django escapes. Every section is always there, saying "none" when it has nothing, so a reader (or a
script) finds each one by its heading: Summary, Signature, Validation, Benchmarks, Accuracy deltas,
Provenance, Lineage, Promotion history, Served. A deleted version still has its card: its tombstone.

Text a person typed (a description, a reason, a dataset's name) goes into Markdown escaped, so it reads
as typed and never becomes a link, an image, raw HTML or a table's column.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.db.models import Q
from django.urls import reverse

from registry.errors import NotFound
from registry.models import AliasMove, ModelVersion, PromotionRequest, RegisteredModel, VersionBenchmark

NONE = "none"
SECTION_TITLES = (
    "Summary",
    "Signature",
    "Validation",
    "Benchmarks",
    "Accuracy deltas",
    "Provenance",
    "Lineage",
    "Promotion history",
    "Served",
)


@dataclass(frozen=True)
class Link:
    """A value shown as a link; ``external``: off this registry (a training run), opened without a referrer."""

    text: str
    url: str
    external: bool = False


Value = str | Link | None  # None: nothing to say, shown as "none"


@dataclass(frozen=True)
class Facts:
    """Labelled values, one a line."""

    rows: tuple[tuple[str, Value], ...]
    kind: str = "facts"


@dataclass(frozen=True)
class Table:
    """Rows under a title; ``empty`` is said instead when there are none."""

    title: str
    headers: tuple[str, ...]
    rows: tuple[tuple[Value, ...], ...]
    empty: str = NONE
    kind: str = "table"


@dataclass(frozen=True)
class Texts:
    """Messages under a title (validation errors, warnings), each kept as written, line breaks and all."""

    title: str
    items: tuple[str, ...]
    empty: str = NONE
    kind: str = "texts"


Block = Facts | Table | Texts


@dataclass(frozen=True)
class Section:
    title: str
    blocks: tuple[Block, ...]

    @property
    def key(self) -> str:
        """Its anchor: ``accuracy-deltas``."""
        return self.title.lower().replace(" ", "-")


@dataclass(frozen=True)
class Card:
    model: str
    version: int
    generated_at: datetime
    sections: tuple[Section, ...] = field(default_factory=tuple)

    @property
    def title(self) -> str:
        return f"Model card: {self.model} v{self.version}"


# --- Building it -------------------------------------------------------------------------------------------


def version_card(*, model: RegisteredModel, number: int, base_url: str = "") -> Card:
    """The card of version ``number`` of ``model``, deleted or not; NotFound if it has no such version.

    ``base_url`` goes before the registry's own links (another version's page): empty for a page of this
    registry, the server's address for a card read elsewhere.
    """
    version = (
        ModelVersion.objects.filter(model=model, version=number)
        .select_related("model", "created_by", "derived_from", "archived_by", "held_by", "deleted_by")
        .first()
    )
    if version is None:
        raise NotFound(f"model '{model.name}' has no version {number}")
    link = _Links(model.name, base_url)
    sections = (
        _summary(version),
        _signature(version),
        _validation(version),
        _benchmarks(version),
        _accuracy(version),
        _provenance(version),
        _lineage(version, link),
        _promotions(version),
        _served(version),
    )
    return Card(model=model.name, version=version.version, generated_at=_now(), sections=sections)


def _now() -> datetime:
    return datetime.now(UTC)


class _Links:
    def __init__(self, model: str, base_url: str) -> None:
        self.model = model
        self.base_url = base_url.rstrip("/")

    def version(self, number: int) -> Link:
        return Link(f"v{number}", self.base_url + reverse("ui:version", kwargs={"name": self.model, "number": number}))


def _when(moment: datetime | None) -> str | None:
    return None if moment is None else f"{moment.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"


def _who(user: Any) -> str | None:
    return None if user is None else str(user.get_username())


def _number(value: Any, spec: str = ".6g", unit: str = "") -> str | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return f"{value:{spec}}{unit}"


def _bytes(count: Any) -> str | None:
    if not isinstance(count, int):
        return None
    size, unit = float(count), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            break
        size /= 1024
    return f"{count} bytes" if unit == "B" else f"{count} bytes ({size:.1f} {unit})"


def _summary(version: ModelVersion) -> Section:
    lifecycle = version.lifecycle
    if version.archived_at is not None and version.deleted_at is None:
        lifecycle += f" since {_when(version.archived_at)} (by {_who(version.archived_by) or 'someone'})"
    rows: list[tuple[str, Value]] = [
        ("Model", version.model.name),
        ("Version", str(version.version)),
        ("Description", version.description or None),
        ("Tags", ", ".join(version.tags) if version.tags else None),
        ("Status", version.status),
        ("Lifecycle", lifecycle),
        (
            "Legal hold",
            None
            if version.held_at is None
            else f"since {_when(version.held_at)} by {_who(version.held_by) or 'someone'}: {version.hold_reason}",
        ),
    ]
    if version.deleted_at is not None:
        removed = (
            f"removed {_when(version.purged_at)}" if version.purged_at is not None else "being removed from storage"
        )
        rows += [
            ("Deleted", _when(version.deleted_at)),
            ("Deleted by", _who(version.deleted_by)),
            ("Why", version.delete_reason or None),
            ("Its files", removed),
        ]
    rows += [
        ("Size", f"{_bytes(version.size_bytes)}, all files together"),
        ("sha256", version.sha256),
        ("Uploaded by", _who(version.created_by)),
        ("Created", _when(version.created_at)),
    ]
    files = tuple(
        (f.name, f.role, _bytes(f.size_bytes), f.sha256)
        for f in version.files.order_by("id").only("name", "role", "sha256", "size_bytes")
    )
    return Section("Summary", (Facts(tuple(rows)), Table("Files", ("File", "Role", "Size", "sha256"), files)))


def _shape(shape: Any) -> str:
    return "[" + ", ".join(str(dim) for dim in shape) + "]" if isinstance(shape, list) else str(shape)


def _signature(version: ModelVersion) -> Section:
    signature = version.signature or {}
    rows: list[tuple[Value, ...]] = []
    for kind in ("inputs", "outputs"):
        for spec in signature.get(kind) or []:
            rows.append((kind[:-1], str(spec.get("name")), str(spec.get("datatype")), _shape(spec.get("shape"))))
        text = signature.get("text")
        if kind == "inputs" and isinstance(text, dict):
            how = f"raw text, tokenised by {text.get('tokenizer')}"
            rows.append(
                ("input", str(text.get("name")), str(text.get("datatype")), f"{_shape(text.get('shape'))} ({how})")
            )
    empty = "none: it is read when validation succeeds"
    return Section(
        "Signature", (Table("Inputs and outputs", ("Kind", "Name", "Datatype", "Shape"), tuple(rows), empty),)
    )


def _validation(version: ModelVersion) -> Section:
    decision = version.batching_decision()
    opsets = ", ".join(f"{o.get('domain') or 'ai.onnx'} {o.get('version')}" for o in version.opset or [])
    producer = version.producer or {}
    facts = Facts(
        (
            ("Result", version.status),
            ("Validated", _when(version.validated_at)),
            ("IR version", None if version.ir_version is None else str(version.ir_version)),
            ("Opsets", opsets or None),
            ("Producer", f"{producer.get('name', '')} {producer.get('version', '')}".strip() or None),
            ("Batching", f"{'merged' if decision.merges else 'not merged'}: {decision.reason}"),
        )
    )
    return Section(
        "Validation",
        (
            facts,
            Texts("Errors", tuple(str(e) for e in version.errors or [])),
            Texts("Warnings", tuple(str(w) for w in version.warnings or [])),
        ),
    )


def _benchmarks(version: ModelVersion) -> Section:
    rows = []
    for run in VersionBenchmark.objects.filter(version=version).order_by("provider"):
        numbers = run.numbers or {}
        throughput = numbers.get("throughput") or {}
        rates = ", ".join(f"batch {batch}: {_number(rate, '.0f', '/s')}" for batch, rate in throughput.items())
        memory = numbers.get("device_memory_bytes") or numbers.get("peak_rss_bytes")
        rows.append(
            (
                run.provider,
                run.host_kind or None,
                run.status,
                _number(numbers.get("load_seconds"), ".2f", " s"),
                _number(numbers.get("p50_ms"), ".2f", " ms"),
                _number(numbers.get("p99_ms"), ".2f", " ms"),
                rates or None,
                _bytes(memory),
                _when(run.finished_at),
                run.error or run.note or None,
            )
        )
    headers = ("Provider", "Ran on", "Status", "Load", "p50", "p99", "Throughput", "Peak memory", "Finished", "Note")
    return Section("Benchmarks", (Table("Runs", headers, tuple(rows)),))


def _accuracy(version: ModelVersion) -> Section:
    accuracy = version.accuracy or {}
    if accuracy.get("skipped"):
        return Section("Accuracy deltas", (Facts((("Not measured", str(accuracy["skipped"])),)),))
    outputs = accuracy.get("outputs") or {}
    if not isinstance(outputs, dict) or not outputs:
        return Section("Accuracy deltas", (Facts((("Measured", "none: it was not derived by the registry"),)),))
    inputs = "synthetic inputs" if accuracy.get("inputs") == "synthetic" else "the version's sample_inputs.json"
    facts = Facts((("Against", f"v{accuracy.get('against')}"), ("On", inputs)))
    rows = tuple(
        (
            str(name),
            _number(delta.get("max_abs_diff"), ".7g"),
            _number(delta.get("mean_abs_diff"), ".7g"),
            _number(delta.get("cosine"), ".7g"),  # 0.9999997 is not 1
            _number(delta.get("top1_agreement"), ".4f"),
        )
        for name, delta in sorted(outputs.items())
        if isinstance(delta, dict)
    )
    headers = ("Output", "Max abs diff", "Mean abs diff", "Cosine", "Top-1 agreement")
    return Section("Accuracy deltas", (facts, Table("Per output", headers, rows)))


def _provenance(version: ModelVersion) -> Section:
    rows = tuple((s.kind, s.signer, s.key_id, _when(s.created_at), s.sha256) for s in version.signatures.order_by("id"))
    table = Table(
        "Signature bundles", ("Kind", "Signer", "Key id", "Recorded", "Bundle sha256"), rows, "none: not signed"
    )
    return Section("Provenance", (table,))


def _lineage(version: ModelVersion, link: _Links) -> Section:
    parent = version.derived_from
    how = None
    if parent is not None:
        how = f"derived by the registry ({version.recipe.get('recipe')})" if version.recipe else "named by its uploader"
    run = version.source_run_url
    facts = Facts(
        (
            ("Training run", Link(run, run, external=True) if _is_web(run) else (run or None)),
            ("Code commit", version.source_commit or None),
            ("Parent", link.version(parent.version) if parent is not None else None),
            ("Parent is", how),
        )
    )
    datasets = tuple((str(d.get("name")), str(d.get("digest"))) for d in version.source_datasets or [])
    children = tuple(
        (
            link.version(child.version),
            f"derived by the registry ({child.recipe.get('recipe')})" if child.recipe else "named by its uploader",
            child.status,
            child.lifecycle,
        )
        for child in version.derived_versions.order_by("version")
    )
    return Section(
        "Lineage",
        (
            facts,
            Table("Datasets", ("Name", "Digest"), datasets),
            Table("Children", ("Version", "How", "Status", "Lifecycle"), children),
        ),
    )


def _is_web(url: str) -> bool:
    return url.lower().startswith(("http://", "https://")) and not any(c <= " " for c in url)


def _approved_by(promotion: PromotionRequest | None) -> str | None:
    if promotion is None or promotion.decided_by is None:
        return None
    return _who(promotion.decided_by)


def _moves(version: ModelVersion) -> list[AliasMove]:
    """Every move of every alias that pointed at the version or away from it, oldest first."""
    aliases = AliasMove.objects.filter(Q(to_version=version) | Q(from_version=version)).values("alias_id")
    return list(
        AliasMove.objects.filter(alias_id__in=aliases)
        .select_related("alias", "from_version", "to_version", "moved_by", "promotion__decided_by")
        .order_by("moved_at", "id")
    )


def _promotions(version: ModelVersion) -> Section:
    moves = tuple(
        (
            _when(move.moved_at),
            move.alias.name,
            move.kind + (" (forced)" if move.forced else ""),
            f"v{move.from_version.version}" if move.from_version is not None else None,
            _who(move.moved_by),
            _approved_by(move.promotion),
            move.reason or None,
        )
        for move in _moves(version)
        if move.to_version_id == version.pk
    )
    requests = tuple(
        (
            f"#{request.pk}",
            request.alias.name,
            request.kind,
            request.state,
            _who(request.requested_by),
            _when(request.requested_at),
            _who(request.decided_by),
            _when(request.decided_at),
            request.decision_reason or request.reason or None,
        )
        for request in PromotionRequest.objects.filter(version=version)
        .select_related("alias", "requested_by", "decided_by")
        .order_by("requested_at", "id")
    )
    return Section(
        "Promotion history",
        (
            Table("Moves to this version", ("When", "Alias", "How", "From", "By", "Approved by", "Reason"), moves),
            Table(
                "Promotion requests",
                ("Request", "Alias", "Kind", "State", "Asked by", "Asked", "Decided by", "Decided", "Reason"),
                requests,
            ),
        ),
    )


def _periods(version: ModelVersion, moves: Iterable[AliasMove]) -> list[tuple[Value, ...]]:
    """Each time an alias pointed at the version: from the move there to the alias's next move (or now)."""
    periods: list[tuple[Value, ...]] = []
    open_since: dict[int, AliasMove] = {}
    for move in moves:
        started = open_since.pop(move.alias_id, None)
        if started is not None:
            periods.append(
                (
                    started.alias.name,
                    _when(started.moved_at),
                    _when(move.moved_at),
                    _who(started.moved_by),
                    _who(move.moved_by),
                )
            )
        if move.to_version_id == version.pk:
            open_since[move.alias_id] = move
    for started in open_since.values():
        periods.append((started.alias.name, _when(started.moved_at), "now", _who(started.moved_by), None))
    return sorted(periods, key=lambda row: (str(row[1]), str(row[0])))


def _served(version: ModelVersion) -> Section:
    aliases = sorted(version.model.aliases.filter(version=version).values_list("name", flat=True))
    facts = Facts(
        (
            ("Aliases on it now", ", ".join(aliases) or None),
            ("Last loaded by an inference process", _when(version.last_served_at)),
        )
    )
    periods = tuple(_periods(version, _moves(version)))
    table = Table(
        "Periods an alias pointed at it", ("Alias", "From", "Until", "Moved there by", "Moved away by"), periods
    )
    return Section("Served", (facts, table))


# --- Markdown ----------------------------------------------------------------------------------------------

# Everything Markdown (CommonMark with GitHub's tables) may read as markup inside a line, escaped with a
# backslash, which CommonMark allows before any ASCII punctuation: emphasis, code spans, links and images
# (their brackets), raw HTML and autolinks, entities, strikethrough, table cells. A line break becomes a
# space, so text never starts a line, where a heading, list or block would begin.
_SPECIAL = re.compile(r"([\\`*_\[\]<>|&~])")


def md_text(text: str) -> str:
    """``text`` as literal Markdown inline text."""
    return _SPECIAL.sub(r"\\\1", " ".join(text.split()))


def _md_url(url: str) -> str:
    # A link's destination in angle brackets holds any character but a line break and unescaped < >.
    return url.replace("<", "%3C").replace(">", "%3E").replace("\n", "%0A")


def md_value(value: Value) -> str:
    if value is None:
        return NONE
    if isinstance(value, Link):
        return f"[{md_text(value.text)}](<{_md_url(value.url)}>)"
    return md_text(value) or NONE


def _fence(text: str) -> str:
    """``text`` as a fenced code block whose fence no run of backticks inside it can close."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}text\n{text.rstrip()}\n{fence}"


def _md_block(block: Block) -> list[str]:
    if isinstance(block, Facts):
        return [f"- **{md_text(label)}:** {md_value(value)}" for label, value in block.rows]
    if isinstance(block, Table):
        if not block.rows:
            return [f"**{md_text(block.title)}:** {md_text(block.empty)}"]
        lines = [f"**{md_text(block.title)}**", ""]
        lines.append("| " + " | ".join(md_text(h) for h in block.headers) + " |")
        lines.append("|" + "---|" * len(block.headers))
        lines += ["| " + " | ".join(md_value(cell) for cell in row) + " |" for row in block.rows]
        return lines
    if not block.items:
        return [f"**{md_text(block.title)}:** {md_text(block.empty)}"]
    lines = [f"**{md_text(block.title)}**", ""]
    for item in block.items:
        lines += [_fence(item), ""] if "\n" in item.strip() else [f"- {md_text(item)}"]
    return lines[:-1] if lines[-1] == "" else lines


def card_markdown(card: Card) -> str:
    """The card as a Markdown document: a title, then each section under a level-2 heading."""
    lines = [
        f"# {md_text(card.title)}",
        "",
        f"Made by Modelyard at {_when(card.generated_at)}.",
    ]
    for section in card.sections:
        lines += ["", f"## {md_text(section.title)}"]
        for block in section.blocks:
            lines += ["", *_md_block(block)]
    return "\n".join(lines) + "\n"


def card_filename(card: Card) -> str:
    return f"{card.model}-v{card.version}-card.md"


def section_titles(card: Card) -> Sequence[str]:
    return [section.title for section in card.sections]
