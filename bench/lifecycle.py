"""Retention and deletion benchmark: what the hourly retention job costs over a model with many versions.

    .venv/bin/python bench/lifecycle.py [--versions 500] [--rounds 3]

In a fresh data folder on the embedded default (SQLite and a local artifact folder; set
``MODELYARD_DATABASE_URL`` to a PostgreSQL database of your own to run it there), each round:

1. registers a model with ``--versions`` ready versions (rows made directly, each with one stored file of
   4 KiB and its row, as an upload leaves them), created 100 days ago, and an alias on the newest;
2. times ``retention_plan`` for ``{"keep_last": 10, "keep_days": 30, "then": "delete"}`` (every
   version but the newest ten is a candidate) and counts its database queries;
3. times ``retention_apply`` with that rule: each candidate marked deleted and audited, then its file
   removed from the store (in-process, as without a broker);
4. times, on a copy of the same files, removing them from the store directly: the floor, the
   deletes alone.

It reports the medians, the job's time per version, and the ratio of the job to the bare deletes.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RULE = {"keep_last": 10, "keep_days": 30, "then": "delete"}


def setup(data: Path) -> None:
    os.environ["MODELYARD_DATA_DIR"] = str(data)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "modelyard.settings")
    sys.path.insert(0, str(ROOT))
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    from registry import queueing

    queueing.task(queueing.PURGE_TASK)  # the task modules load once per process, as a worker's do: not timed
    import logging

    logging.getLogger("celery").setLevel(logging.WARNING)


def make_model(name: str, versions: int) -> Any:
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from registry.models import Alias, FileRole, ModelFile, ModelVersion, RegisteredModel, VersionStatus
    from storage import get_storage

    user, _ = get_user_model().objects.get_or_create(username="bench")
    model = RegisteredModel.objects.create(name=name, created_by=user, last_version=versions, retention=RULE)
    storage = get_storage()
    old = timezone.now() - timedelta(days=100)
    rows = ModelVersion.objects.bulk_create(
        ModelVersion(
            model=model,
            version=n,
            status=VersionStatus.READY,
            sha256=f"{n:064x}",
            size_bytes=4096,
            created_by=user,
        )
        for n in range(1, versions + 1)
    )
    ModelVersion.objects.filter(model=model).update(created_at=old)
    files = []
    for row in rows:
        key = f"artifacts/{name}/{row.version:08d}/model.onnx"
        storage.write(key, io.BytesIO(os.urandom(4096)))
        files.append(
            ModelFile(
                version=row, name="model.onnx", role=FileRole.MODEL, storage_key=key, sha256="0" * 64, size_bytes=4096
            )
        )
    ModelFile.objects.bulk_create(files)
    Alias.objects.create(model=model, name="production", protected=True, served=True, version=rows[-1])
    return model


def one_round(index: int, versions: int) -> dict[str, float]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from registry.lifecycle.retention import retention_apply, retention_plan
    from storage import get_storage

    model = make_model(f"bench-{index}", versions)
    with CaptureQueriesContext(connection) as queries:
        started = time.perf_counter()
        plan = retention_plan(model=model)
        plan_s = time.perf_counter() - started
    candidates = [a for a in plan.actions if a.action == "delete"]
    started = time.perf_counter()
    done = retention_apply(model=model)
    apply_s = time.perf_counter() - started
    removed = [a for a in done if a.action == "delete" and not getattr(a, "refused", "")]
    assert len(removed) == len(candidates) == versions - 10, (len(removed), len(candidates))
    storage = get_storage()
    left = [item.key for item in storage.list(f"artifacts/bench-{index}/")]
    assert len(left) == 10, len(left)  # the ten kept versions' files, nothing else
    # The floor: the same number of objects, written and removed straight through the store.
    keys = [f"artifacts/floor-{index}/{n:08d}" for n in range(len(candidates))]
    for key in keys:
        storage.write(key, io.BytesIO(os.urandom(4096)))
    started = time.perf_counter()
    for key in keys:
        storage.delete(key)
    floor_s = time.perf_counter() - started
    return {
        "plan_s": plan_s,
        "plan_queries": len(queries.captured_queries),
        "apply_s": apply_s,
        "deleted": len(removed),
        "floor_s": floor_s,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--versions", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "results" / "lifecycle.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="modelyard-lifecycle-") as work:
        setup(Path(work) / "data")
        rounds = [one_round(i, args.versions) for i in range(args.rounds)]

    def median(key: str) -> float:
        return statistics.median(r[key] for r in rounds)

    deleted = rounds[0]["deleted"]
    result = {
        "versions": args.versions,
        "rounds": rounds,
        "plan_s": median("plan_s"),
        "plan_queries": median("plan_queries"),
        "apply_s": median("apply_s"),
        "apply_ms_per_version": 1000 * median("apply_s") / deleted,
        "floor_s": median("floor_s"),
        "apply_over_floor": median("apply_s") / median("floor_s"),
    }
    print(
        f"{args.versions} versions, {deleted} deleted by the rule; medians of {args.rounds} rounds:\n"
        f"  preview   {result['plan_s'] * 1000:8.1f} ms  ({result['plan_queries']:.0f} queries)\n"
        f"  apply     {result['apply_s'] * 1000:8.1f} ms  ({result['apply_ms_per_version']:.2f} ms a version)\n"
        f"  deletes   {result['floor_s'] * 1000:8.1f} ms  (the store alone)\n"
        f"  apply / deletes alone: {result['apply_over_floor']:.1f}x"
    )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
