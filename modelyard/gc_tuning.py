"""Python's garbage collector in a long-running server process (``modelyard serve``, every role).

A server that has imported Django, DRF, numpy and the rest holds some 200,000 Python objects that
live as long as it does. Python's collector scans every one of them at each full (oldest-generation)
collection: about 100 ms on a small CPU, during which the event loop answers nothing. Under load that
happened a few times a minute, and the collector took 0.06 ms of the event loop's time per request on
average (``bench/serve.py``'s MiniLM load, measured with ``gc.callbacks``), all of it in pauses that
land on whichever requests are in flight.

:func:`tune_for_serving`, called once the server has started, before any model is loaded, moves every
object into the permanent generation (``gc.freeze()``, a few microseconds: never scanned again), and
makes full collections ten times rarer (``gc.set_threshold``'s third value, 10 to 100). Frozen objects
are still freed by reference counting when nothing points at them; only cyclic garbage among them would
stay, and a collection at that point finds none (start-up makes modules, settings and the URL conf,
which live as long as the process), so none is run: it would cost 70 ms of the start. The objects
made later (loaded versions, their sessions, requests) are collected as before, so a version released
by a swap is freed as before. ``MODELYARD_GC_TUNING=false`` leaves the collector as Python sets it.
"""

from __future__ import annotations

import gc

from django.conf import settings

FULL_COLLECTION_EVERY = 100  # young collections between two full ones (Python's default: 10)


def tune_for_serving() -> None:
    """Freeze the start-up objects and make full collections rarer, unless the setting turns it off."""
    if not settings.GC_TUNING:
        return
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_COLLECTION_EVERY)
