"""The audit log: the hash chain every change appends its event to and reads back (``chain``), and the
verifier that recomputes it and names the first event that does not fit (``verify``)."""
