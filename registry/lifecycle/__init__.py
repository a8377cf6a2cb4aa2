"""A version's life after its release: archive, legal hold, delete with a tombstone, retention, lineage, its card."""
