"""A shadow's candidate runs with sleeping ONNX Runtime threads; promoted, it is loaded again with serving ones.

The in-process runtime is driven pass by pass (``reconcile_once``), as in ``test_runtime_inprocess.py``;
the sessions are real, and what each was built with is read back from ONNX Runtime itself.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from registry.models import ModelVersion
from registry.serving import desired_state
from tests.support.polling import reconcile_until
from tests.support.registry import create_model, promote, set_alias, set_served, upload_versions

pytestmark = pytest.mark.django_db(transaction=True)

SPINNING = "session.intra_op.allow_spinning"


def spins(loaded: Any) -> bool:
    """Whether the loaded version's session lets idle intra-op threads spin (ORT's default when unset)."""
    options = loaded.session.get_session_options()
    try:
        return str(options.get_session_config_entry(SPINNING)) != "0"
    except RuntimeError:  # onnxruntime raises for a key never set: its default, spinning
        return True


def answer(runtime: Any, ref: str | None = None) -> float:
    loaded = runtime.router.resolve("demo", ref)
    assert loaded is not None
    loaded.acquire()
    try:
        return float(loaded.run({"x": np.zeros((1, 4), dtype=np.float32)}, ["y"])[0][0][0])
    finally:
        loaded.release()


@pytest.fixture
def shadowed(owner, approver, make_runtime, inference_settings):
    """production serves v1 (bias 1); v2 (bias 2) shadows it; the runtime has loaded both."""
    inference_settings.ORT_SPINNING = True
    create_model(owner)
    v1, v2 = upload_versions(owner, [1.0, 2.0])
    promote(owner, approver, 1)
    started = owner.put("/api/v1/models/demo/aliases/production/shadow", {"version": 2, "sample": 0.5})
    assert started.status_code == 201, started.content
    runtime = make_runtime()
    reconcile_until(runtime, lambda: v1.pk in runtime.loaded and v2.pk in runtime.loaded, what="never loaded")
    return runtime, v1, v2


def test_only_a_shadows_candidate_is_marked_mirror_only(shadowed):
    _, v1, v2 = shadowed
    versions = desired_state().versions
    assert (versions[v1.pk].mirror_only, versions[v2.pk].mirror_only) == (False, True)


def test_the_candidates_threads_sleep_and_the_primarys_spin(shadowed):
    runtime, v1, v2 = shadowed
    assert spins(runtime.loaded[v1.pk]) is True
    assert spins(runtime.loaded[v2.pk]) is False


def test_a_candidate_also_routed_by_another_alias_serves_with_spinning_threads(owner, admin, shadowed):
    runtime, _, v2 = shadowed
    set_served(admin, "staging", True)
    assert set_alias(owner, "staging", 2).status_code == 200
    assert desired_state().versions[v2.pk].mirror_only is False
    reconcile_until(runtime, lambda: spins(runtime.loaded[v2.pk]), what="v2 was never loaded again")
    assert answer(runtime, "staging") == 2.0


def test_a_promoted_candidate_is_loaded_again_with_spinning_threads_and_answers_throughout(owner, approver, shadowed):
    runtime, _, v2 = shadowed
    first = runtime.loaded[v2.pk]
    promote(owner, approver, 2)
    answers = []

    def switched() -> bool:
        answers.append(answer(runtime))  # every pass: production answers, from one session or the other
        loaded = runtime.loaded.get(v2.pk)
        return loaded is not None and loaded is not first and runtime.router.resolve("demo") is loaded

    reconcile_until(runtime, switched, what="the promoted candidate was never loaded again")
    assert spins(runtime.loaded[v2.pk]) is True
    assert runtime.loaded[v2.pk].spec.mirror_only is False
    assert set(answers) <= {1.0, 2.0} and answers[-1] == 2.0
    assert ModelVersion.objects.get(pk=v2.pk).version == 2
