"""The benchmark jobs an inference process takes: versions measured on the hardware they will serve on.

Each inference process (the embedded ``serve --role all`` too) polls, on its reconcile loop's beat,
for pending benchmarks of its own provider (``registry.serving.benchmark_claim``: a conditional
update, so a job is taken once across the fleet). One runs at a time, on its own thread: the files
come through the artifact cache (every sha256 checked), the measuring runs in a bounded child
process at a low priority (``registry.serving.benchmark_measure``), and the numbers are written back
with a note when this process served traffic meanwhile, so they shared the device with it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from django.db import DatabaseError, connection

from inference.cache import ArtifactCache
from inference.verify import VerificationFailed, verify_version
from onnxkit.sandbox import ChildOutcome
from registry import serving

logger = logging.getLogger(__name__)


class BenchmarkRunner:
    """Takes and runs benchmark jobs for one provider, one at a time, off the reconcile thread."""

    def __init__(
        self, *, cache: ArtifactCache, provider: str, host_kind: str, worker_id: str, served: Callable[[], int]
    ) -> None:
        self._cache = cache
        self._provider = provider
        self._host_kind = host_kind
        self._worker_id = worker_id
        self._served = served  # requests this process has answered so far, to tell whether it served meanwhile
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def poll(self) -> None:
        """Start the next pending job of this provider, unless one is running here already."""
        with self._lock:
            if self.busy:
                return
            self._thread = threading.Thread(target=self._run_next, name="modelyard-benchmark", daemon=True)
            self._thread.start()

    def run_next(self) -> bool:
        """Take and run one job on this thread; False when none was pending (for tests and the quick tour)."""
        job = serving.benchmark_claim(provider=self._provider, host_kind=self._host_kind, worker_id=self._worker_id)
        if job is None:
            return False
        self._run(job)
        return True

    def _run_next(self) -> None:
        try:
            self.run_next()
        except DatabaseError as exc:
            logger.warning("benchmark poll failed: %s", exc)
        except Exception:
            logger.exception("benchmark failed")
        finally:
            connection.close()

    def _run(self, job: serving.BenchmarkJob) -> None:
        before = self._served()
        try:
            folder, digests = self._cache.bundle_with_digests(job.sha256, job.files)
            verify_version(job, digests)  # the bytes measured are the bytes signed, as before every load
        except VerificationFailed as exc:
            outcome = ChildOutcome(error=f"the benchmark refused the version's files: {exc}")
        except Exception as exc:  # noqa: BLE001 - a storage outage is this job's error
            outcome = ChildOutcome(error=f"the benchmark could not fetch the version's files: {exc}")
        else:
            outcome = serving.benchmark_measure(
                model_path=str(folder / job.model_file), provider=job.provider, max_batch_size=job.max_batch_size
            )
        note = serving.SHARED_NOTE if self._served() != before else ""
        serving.benchmark_record(benchmark_id=job.benchmark_id, outcome=outcome, note=note)
        logger.info("benchmarked %s v%s on %s: %s", job.model, job.version, job.provider, outcome.error or "done")
