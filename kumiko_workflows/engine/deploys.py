"""Rolling deploys: which side of a deploy is newer, and edits a run survives.

During a deploy, old and new processes run side by side. Each process
registers the definitions its code declares
(:class:`~kumiko_workflows.models.DeployedDefinition`, first seen on the
database's clock) as it connects to the database, and every run event
records the fingerprint of the definition that wrote it. A worker that meets
a run whose definition it lacks compares: if that definition was first seen
after the newest one of the worker's own code, the run belongs to newer
code, and the worker *leaves* it (the row stays due, for a worker that has
the code), logs once that it should be restarted, and claims no row of that
definition again; its heartbeat names what it left (``workflow_status
--check``). Only code at least as new as the run's decides its fate.

That code resumes the run on the edited definition when nothing the run has
run or waits at changed (:meth:`~kumiko_workflows.workflow.definition.Workflow.changes_for_run`):
steps appended after it, or edits to steps it has not reached, keep it
going. Otherwise the run fails (``workflow_definition_changed``) with the
changes named from the run's side and what to do about them.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Iterator, KeysView, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import DatabaseError
from django.db.backends.signals import connection_created
from django.dispatch import receiver

from kumiko_workflows.exceptions import RegistryNotReady
from kumiko_workflows.models import DeployedDefinition, Event, WorkflowRunPending
from kumiko_workflows.store import db, statements
from kumiko_workflows.workflow import event_types as et
from kumiko_workflows.workflow.definition import Workflow
from kumiko_workflows.workflow.registry import registry

logger = logging.getLogger(__name__)

#: What a failure for a changed definition says to do about it.
ADVICE = (
    "To let such runs finish, declare the edit under a new version= beside the old "
    "definition (each run resumes on the version it started on), or declare migrates_from "
    "and move the waiting runs with `manage.py migrate_workflow_runs`; once the run's "
    "definition is declared again, this run can be rerun."
)
#: Seconds between two tries to register while the table is missing (not migrated yet).
_RETRY_SECONDS = 60.0

#: Fingerprints this process has registered.
_registered: set[str] = set()
_last_try: float | None = None
#: Per code (the set of fingerprints a process declares): the newer
#: definitions met, by fingerprint, with what the heartbeat tells about them.
_left: dict[frozenset[str], dict[str, dict[str, Any]]] = {}
#: Registrations never change: comparisons made with all of them, per code and fingerprint.
_compared: dict[tuple[frozenset[str], str], DeployedDefinition | None] = {}
_prints: dict[str, Mapping[str, str]] = {}


def process_name() -> str:
    """This process as heartbeats name it: ``host:pid``."""
    return f"{socket.gethostname()[:255]}:{os.getpid()}"


def _code() -> frozenset[str]:
    return frozenset(w.fingerprint for w in registry.every_version())


def register_code(*, force: bool = False) -> bool:
    """Register the definitions this process declares that it has not registered yet.

    In its own statement, committed with the caller's transaction if there
    is one (a worker asks in its resume). Returns whether every one is
    registered; a table not migrated yet is logged, never raised (but a
    broken connection is), and retried at most once a minute unless ``force``.
    """
    global _last_try
    try:
        missing = [w for w in registry.every_version() if w.fingerprint not in _registered]
    except RegistryNotReady:
        return False
    if not missing:
        return True
    if not force and _last_try is not None and time.monotonic() - _last_try < _RETRY_SECONDS:
        return False
    _last_try = time.monotonic()
    rows = [(w.fingerprint, w.name, w.version, w.step_fingerprints) for w in missing]
    try:
        with db.atomic():
            statements.register_definitions(rows, process_name())
    except DatabaseError as exc:
        if db.connection_broken():
            raise
        # Quiet as a process connects (``migrate`` itself connects before the table exists).
        logger.log(
            logging.WARNING if force else logging.DEBUG,
            "this process's workflow definitions could not be registered (%s); is the "
            "kumiko_workflows migration applied? Workers cannot tell old code from new until "
            "they are",
            type(exc).__name__,
        )
        return False
    prints = {row[0] for row in rows}
    # Kept only once committed: a rolled-back transaction took the rows with it.
    db.on_commit(lambda: _registered.update(prints))
    return True


_held: ContextVar[bool] = ContextVar("kumiko_registration_held", default=False)


@contextmanager
def not_registering_on_connect() -> Iterator[None]:
    """No registration as a connection opens during the block (a rehearsal writes nothing).

    Registering on connect commits at once, outside the rehearsal's
    transaction; inside it, :func:`register_code` is rolled back with the rest.
    """
    token = _held.set(True)
    try:
        yield
    finally:
        _held.reset(token)


@receiver(connection_created)
def _register_on_connect(sender: Any, connection: Any, **kwargs: Any) -> None:
    """Register this process's code as it first connects, outside any transaction.

    So a web process that starts a run has registered its definitions
    before, and whatever happens to the transaction that starts it.
    """
    if _held.get():
        return
    try:
        if connection.alias == db.alias() and not connection.in_atomic_block:
            register_code()
    except Exception:
        # Never in the way of a connection: a worker registers again before it compares.
        logger.debug("workflow definitions not registered on connect", exc_info=True)


def forget() -> None:
    """Forget what this process registered and left (tests that empty the tables)."""
    global _last_try
    _registered.clear()
    _left.clear()
    _compared.clear()
    _prints.clear()
    _last_try = None


def leaving() -> KeysView[str]:
    """Fingerprints of newer definitions this process's code leaves (its claims skip them).

    A live view: a pass takes it once and sees what it learns meanwhile.
    """
    return _left.setdefault(_code(), {}).keys()


def left_code() -> list[dict[str, Any]]:
    """What the heartbeat says this worker left: one entry per newer definition met."""
    return sorted(_left.get(_code(), {}).values(), key=lambda entry: entry["fingerprint"])


@dataclass
class Verdict:
    """What to do with a run whose definition this process lacks.

    ``leave``: the run's code is newer. Else ``workflow`` to resume on (an
    edit it survives), or ``problem``: why it fails.
    """

    leave: bool = False
    workflow: Workflow | None = None
    problem: str | None = None


def _first_seen(fingerprints: set[str]) -> dict[str, DeployedDefinition]:
    return {
        d.fingerprint: d for d in DeployedDefinition.objects.filter(fingerprint__in=fingerprints)
    }


def newer_than_mine(fingerprint: str) -> DeployedDefinition | None:
    """The registration of ``fingerprint`` if it is newer than all of this process's code.

    A definition nobody registered was written by code from before
    registrations: older. So is one this process cannot compare with (its
    own could not be registered): it decides, as before.
    """
    mine = _code()
    if fingerprint in mine:
        return None
    if (mine, fingerprint) in _compared:
        return _compared[(mine, fingerprint)]
    if not register_code(force=True):
        return None
    seen = _first_seen({*mine, fingerprint})
    theirs = seen.get(fingerprint)
    own = [seen[f].first_seen_at for f in mine if f in seen]
    if theirs is None or len(own) < len(mine):
        return None  # not (yet) comparable: asked again next time
    newer = theirs if theirs.first_seen_at > max(own, default=theirs.first_seen_at) else None
    _compared[(mine, fingerprint)] = newer
    return newer


def run_prints(tenant_id: str, run_id: uuid.UUID, fingerprint: str) -> Mapping[str, str] | None:
    """The step fingerprints of the definition ``fingerprint`` a run is on, or None if unknown.

    From its registration, else from the run's start or move (which record
    them), if that is the definition the run is still on.
    """
    if fingerprint in _prints:
        return _prints[fingerprint]
    known = DeployedDefinition.objects.filter(fingerprint=fingerprint).first()
    if known is not None:
        prints: Mapping[str, str] = known.step_fingerprints
        _prints[fingerprint] = prints
        return prints
    origin = (
        Event.objects.filter(
            tenant_id=tenant_id, aggregate_id=run_id, type__in=(et.RUN_STARTED, et.RUN_MIGRATED)
        )
        .order_by("-version")
        .first()
    )
    if origin is None or origin.payload.get("definition_fingerprint") != fingerprint:
        return None
    return origin.payload.get("step_fingerprints") or None


def compatible(
    name: str,
    version: int | None,
    fingerprint: str,
    position: str,
    prints: Mapping[str, str] | None,
    *,
    advice: bool = True,
) -> tuple[Workflow | None, str]:
    """The declared definition a run at ``position`` resumes on, or why there is none.

    The run's own version (any declared one, for a run that recorded none)
    with nothing changed that the run has met (see
    :meth:`Workflow.changes_for_run`). ``advice`` ends an edit's message
    with what to do about it.
    """
    declared = registry.versions(name)
    if not declared:
        return None, f"workflow {name!r} is not registered (was it removed or renamed?)"
    if version is not None:
        workflow = registry.get(name, version)
        if workflow is None:
            return None, (
                f"version {version} of workflow {name!r} is no longer declared (declared: "
                f"{', '.join(str(w.version) for w in declared)}); declare it beside the new "
                "one until its runs drain, or move them with migrate_workflow_runs"
            )
        candidates = [workflow]
    else:
        candidates = declared
    where = f"workflow {name!r}" if version is None else f"version {version} of workflow {name!r}"
    if prints is None:
        # Nothing says what the run's definition was: any change counts.
        return None, f"{where} changed since the run started" + (f". {ADVICE}" if advice else "")
    changes: list[str] = []
    for workflow in candidates:
        if workflow.fingerprint == fingerprint:
            return workflow, ""
        found = workflow.changes_for_run(prints, position)
        if not found:
            return workflow, ""
        changes = changes or found
    return None, (
        f"{where} changed where the run is (step {position or 'after the last'}): "
        f"{'; '.join(changes)}" + (f". {ADVICE}" if advice else "")
    )


def judge(row: WorkflowRunPending) -> Verdict:
    """What a resume does with ``row``, whose definition this process's code lacks."""
    newer = newer_than_mine(row.definition_fingerprint)
    if newer is not None:
        _leave(row, newer)
        return Verdict(leave=True)
    prints = run_prints(row.tenant_id, row.run_id, row.definition_fingerprint)
    workflow, problem = compatible(
        row.workflow_name, row.workflow_version, row.definition_fingerprint, row.step, prints
    )
    if workflow is not None:
        logger.info(
            "run=%s workflow=%s step=%s resumes on the edited definition %s (was %s): nothing "
            "it has run or waits at changed",
            row.run_id,
            row.workflow_name,
            row.step,
            workflow.fingerprint[:12],
            row.definition_fingerprint[:12],
        )
    return Verdict(workflow=workflow, problem=problem or None)


def _leave(row: WorkflowRunPending, newer: DeployedDefinition) -> None:
    left = _left.setdefault(_code(), {})
    if newer.fingerprint in left:
        return
    left[newer.fingerprint] = {
        "fingerprint": newer.fingerprint,
        "workflow_name": newer.workflow_name,
        "workflow_version": newer.workflow_version,
        "first_seen_at": newer.first_seen_at.isoformat(),
        "first_seen_by": newer.first_seen_by,
    }
    logger.warning(
        "this worker's code is older than run %s needs (workflow %r version %s, definition %s "
        "first seen %s by %s): it leaves such runs for a worker that has that code. Restart "
        "this worker (%s) with the new code.",
        row.run_id,
        newer.workflow_name,
        newer.workflow_version,
        newer.fingerprint[:12],
        newer.first_seen_at.isoformat(),
        newer.first_seen_by,
        process_name(),
    )


def left_due(entries: list[dict[str, Any]], tenant_id: str | None, now: datetime) -> int:
    """How many due runs are on the definitions a stale worker left (``entries``)."""
    fingerprints = [entry["fingerprint"] for entry in entries]
    if not fingerprints:
        return 0
    return (
        WorkflowRunPending.objects.for_tenant(tenant_id)
        .due(now)
        .filter(definition_fingerprint__in=fingerprints)
        .count()
    )
