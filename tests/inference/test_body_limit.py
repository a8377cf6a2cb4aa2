"""Which /v2 body limit a version gets: the global one, or a lower one computed from fixed-shape inputs."""

from __future__ import annotations

from inference.protocol import HEADER_ALLOWANCE, JSON_BYTES_PER_ELEMENT, body_limit

GLOBAL = 64 << 20


def signature(*inputs: tuple[str, list[int]]) -> dict[str, object]:
    return {"inputs": [{"name": f"in{i}", "datatype": d, "shape": s} for i, (d, s) in enumerate(inputs)]}


def test_fixed_numeric_inputs_get_a_limit_from_their_element_count():
    limit = body_limit("m", signature(("FP32", [2, 3]), ("INT64", [4])), GLOBAL)
    assert limit.bytes == HEADER_ALLOWANCE + 10 * JSON_BYTES_PER_ELEMENT
    assert limit.source == "what the fixed-shape inputs of model 'm' can need"


def test_a_dynamic_dimension_bytes_or_no_inputs_keep_the_global_limit():
    sigs: list[dict[str, object]] = [
        signature(("FP32", [-1, 3])),
        signature(("FP32", [2]), ("BYTES", [1])),
        {"inputs": []},
        {},
    ]
    for sig in sigs:
        limit = body_limit("m", sig, GLOBAL)
        assert (limit.bytes, limit.source) == (GLOBAL, "MODELYARD_V2_MAX_BODY_BYTES")


def test_fixed_inputs_larger_than_the_global_limit_keep_the_global_limit():
    assert body_limit("m", signature(("FP32", [1 << 30])), GLOBAL).bytes == GLOBAL
