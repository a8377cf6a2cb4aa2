"""The REST API under ``/api/v1/`` (DRF): thin views that check their input and call one service each
(``views``: models and versions; ``alias_views``, ``derive_views``, ``token_views``, ``webhook_views``,
``audit_views``, ``fleet_views``), their serializers, routes (``urls``), the JSON error handler
(``errors``, on the one status table of ``registry/http.py``), and streamed responses."""
