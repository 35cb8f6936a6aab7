"""Django signals a site connects to, to react when a run changes state.

Each is delivered at least once per committed transition, after the
transaction that wrote the transition's run event commits
(``transaction.on_commit`` on the engine's database), and never for a
transition that was rolled back: a caller's transaction around an inline
start, a step's savepoint, a worker's batch. A process that dies after the
commit, before its receivers ran, leaves a delivery row that a resume
worker delivers again (see :mod:`kumiko_workflows.engine.transitions`), so a
receiver may hear one transition twice: ``delivery_id`` is the same on
every repeat.
With the engine's tables on a database of their own, that transaction is
the one on the engine's alias: an append inside a transaction on another
alias alone is refused (:class:`~kumiko_workflows.exceptions.CrossDatabaseTransaction`).

``sender`` is the definition of the run's own version (the object
``define_workflow`` returned for it), so
``run_completed.connect(receiver, sender=order_fulfilment)`` hears that
workflow version only; it is None when that version is no longer declared
as the run ran (a run failed with ``workflow_definition_changed``). Every
signal has the keyword arguments ``run_id`` (UUID), ``workflow_name``,
``tenant_id``, ``event`` (the run's :class:`~kumiko_workflows.models.Event`
that made the transition) and ``delivery_id`` (that event's id); the others
are listed beside each signal.

A receiver that raises is logged once (logger ``kumiko_workflows.signals``)
and does not keep the other receivers from running; the run is committed by
then, and the signal is not delivered again for it.
"""

from __future__ import annotations

from django.dispatch import Signal

#: ``workflow.run-started``: also ``idempotency_key`` and ``trigger_event_id``.
run_started = Signal()
#: ``workflow.step.waiting``, ``workflow.step.waiting-for-event`` or
#: ``workflow.retry.scheduled``: also ``step`` (its position, e.g. ``"2.else.1"``),
#: ``suspension_type`` (``"wait"``, ``"event"``, ``"retry"``) and ``wake_at``
#: (an aware datetime; None for a ``wait_for_event`` without a timeout).
run_suspended = Signal()
#: ``workflow.run-completed``.
run_completed = Signal()
#: ``workflow.run-failed``: also ``reason`` (e.g. ``"step_failed"``), ``step``
#: and ``error_class`` (never the error's text: that is in ``WorkflowRun.last_error``).
run_failed = Signal()
#: ``workflow.run-cancelled``: also ``reason`` and ``by``.
run_cancelled = Signal()
