"""The recipes that build a derived version, and the accuracy delta against its parent.

:func:`check_recipe` runs in the web process (a bad recipe or option is a 400 before anything is
queued). :func:`derive_child` runs in the bounded child (``onnxkit/sandbox.py``), started by the
registry's derive job: it converts the parent's ``.onnx`` file, then runs parent and result on
the same inputs and measures how far each output moved.

- ``fp16``: ``onnxconverter_common.float16.convert_float_to_float16(keep_io_types=True)``: float16
  initialisers and arithmetic, float32 inputs and outputs; with ``optimize``, after ONNX Runtime's
  transformer optimiser (``onnxruntime.transformers.optimizer``) fused attention and layer norms,
  converted by that optimiser's own converter (which knows the fused operators).
- ``int8-dynamic``: ``onnxruntime.quantization.quantize_dynamic`` (int8 weights, activations
  quantised at run time).
- ``ort-optimized``: the model ONNX Runtime saves after its offline graph optimisation
  (``SessionOptions.optimized_model_filepath``) at a chosen level for a chosen provider.

Numpy and the ONNX libraries are imported inside the functions: the web process imports this
module only to check a recipe.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

RECIPES = ("fp16", "int8-dynamic", "ort-optimized")
RESULT_NAME = "model.onnx"
# Synthetic inputs: dynamic dimensions become these (the first is taken as the batch).
SYNTHETIC_BATCH = 8
SYNTHETIC_OTHER = 16
# A model past this is saved with its weights in an external-data file (protobuf's limit is 2 GB).
EXTERNAL_DATA_AFTER = 1_800_000_000

_LEVELS = ("basic", "extended", "all")
_PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}


class RecipeError(ValueError):
    """The recipe or its options are not ones this registry knows; the message says which."""


def _bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise RecipeError(f"option '{name}' must be true or false")
    return value


def _int(name: str, value: Any, *, minimum: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise RecipeError(f"option '{name}' must be an integer of at least {minimum}")
    return value


def _choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise RecipeError(f"option '{name}' must be one of {', '.join(choices)}")
    return str(value)


def _names(name: str, value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
        raise RecipeError(f"option '{name}' must be a list of operator names")
    return list(value)


# recipe -> option -> (check, default)
_OPTIONS: dict[str, dict[str, tuple[Callable[[str, Any], Any], Any]]] = {
    "fp16": {
        "optimize": (_bool, False),
        "model_type": (lambda n, v: _choice(n, v, ("bert", "gpt2", "t5", "vit", "clip")), "bert"),
        "num_heads": (_int, 0),
        "hidden_size": (_int, 0),
        "op_block_list": (_names, []),
    },
    "int8-dynamic": {
        "weight_type": (lambda n, v: _choice(n, v, ("qint8", "quint8")), "qint8"),
        "per_channel": (_bool, False),
        "op_types": (_names, []),
    },
    "ort-optimized": {
        "level": (lambda n, v: _choice(n, v, _LEVELS), "extended"),
        "provider": (lambda n, v: _choice(n, v, tuple(_PROVIDERS)), "cpu"),
    },
}


def _check_list_size(name: str, names: list[str], *, max_items: int, max_item_chars: int) -> None:
    # The options are kept for good (the job row, its audit event, the version's recipe).
    if len(names) > max_items:
        raise RecipeError(
            f"option '{name}' lists {len(names)} names; at most {max_items} (MODELYARD_DERIVE_MAX_OPTION_ITEMS)"
        )
    if any(len(item) > max_item_chars for item in names):
        raise RecipeError(
            f"option '{name}': a name is longer than {max_item_chars} characters "
            "(MODELYARD_DERIVE_MAX_OPTION_ITEM_CHARS)"
        )


def check_recipe(recipe: Any, options: Any, *, max_items: int, max_item_chars: int) -> dict[str, Any]:
    """The options with their defaults filled in, or :class:`RecipeError` naming what is wrong.

    An option that lists names (operators) has at most ``max_items`` of them, each at most
    ``max_item_chars`` long (``MODELYARD_DERIVE_MAX_OPTION_ITEMS``, ``..._ITEM_CHARS``).
    """
    if not isinstance(recipe, str) or recipe not in _OPTIONS:
        raise RecipeError(f"unknown recipe {json.dumps(recipe)}; recipes are {', '.join(RECIPES)}")
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise RecipeError("options must be a JSON object")
    known = _OPTIONS[recipe]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise RecipeError(
            f"unknown option(s) for {recipe}: {', '.join(unknown)}; its options are {', '.join(sorted(known))}"
        )
    checked = {
        name: check(name, options[name]) if name in options else default for name, (check, default) in known.items()
    }
    for name, value in checked.items():
        if isinstance(value, list):
            _check_list_size(name, value, max_items=max_items, max_item_chars=max_item_chars)
    return checked


def library_versions() -> dict[str, str]:
    import numpy
    import onnx
    import onnxruntime

    versions = {"onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__, "numpy": numpy.__version__}
    try:
        import onnxconverter_common

        versions["onnxconverter-common"] = onnxconverter_common.__version__
    except ImportError:  # only fp16 needs it
        pass
    return versions


# --- Recipes (in the child) -------------------------------------------------------------------------


def _save(model: Any, target: Path) -> None:
    import onnx

    large = model.ByteSize() > EXTERNAL_DATA_AFTER
    onnx.save_model(model, str(target), save_as_external_data=large, location=f"{target.name}.data")


def convert(recipe: str, options: dict[str, Any], source: Path, target: Path) -> None:
    """Build the derived model at ``target`` from the model at ``source`` (its external data beside it)."""
    if recipe == "fp16":
        _fp16(options, source, target)
    elif recipe == "int8-dynamic":
        _int8_dynamic(options, source, target)
    elif recipe == "ort-optimized":
        _ort_optimized(options, source, target)
    else:
        raise RecipeError(f"unknown recipe {recipe!r}")


def _fp16(options: dict[str, Any], source: Path, target: Path) -> None:
    import onnx
    from onnxconverter_common import float16

    block = options["op_block_list"] or None
    if options["optimize"]:
        from onnxruntime.transformers import optimizer

        optimized = optimizer.optimize_model(
            str(source),
            model_type=options["model_type"],
            num_heads=options["num_heads"],
            hidden_size=options["hidden_size"],
            opt_level=0,  # the Python fusions only (no ORT pass, which needs torch): it loads on every provider
            use_gpu=False,
        )
        # The fused graph has com.microsoft operators (Attention, SkipLayerNormalization), which ONNX's
        # shape inference, and so onnxconverter-common, cannot type; ORT's own converter, a fork of
        # onnxconverter-common's that knows them, converts it.
        optimized.convert_float_to_float16(keep_io_types=True, op_block_list=block)
        optimized.topological_sort()  # that converter appends its input casts last; onnx.checker wants order
        _declare_domains(optimized.model)
        _save(optimized.model, target)
        return
    model = onnx.load(str(source))
    converted = float16.convert_float_to_float16(
        model, keep_io_types=True, op_block_list=block, disable_shape_infer=model.ByteSize() > EXTERNAL_DATA_AFTER
    )
    _fix_casts_to_float(converted)
    _save(converted, target)


def _declare_domains(model: Any) -> None:
    """Import every operator domain the graph uses (the optimiser's fusions are com.microsoft's, left undeclared)."""
    from onnx import helper

    declared = {entry.domain for entry in model.opset_import}
    for domain in sorted({node.domain for node in model.graph.node} - declared - {"", "ai.onnx"}):
        model.opset_import.append(helper.make_opsetid(domain, 1))


def _fix_casts_to_float(model: Any) -> int:
    """Retarget the model's own ``Cast(to=FLOAT)`` nodes whose output the converter made float16.

    onnxconverter-common 1.16 turns the value of such a cast (an attention mask cast to float, in
    BERT exports) into float16 but leaves its ``to`` attribute, and ONNX Runtime refuses the model
    ("Type (tensor(float16)) of output arg ... does not match expected type (tensor(float))").
    """
    from onnx import TensorProto

    types = {value.name: value.type.tensor_type.elem_type for value in [*model.graph.value_info, *model.graph.output]}
    fixed = 0
    for node in model.graph.node:
        if node.op_type != "Cast" or types.get(node.output[0]) != TensorProto.FLOAT16:
            continue
        for attribute in node.attribute:
            if attribute.name == "to" and attribute.i == TensorProto.FLOAT:
                attribute.i = TensorProto.FLOAT16
                fixed += 1
    return fixed


def _int8_dynamic(options: dict[str, Any], source: Path, target: Path) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(
        str(source),
        str(target),
        weight_type=QuantType.QInt8 if options["weight_type"] == "qint8" else QuantType.QUInt8,
        per_channel=options["per_channel"],
        op_types_to_quantize=options["op_types"] or None,
        use_external_data_format=source.stat().st_size > EXTERNAL_DATA_AFTER,
    )


def _ort_optimized(options: dict[str, Any], source: Path, target: Path) -> None:
    import onnxruntime as ort

    levels = {
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }
    provider = _PROVIDERS[options["provider"]]
    if provider not in ort.get_available_providers():
        raise RecipeError(f"this host's ONNX Runtime has no {provider}; derive for 'cpu', or on a host that has it")
    session_options = ort.SessionOptions()
    session_options.graph_optimization_level = levels[options["level"]]
    session_options.optimized_model_filepath = str(target)
    if source.stat().st_size > EXTERNAL_DATA_AFTER:
        session_options.add_session_config_entry(
            "session.optimized_model_external_initializers_file_name", f"{target.name}.data"
        )
    ort.InferenceSession(str(source), session_options, providers=[provider])


# --- Accuracy (in the child) ------------------------------------------------------------------------


def feeds_for(session: Any, samples: Path | None, signature: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The version's ``sample_inputs.json`` when it has one, synthetic inputs otherwise; and which it was."""
    from onnxkit.datatypes import random_feeds
    from onnxkit.validation import sample_inputs

    if samples is not None and samples.is_file():
        return sample_inputs(samples.read_bytes(), signature), "sample_inputs.json"
    try:
        return random_feeds(session, batch=SYNTHETIC_BATCH, other=SYNTHETIC_OTHER), "synthetic"
    except TypeError as error:
        raise RecipeError(str(error)) from None


def compare_outputs(reference: dict[str, Any], candidate: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per output: max and mean absolute difference, cosine similarity (floats), top-1 agreement (class scores)."""
    import numpy as np

    result: dict[str, dict[str, Any]] = {}
    for name, ref in reference.items():
        got = candidate.get(name)
        if got is None:
            result[name] = {"missing": True}
            continue
        ref_array, got_array = np.asarray(ref), np.asarray(got)
        if ref_array.shape != got_array.shape:
            result[name] = {"shape": list(ref_array.shape), "candidate_shape": list(got_array.shape)}
            continue
        if ref_array.dtype == object or not np.issubdtype(ref_array.dtype, np.number):
            result[name] = {"equal_fraction": float(np.mean(ref_array == got_array)) if ref_array.size else 1.0}
            continue
        a = ref_array.astype(np.float64).reshape(-1)
        b = got_array.astype(np.float64).reshape(-1)
        diff = np.abs(a - b)
        entry: dict[str, Any] = {
            "max_abs_diff": float(diff.max()) if diff.size else 0.0,
            "mean_abs_diff": float(diff.mean()) if diff.size else 0.0,
        }
        if np.issubdtype(ref_array.dtype, np.floating):
            norms = float(np.linalg.norm(a) * np.linalg.norm(b))
            entry["cosine"] = (
                float(np.dot(a, b) / norms) if norms > 0 else (1.0 if not a.any() and not b.any() else 0.0)
            )
            if ref_array.ndim == 2 and ref_array.shape[1] > 1:
                agree = np.argmax(ref_array, axis=1) == np.argmax(got_array, axis=1)
                entry["top1_agreement"] = float(agree.mean()) if agree.size else 1.0
        result[name] = {key: (value if math.isfinite(value) else None) for key, value in entry.items()}
    return result


def summarise(outputs: dict[str, dict[str, Any]]) -> dict[str, float]:
    """The worst of every output: lowest cosine and top-1 agreement, largest absolute difference."""
    worst: dict[str, float] = {}
    for entry in outputs.values():
        for key, pick in (("cosine", min), ("top1_agreement", min), ("max_abs_diff", max), ("mean_abs_diff", max)):
            value = entry.get(key)
            if isinstance(value, float):
                worst[key] = pick(worst[key], value) if key in worst else value
    return worst


def accuracy_delta(parent: Path, derived: Path, samples: Path | None, signature: dict[str, Any]) -> dict[str, Any]:
    """Run both models on CPU on the same inputs; how far each output of ``derived`` is from ``parent``'s."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    reference = ort.InferenceSession(str(parent), options, providers=["CPUExecutionProvider"])
    candidate = ort.InferenceSession(str(derived), options, providers=["CPUExecutionProvider"])
    feeds, source = feeds_for(reference, samples, signature)
    names = [out.name for out in reference.get_outputs()]
    expected = dict(zip(names, reference.run(names, feeds), strict=True))
    got = dict(zip(names, candidate.run(names, feeds), strict=True))
    outputs = compare_outputs(expected, got)
    return {"against": None, "inputs": source, "outputs": outputs, "worst": summarise(outputs)}


def derive_child(request: dict[str, Any], on_step: Callable[[str], None]) -> dict[str, Any]:
    """In the child: convert, then measure the accuracy delta. ``request``: paths, recipe, options, signature."""
    recipe, options = request["recipe"], request["options"]
    source, out_dir = Path(request["model_path"]), Path(request["out_dir"])
    target = out_dir / RESULT_NAME
    on_step(f"building the {recipe} model")
    convert(recipe, options, source, target)
    accuracy: dict[str, Any]
    if recipe == "ort-optimized" and options["provider"] != "cpu":
        accuracy = {"skipped": f"a model optimised for {_PROVIDERS[options['provider']]} is not compared on CPU"}
    else:
        on_step("measuring the accuracy delta against the parent")
        samples = request.get("samples_path")
        accuracy = accuracy_delta(source, target, Path(samples) if samples else None, request["signature"])
    return {
        "files": sorted(path.name for path in out_dir.iterdir() if path.is_file()),
        "accuracy": accuracy,
        "libraries": library_versions(),
    }
