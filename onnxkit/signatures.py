"""Comparing two version signatures: what would break a client of the version now served; and whether a
signature lets requests be merged at all."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Spec = dict[str, Any]


def _by_name(specs: list[Spec]) -> dict[str, Spec]:
    return {spec["name"]: spec for spec in specs}


def _specs(signature: dict[str, Any], key: str) -> list[Spec]:
    """Inputs or outputs; the inputs end with ``text`` when the version has a tokenizer (``onnxkit/tokenizer.py``)."""
    specs = list(signature.get(key, []))
    text = signature.get("text")
    if key == "inputs" and text is not None:
        specs.append({"name": text["name"], "datatype": text["datatype"], "shape": text["shape"], "optional": True})
    return specs


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
        before, after = _by_name(_specs(old, key)), _by_name(_specs(new, key))
        for name in sorted(before.keys() - after.keys()):
            problems.append(f"{kind} '{name}' was removed")
        if kind == "input":
            for name in sorted(after.keys() - before.keys()):
                if not after[name].get("optional"):  # text is another way in: clients that do not send it still work
                    problems.append(f"input '{name}' is new, and clients do not send it")
        for name in sorted(before.keys() & after.keys()):
            was, now = before[name], after[name]
            if was["datatype"] != now["datatype"]:
                problems.append(f"{kind} '{name}': datatype changed from {was['datatype']} to {now['datatype']}")
            problems += _shape_breaks(kind, name, was.get("shape"), now.get("shape"))
    return problems


@dataclass(frozen=True)
class SignatureChange:
    """One input or output of two versions side by side, for a person to read (the compare and review pages)."""

    kind: str  # "input" or "output"
    name: str
    before: Spec | None  # None: the older version does not have it
    after: Spec | None  # None: the newer version does not have it
    breaking: tuple[str, ...]  # what signature_diff says breaks a client, about this one

    @property
    def change(self) -> str:
        if self.before is None:
            return "added"
        if self.after is None:
            return "removed"
        same = (self.before.get("datatype"), self.before.get("shape")) == (
            self.after.get("datatype"),
            self.after.get("shape"),
        )
        return "same" if same else "changed"


def signature_compare(old: dict[str, list[Spec]], new: dict[str, list[Spec]]) -> list[SignatureChange]:
    """Every input and output of ``old`` and ``new``, inputs first, each marked with what breaks clients of ``old``."""
    breaking = signature_diff(old, new)
    rows = []
    for kind, key in (("input", "inputs"), ("output", "outputs")):
        before, after = _by_name(_specs(old, key)), _by_name(_specs(new, key))
        names = [spec["name"] for spec in _specs(old, key)]
        names += [spec["name"] for spec in _specs(new, key) if spec["name"] not in before]
        for name in names:
            about = tuple(problem for problem in breaking if problem.startswith(f"{kind} '{name}'"))
            rows.append(SignatureChange(kind, name, before.get(name), after.get(name), about))
    return rows


def batch_dimension_problem(signature: dict[str, Any]) -> str:
    """Why requests to a model with this signature can never be merged, in a sentence; "" when they can.

    The rule of the /v2 batcher (``inference.protocol.can_batch``): every input and output has a
    dynamic first dimension, along which requests are stacked.
    """
    specs = [("input", spec) for spec in signature.get("inputs", [])]
    specs += [("output", spec) for spec in signature.get("outputs", [])]
    if not specs:
        return "the model has no tensor inputs or outputs"
    for kind, spec in specs:
        shape = spec.get("shape")
        what = f"{kind} '{spec['name']}'"
        if shape is None:
            problem = f"{what} has no known shape"
        elif not shape:
            problem = f"{what} is a scalar"
        elif shape[0] != -1:
            problem = f"{what} has a fixed first dimension ({shape[0]})"
        else:
            continue
        return f"{problem}: requests are merged only along a dynamic first dimension of every input and output"
    return ""
