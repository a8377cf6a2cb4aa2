"""The version page's lineage (source fields as links, the model's derivation tree as a nested list with this
version marked) and the model card page (every section, a Download link to the API's Markdown), with what people
typed escaped."""

from __future__ import annotations

import json
import re

import pytest
from django.utils import timezone

from registry.models import ModelVersion
from tests.support.onnx_models import add_model_bytes
from tests.support.people import Person
from tests.support.registry import create_model

pytestmark = pytest.mark.django_db

RUN = "https://runs.example.com/exp/7?a=1&b=2"


def upload(person: Person, bias: float, **fields: str) -> ModelVersion:
    response = person.upload("demo", [("model.onnx", add_model_bytes(bias=bias))], **fields)
    assert response.status_code == 201, response.content
    return ModelVersion.objects.get(model__name="demo", version=response.json()["version"])


@pytest.fixture
def family(mia: Person) -> None:
    """v1 -> v2 -> v4, v1 -> v3, and v5 on its own: the tree has two roots and two levels below v1."""
    create_model(mia)
    upload(mia, 1.0)
    datasets = json.dumps([{"name": "<b>clean</b> set", "digest": "sha256:00ff"}])
    upload(mia, 2.0, parent="1", source_run_url=RUN, source_commit="ABCDEF0123", source_datasets=datasets)
    upload(mia, 3.0, parent="1")
    upload(mia, 4.0, parent="2")
    upload(mia, 5.0)


def tree_of(html: str) -> str:
    """The derivation tree's markup with only its lists, items and version numbers: its shape."""
    tree = html[html.index('<nav id="lineage-tree"') : html.index("</nav>", html.index('<nav id="lineage-tree"'))]
    shape = re.sub(r'<li data-version="(\d+)">.*?(?=<ul|</li>)', r"\1", tree, flags=re.S)
    return re.sub(r'<ul class="tree">', "<ul>", re.sub(r"<nav[^>]*>\s*", "", shape)).strip()


def test_the_version_page_links_the_lineage_and_draws_the_tree(mia, family):
    html = mia.client.get("/ui/models/demo/versions/2").content.decode()
    assert f'<a href="{RUN.replace("&", "&amp;")}" rel="noopener noreferrer">' in html
    assert "abcdef0123" in html
    assert "&lt;b&gt;clean&lt;/b&gt; set" in html and "<b>clean</b>" not in html
    parent = html[html.index('id="lineage-parent"') :]
    assert parent.startswith('id="lineage-parent"><a href="/ui/models/demo/versions/1">v1</a>')
    assert "named by its uploader" in parent[:300]
    children = html[html.index('id="lineage-children"') :]
    assert children.startswith('id="lineage-children"><a href="/ui/models/demo/versions/4">v4</a></dd>')
    assert tree_of(html) == "<ul>1<ul>2<ul>4</li></ul></li>3</li></ul></li>5</li></ul>"
    assert '<strong aria-current="page">v2</strong>' in html  # this version, marked
    assert '<a href="/ui/models/demo/versions/4">v4</a>' in html
    assert 'href="/ui/models/demo/versions/2/card"' in html  # the card, from the page


def test_a_version_without_lineage_says_none(mia):
    create_model(mia)
    upload(mia, 1.0)
    html = mia.client.get("/ui/models/demo/versions/1").content.decode()
    for field in ("run", "commit", "datasets", "parent", "children"):
        block = html[html.index(f'id="lineage-{field}"') :]
        assert '<span class="muted">none</span>' in block[: block.index("</dd>")], field
    assert tree_of(html) == "<ul>1</li></ul>"


def test_the_card_page_shows_every_section_and_links_the_download(mia, family):
    response = mia.client.get("/ui/models/demo/versions/2/card")
    assert response.status_code == 200
    html = response.content.decode()
    sections = re.findall(r'<section id="card-([a-z-]+)" class="card-section">\s*<h2>([^<]+)</h2>', html)
    assert sections == [
        ("summary", "Summary"),
        ("signature", "Signature"),
        ("validation", "Validation"),
        ("benchmarks", "Benchmarks"),
        ("accuracy-deltas", "Accuracy deltas"),
        ("provenance", "Provenance"),
        ("lineage", "Lineage"),
        ("promotion-history", "Promotion history"),
        ("served", "Served"),
    ]
    assert '<a class="button primary" id="card-download" href="/api/v1/models/demo/versions/2/card" download>' in html
    assert ModelVersion.objects.get(version=2).sha256 in html
    assert f'<a href="{RUN.replace("&", "&amp;")}" rel="noopener noreferrer">' in html
    assert (
        '<a href="/ui/models/demo/versions/1">v1</a>' in html and '<a href="/ui/models/demo/versions/4">v4</a>' in html
    )
    assert "&lt;b&gt;clean&lt;/b&gt; set" in html and "<b>clean</b>" not in html
    # The Markdown it links to is the same card, for the same signed-in browser.
    download = mia.client.get("/api/v1/models/demo/versions/2/card")
    assert download.status_code == 200 and download["Content-Disposition"].startswith("attachment;")


def test_a_deleted_versions_card_page_shows_the_tombstone(mia, family):
    ModelVersion.objects.filter(version=3).update(deleted_at=timezone.now(), delete_reason="leaked <eval> data")
    html = mia.client.get("/ui/models/demo/versions/3/card").content.decode()
    assert "<dt>Lifecycle</dt><dd" in html and "deleted" in html
    assert "leaked &lt;eval&gt; data" in html
    tree = tree_of(mia.client.get("/ui/models/demo/versions/1").content.decode())
    assert tree == "<ul>1<ul>2<ul>4</li></ul></li>3</li></ul></li>5</li></ul>"  # the tombstone stays in the tree


def test_the_card_page_needs_a_signed_in_user_and_an_existing_version(mia, family, client):
    anonymous = client.get("/ui/models/demo/versions/2/card")
    assert anonymous.status_code == 302 and anonymous["Location"].startswith("/accounts/login/")
    assert mia.client.get("/ui/models/demo/versions/9/card").status_code == 404
    assert mia.client.get("/ui/models/nope/versions/1/card").status_code == 404
