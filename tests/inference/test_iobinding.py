"""IO binding with outputs bound to CPU memory, the path GPU sessions serve through, run here on the CPU.

The outputs must be exactly those of ``session.run()``: every output, in the order asked, with its
dtype and shape, for a multi-input, multi-output model and through a served version's batcher.
"""

from __future__ import annotations

import asyncio

import numpy as np
import onnxruntime as ort
import pytest

from inference.sessions import run_with_iobinding
from tests.support.onnx_models import multi_io_model
from tests.support.polling import reconcile_until
from tests.support.registry import create_model, promote, upload_versions


def test_io_binding_gives_exactly_the_outputs_of_run():
    session = ort.InferenceSession(multi_io_model().SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {"a": np.arange(6, dtype=np.int64).reshape(2, 3), "b": np.array([True, False, True])}
    for names in (["s", "t"], ["t", "s"], ["t"]):
        want = session.run(names, feeds)
        got = run_with_iobinding(session, feeds, names)
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert (g.dtype, g.shape) == (w.dtype, w.shape)
            np.testing.assert_array_equal(g, w)


@pytest.mark.django_db(transaction=True)
def test_a_version_served_through_io_binding_answers_as_through_run(owner, approver, make_runtime, asgi_loop):
    create_model(owner)
    upload_versions(owner, [1.5])
    promote(owner, approver, 1)
    runtime = make_runtime()
    loaded = reconcile_until(runtime, lambda: runtime.router.resolve("demo"), what="demo never served")
    assert loaded.io_binding is False  # a CPU session keeps run(): binding gains nothing there
    loaded.io_binding = True  # as on a GPU

    calls: list[int] = []
    session = loaded.session
    real = session.io_binding

    def counted():  # the binding is really what runs
        calls.append(1)
        return real()

    loaded.session = type(
        "Counted", (), {"io_binding": staticmethod(counted), "run_with_iobinding": session.run_with_iobinding}
    )()
    inputs = [np.full((1 + i % 2, 4), i, np.float32) for i in range(6)]

    async def infer():
        return await asyncio.gather(*[loaded.batcher.submit({"x": x}) for x in inputs])

    outputs = asyncio.run_coroutine_threadsafe(infer(), asgi_loop.loop).result(timeout=30)
    loaded.session = session
    assert calls
    for x, out in zip(inputs, outputs, strict=True):
        np.testing.assert_array_equal(out["y"], session.run(["y"], {"x": x})[0])
