"""The audit log: the hash chain every change appends its event to and reads back (``chain``), the
verifier that recomputes it and names the first event that does not fit (``verify``), and the
registry's signatures over the chain's head that let an exported copy prove itself (``heads``)."""
