"""Signed provenance: the registry's signature on every validated version, uploaders' bundles checked
on arrival, derived versions' signed statements, and what an alias that requires a signature accepts.

The signing and checking themselves are ``modelyard.provenance`` (no Django); this wing keeps the
bundles in storage beside the files (``services.py``) and answers for them.
"""
