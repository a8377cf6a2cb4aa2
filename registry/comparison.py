"""A candidate version against the version an alias serves now: speed from benchmarks, accuracy from the derive delta.

:func:`compare` is what the promotion request, its review page, the compare page and the alias
policy (``registry/promotions.py``) all read, so they all say the same thing:

- speed: the benchmarks of both versions on one provider (a GPU's before the CPU's), throughput at
  the largest batch both measured, and p99 latency at batch 1;
- accuracy: the delta stored on a derived version when it was derived from the other one (cosine,
  max absolute difference, top-1 agreement, the worst output of each).

What is not measured is said, never guessed.

:func:`file_changes` pairs the two versions' files for the same pages: by content and role first, so
that a renamed file reads as a rename, not as one file removed and another added.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from registry.models import FileRole, JobStatus, ModelFile, ModelVersion, VersionBenchmark

CPU = "CPUExecutionProvider"


@dataclass(frozen=True)
class Speed:
    provider: str
    batch: int
    throughput_ratio: float  # candidate / current, rows per second at ``batch``
    p99_change: float | None  # candidate / current - 1, batch-1 p99 latency
    candidate: dict[str, Any]
    current: dict[str, Any]

    @property
    def slowdown_percent(self) -> float:
        return max(0.0, (1.0 - self.throughput_ratio) * 100.0)


@dataclass(frozen=True)
class Comparison:
    candidate: ModelVersion
    current: ModelVersion | None
    alias: str
    speed: Speed | None = None
    accuracy: dict[str, float] | None = None  # the worst output: cosine, max_abs_diff, top1_agreement
    missing: list[str] = field(default_factory=list)

    def line(self) -> str:
        """One line for the people deciding, e.g. "v7 against v5 (production): 1.9\u00d7 throughput at batch 32 ..."."""
        if self.current is None:
            where = f" on {self.alias}" if self.alias else ""
            return f"v{self.candidate.version} is the first version{where}: nothing to compare against"
        parts = []
        if self.speed is not None:
            ratio = self.speed.throughput_ratio
            times = f"{ratio:.2g}" if ratio < 10 else f"{ratio:.0f}"
            parts.append(f"{times}\u00d7 throughput at batch {self.speed.batch} on {self.speed.provider}")
            if self.speed.p99_change is not None:
                parts.append(f"p99 {_signed_percent(self.speed.p99_change)}")
        if self.accuracy is not None:
            if "cosine" in self.accuracy:
                parts.append(f"cosine {self.accuracy['cosine']:.4f}")
            if "top1_agreement" in self.accuracy:
                parts.append(f"top-1 agreement {self.accuracy['top1_agreement'] * 100:.1f}%")
            if "cosine" not in self.accuracy and "max_abs_diff" in self.accuracy:
                parts.append(f"max abs diff {self.accuracy['max_abs_diff']:.3g}")
        parts.extend(self.missing)
        against = f"v{self.candidate.version} against v{self.current.version}"
        return f"{against} ({self.alias}): {', '.join(parts)}" if self.alias else f"{against}: {', '.join(parts)}"


def _signed_percent(change: float) -> str:
    percent = round(change * 100)
    return f"+{percent}%" if percent > 0 else ("\u2212" + f"{-percent}%" if percent < 0 else "0%")


def _finished(version: ModelVersion) -> dict[str, VersionBenchmark]:
    rows = version.benchmarks.filter(status=JobStatus.SUCCEEDED)
    return {row.provider: row for row in rows}


def _speed(candidate: ModelVersion, current: ModelVersion) -> Speed | None:
    mine, theirs = _finished(candidate), _finished(current)
    common = sorted(set(mine) & set(theirs), key=lambda provider: (provider == CPU, provider))
    for provider in common:
        a, b = mine[provider].numbers, theirs[provider].numbers
        batches = set(a.get("throughput", {})) & set(b.get("throughput", {}))
        if not batches:
            continue
        batch = max(batches, key=int)
        ours, before = float(a["throughput"][batch]), float(b["throughput"][batch])
        if before <= 0:
            continue
        p99 = None
        if a.get("p99_ms") and b.get("p99_ms"):
            p99 = float(a["p99_ms"]) / float(b["p99_ms"]) - 1.0
        return Speed(provider, int(batch), ours / before, p99, a, b)
    return None


def _accuracy(candidate: ModelVersion, current: ModelVersion) -> dict[str, float] | None:
    """The stored delta between the two: the candidate's when derived from the current version, or the reverse."""
    for derived, parent in ((candidate, current), (current, candidate)):
        if derived.derived_from_id == parent.pk and isinstance(derived.accuracy.get("worst"), dict):
            return {key: float(value) for key, value in derived.accuracy["worst"].items()}
    return None


def compare(candidate: ModelVersion, current: ModelVersion | None, alias: str) -> Comparison:
    if current is None:
        return Comparison(candidate=candidate, current=None, alias=alias)
    speed = _speed(candidate, current)
    accuracy = _accuracy(candidate, current)
    missing = []
    if speed is None:
        missing.append("no benchmark of both on one provider yet")
    if accuracy is None:
        missing.append(f"no accuracy delta measured between v{candidate.version} and v{current.version}")
    return Comparison(candidate, current, alias, speed, accuracy, missing)


def policy_violations(comparison: Comparison, policy: dict[str, float | None]) -> list[str]:
    """What breaks an alias's policy (``max_slowdown_percent``, ``min_cosine``, ``max_abs_diff``); empty if nothing."""
    current = comparison.current
    if current is None:
        return []
    found = []
    slowdown = policy.get("max_slowdown_percent")
    if slowdown is not None:
        speed = comparison.speed
        if speed is None:
            found.append(
                f"max_slowdown_percent {slowdown:.10g} cannot be checked: no benchmark of versions "
                f"{comparison.candidate.version} and {current.version} on one provider has finished"
            )
        elif speed.slowdown_percent > slowdown:
            found.append(
                f"throughput at batch {speed.batch} on {speed.provider} is {speed.slowdown_percent:.1f}% below "
                f"version {current.version}'s ({speed.candidate['throughput'][str(speed.batch)]:.1f} against "
                f"{speed.current['throughput'][str(speed.batch)]:.1f} rows/s; max_slowdown_percent {slowdown:.10g})"
            )
    for key, bound, worse in (("min_cosine", "cosine", "below"), ("max_abs_diff", "max_abs_diff", "above")):
        limit = policy.get(key)
        if limit is None:
            continue
        accuracy = comparison.accuracy
        value = accuracy.get(bound) if accuracy is not None else None
        if value is None:
            found.append(
                f"{key} {limit:.10g} cannot be checked: no accuracy delta is measured between versions "
                f"{comparison.candidate.version} and {current.version}"
            )
        elif (value < limit) if worse == "below" else (value > limit):
            found.append(f"{bound.replace('_', ' ')} {value:.6g} is {worse} {key} {limit:.10g}")
    return found


# --- Files ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FileChange:
    """A file of the current version, of the candidate, or of both, paired, and what happened to it."""

    before: ModelFile | None
    after: ModelFile | None

    @property
    def name(self) -> str:
        return (self.after or self.before).name  # type: ignore[union-attr]  # one of them is always there

    @property
    def renamed_from(self) -> str:
        """The current version's name for it when the candidate calls it otherwise, else ""."""
        if self.before is not None and self.after is not None and self.before.name != self.after.name:
            return self.before.name
        return ""

    @property
    def change(self) -> str:
        """same, renamed (same content, another name), changed (other content), added or removed."""
        if self.before is None:
            return "added"
        if self.after is None:
            return "removed"
        if self.before.sha256 != self.after.sha256:
            return "changed"
        return "renamed" if self.renamed_from else "same"


# Tried in turn on the files still unpaired: the same file; the same content in the same role under
# another name (a rename); the same name with other content; and the model itself, renamed and changed
# (a version has one). What is left was removed or added.
_PAIRINGS: tuple[Callable[[ModelFile, ModelFile], bool], ...] = (
    lambda old, new: old.name == new.name and old.sha256 == new.sha256,
    lambda old, new: old.sha256 == new.sha256 and old.role == new.role,
    lambda old, new: old.name == new.name,
    lambda old, new: old.role == new.role == FileRole.MODEL,
)


def file_changes(old: Sequence[ModelFile], new: Sequence[ModelFile]) -> list[FileChange]:
    """The two versions' files paired by content and role, then by name: in the current version's order, then what
    the candidate adds."""
    paired: dict[int, ModelFile] = {}
    unpaired = list(new)
    for matches in _PAIRINGS:
        for index, before in enumerate(old):
            if index in paired:
                continue
            after = next((candidate for candidate in unpaired if matches(before, candidate)), None)
            if after is not None:
                paired[index] = after
                unpaired.remove(after)
    return [FileChange(before, paired.get(index)) for index, before in enumerate(old)] + [
        FileChange(None, after) for after in new if after in unpaired
    ]
