"""What an appended event updates, synchronously, in its own transaction.

:mod:`.run_status` and :mod:`.pending` keep the run tables, pure functions
of the events; the event store hands them each new event in order
(:mod:`kumiko_workflows.store.dispatch`). The reactions that append run
events (starting runs, waking them) live with the engine, in
:mod:`kumiko_workflows.engine`.
"""
