"""A version's lineage on its page (source fields as links, the model's derivation tree), and its model card page.

The card's content is ``registry.lifecycle.card``'s, the same the API's Markdown is made from; the page only
draws it, with a link to download that Markdown.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render

from registry.errors import NotFound
from registry.lifecycle.card import version_card
from registry.lifecycle.lineage import TreeNode, lineage_tree
from registry.models import ModelVersion, RegisteredModel


@dataclass(frozen=True)
class TreeStep:
    """One step of drawing a nested list without recursion: ``open`` a list, an ``item``, ``end`` it, ``close``."""

    kind: str
    node: TreeNode | None = None


def tree_steps(nodes: list[TreeNode]) -> list[TreeStep]:
    """The nodes (in :func:`~registry.lifecycle.lineage.lineage_tree`'s order) as the steps of a nested ``<ul>``."""
    if not nodes:
        return []
    steps = [TreeStep("open")]
    depth = 0
    for index, node in enumerate(nodes):
        if index and node.depth > depth:
            steps.append(TreeStep("open"))
        elif index:
            steps.append(TreeStep("end"))
            for _ in range(depth - node.depth):
                steps += [TreeStep("close"), TreeStep("end")]
        steps.append(TreeStep("item", node))
        depth = node.depth
    steps.append(TreeStep("end"))
    for _ in range(depth):
        steps += [TreeStep("close"), TreeStep("end")]
    steps.append(TreeStep("close"))
    return steps


def lineage_display(model: RegisteredModel, version: ModelVersion) -> dict[str, Any]:
    """What the version page's lineage box shows: its source fields, parent, children and the model's tree."""
    run = version.source_run_url
    return {
        "run_url": run if run.lower().startswith(("http://", "https://")) else "",
        "run_text": run,
        "commit": version.source_commit,
        "datasets": list(version.source_datasets or []),
        "parent": version.derived_from,
        "children": list(version.derived_versions.order_by("version").only("version", "recipe", "model_id")),
        "tree": tree_steps(lineage_tree(model)),
    }


@login_required
def version_card_page(request: HttpRequest, name: str, number: int) -> HttpResponse:
    """GET: the version's model card, each section under its heading, with a link to download it as Markdown."""
    model = get_object_or_404(RegisteredModel, name=name)
    try:
        card = version_card(model=model, number=number)
    except NotFound as exc:
        raise Http404(exc.message) from exc
    return render(request, "modelyard/ui/card.html", {"model": model, "card": card})
