"""The database layer and the event store.

:mod:`.db` holds the engine's connection and every raw statement;
:mod:`.events` appends and reads events (``append_event``);
:mod:`.dispatch` hands each new event to the registered projections;
:mod:`.streams` writes a run's own stream (``RunStream``, failures).
"""
