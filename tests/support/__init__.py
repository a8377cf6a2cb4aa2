"""Helpers the tests share: named people, uploads, model builders, S3, processes, raw HTTP, polling.

Test modules and conftest files import from here; conftest files only declare fixtures, and
nothing imports from a conftest.
"""
