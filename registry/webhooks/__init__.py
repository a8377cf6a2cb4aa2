"""Webhooks: registering endpoints, emitting events inside a change's transaction and delivering them
signed, after commit, with retries (``services``), through the address-checked POST (``outbound``)."""
