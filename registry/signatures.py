"""Comparing two version signatures: what would break a client of the version now served."""

from __future__ import annotations

from typing import Any

Spec = dict[str, Any]


def _by_name(specs: list[Spec]) -> dict[str, Spec]:
    return {spec["name"]: spec for spec in specs}


def _shape_breaks(kind: str, name: str, old: list[int] | None, new: list[int] | None) -> list[str]:
    if old is None or new is None:
        return []
    if len(old) != len(new):
        return [f"{kind} '{name}': rank changed from {len(old)} {old} to {len(new)} {new}"]
    problems = []
    for axis, (was, now) in enumerate(zip(old, new, strict=True)):
        # A fixed dimension that becomes dynamic still accepts what clients send; anything else breaks.
        if was != now and not (kind == "input" and now == -1):
            problems.append(f"{kind} '{name}': dimension {axis} changed from {was} to {now}")
    return problems


def signature_diff(old: dict[str, list[Spec]], new: dict[str, list[Spec]]) -> list[str]:
    """Breaking differences between the version behind an alias (old) and a candidate (new)."""
    problems: list[str] = []
    for kind, key in (("input", "inputs"), ("output", "outputs")):
        before, after = _by_name(old.get(key, [])), _by_name(new.get(key, []))
        for name in sorted(before.keys() - after.keys()):
            problems.append(f"{kind} '{name}' was removed")
        if kind == "input":
            for name in sorted(after.keys() - before.keys()):
                problems.append(f"input '{name}' is new, and clients do not send it")
        for name in sorted(before.keys() & after.keys()):
            was, now = before[name], after[name]
            if was["datatype"] != now["datatype"]:
                problems.append(f"{kind} '{name}': datatype changed from {was['datatype']} to {now['datatype']}")
            problems += _shape_breaks(kind, name, was.get("shape"), now.get("shape"))
    return problems
