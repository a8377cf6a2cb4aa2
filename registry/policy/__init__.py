"""Alias promotion policies: rules in the Common Expression Language (CEL), checked against a promotion's evidence."""
