"""Lineage, the duplicate refusal and the model card through the Python client against a live server."""

from __future__ import annotations

import onnx
import pytest

from modelyard.client import BadRequest, Client, Conflict, Forbidden, ModelyardError, Version
from tests.support.embedded import LiveServer
from tests.support.onnx_models import add_model
from tests.support.polling import eventually

RUN = "https://runs.example.com/exp/9"
DATASETS = [{"name": "squad", "digest": "sha256:77"}]


def test_push_set_lineage_and_card(live: LiveServer, tmp_path):
    owner = Client(live.url, live.createtoken("cleo", "maintainer"))
    stranger = Client(live.url, live.createtoken("cass", "maintainer"))
    first, second = tmp_path / "v1.onnx", tmp_path / "v2.onnx"
    onnx.save(add_model(bias=1.0), first)
    onnx.save(add_model(bias=2.0), second)
    owner.push("kin", first)
    pushed = owner.push("kin", second, source_run_url=RUN, source_commit="ABCDEF01", source_datasets=DATASETS, parent=1)
    assert isinstance(pushed, Version)
    assert (pushed.derived_from, pushed.source_run_url, pushed.source_commit, pushed.source_datasets) == (
        1,
        RUN,
        "abcdef01",
        DATASETS,
    )

    with pytest.raises(Conflict) as refused:
        owner.push("kin", second)
    assert refused.value.status == 409 and refused.value.detail == {"version": 2}
    assert refused.value.error.startswith("these bytes are already version 2 of model 'kin'")
    assert owner.push("kin", second, allow_duplicate=True).version == 3

    changed = owner.set_lineage("kin", 3, parent=2, source_datasets=[], source_run_url=RUN)
    assert (changed.derived_from, changed.source_run_url, changed.source_datasets) == (2, RUN, [])
    assert owner.set_lineage("kin", 3, clear_parent=True).derived_from is None
    unchanged = owner.set_lineage("kin", 3)  # nothing sent: nothing changes
    assert (unchanged.derived_from, unchanged.source_run_url) == (None, RUN)

    with pytest.raises(Forbidden) as denied:
        stranger.set_lineage("kin", 2, source_commit="1234567")
    assert (
        denied.value.error == "only its uploader (cleo) or an admin may change the lineage of version 2 of model 'kin'"
    )
    with pytest.raises(BadRequest) as bad:
        owner.set_lineage("kin", 3, parent=3)
    assert bad.value.error == "parent: must be an earlier version than 3, got 3"
    with pytest.raises(ModelyardError):
        owner.set_lineage("kin", 3, parent=1, clear_parent=True)

    # The card's benchmark row changes while the server's CPU benchmark of version 2 runs, so the two readers'
    # copies are compared once that run has finished.
    def measured() -> bool:
        runs = owner.benchmarks("kin", 2)
        return bool(runs) and all(run.status in ("succeeded", "failed") for run in runs)

    assert eventually(measured, timeout=180, interval=1.0)
    card = owner.card("kin", 2)
    assert card.startswith("# Model card: kin v2\n")
    assert f"- **sha256:** {pushed.sha256}" in card and "- **Code commit:** abcdef01" in card
    assert stranger.card("kin", 2).split("\n", 3)[3] == card.split("\n", 3)[3]  # anyone signed in reads it
