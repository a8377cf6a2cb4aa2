"""The ground floor for ONNX bundles: what both planes need, and nothing of Django or the rest of the project.

- ``datatypes``: ONNX element types, Open Inference Protocol names and numpy dtypes, in one table;
- ``sniff``: a constant-memory structural check of an ONNX file as its bytes stream past;
- ``signatures``: comparing two signatures, and whether one lets requests be merged;
- ``tokenizer``: a version's ``tokenizer.json`` (the ``text`` input);
- ``validation``: a bundle's checks, from protobuf to one ONNX Runtime run and the batching check;
- ``derive``: the recipes that build a derived version, and the accuracy delta;
- ``measure``: the measuring half of a benchmark;
- ``sandbox``: the one bounded child process (``run_in_child``) that validation, derivations and
  benchmarks run in.

The registry passes settings down as plain values; a test keeps this package free of Django and of
every other package of the project, so that the data plane and the sandboxed child import it bare.
"""
