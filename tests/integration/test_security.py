"""Security: who may see and do what in the admin, what run events may hold, raw SQL, HTTP.

tests/integration/test_admin.py tests the admin's features one by one; this module walks
every admin URL of the app and every action with every kind of user that
must be refused, and checks that nothing changed.
"""

from __future__ import annotations

import ast
import json
import re
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from django.utils import timezone

from kumiko_workflows import append_event, cancel_run, resume_due_runs, run_id_for, wake_run
from kumiko_workflows import event_types as et
from kumiko_workflows.models import Event, WorkflowRun, WorkflowRunPending
from tests.support import trigger, types_of

pytestmark = pytest.mark.django_db

PACKAGE = Path(__file__).resolve().parent.parent.parent / "kumiko_workflows"
MODELS = {"event": Event, "workflowrun": WorkflowRun, "workflowrunpending": WorkflowRunPending}
ACTION_PERMS = {
    "wake_now": "wake_workflowrun",
    "cancel_runs": "cancel_workflowrun",
    "rerun_failed": "rerun_workflowrun",
}
VIEW_PERMS = ["view_event", "view_workflowrun", "view_workflowrunpending"]
ALL_PERMS = [
    f"{verb}_{model}" for verb in ("add", "change", "delete", "view") for model in MODELS
] + list(ACTION_PERMS.values())


def tenant_of_user(request):
    """ADMIN_TENANT for these tests: a staff user's last name is their tenant."""
    return request.user.last_name or None


def _user(django_user_model, name, perms=(), *, staff=True, tenant=""):
    user = django_user_model.objects.create_user(name, password="pw", is_staff=staff)
    user.last_name = tenant
    user.save()
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="kumiko_workflows", codename__in=perms)
    )
    return user


def _world(tenant: str) -> dict:
    """A waiting run, a failed run, their events and pending row, in one tenant."""
    future = (timezone.now() + timedelta(hours=1)).isoformat()
    waiting = trigger("t.wait", tenant_id=tenant, **{"for": future})
    failing = trigger("t.fail", tenant_id=tenant)
    waiting_run = run_id_for("t-wait", waiting.payload["run_key"], tenant)
    failed_run = run_id_for("t-fail", failing.payload["run_key"], tenant)
    return {
        "waiting": WorkflowRun.objects.get(run_id=waiting_run),
        "failed": WorkflowRun.objects.get(run_id=failed_run),
        "event": Event.objects.filter(tenant_id=tenant).latest("id"),
        "pending": WorkflowRunPending.objects.get(run_id=waiting_run),
    }


def _snapshot() -> tuple:
    """Everything an admin request could change."""
    return (
        list(Event.objects.order_by("id").values_list("id", "type")),
        list(WorkflowRun.objects.order_by("run_id").values()),
        list(WorkflowRunPending.objects.order_by("id").values()),
    )


def _admin_urls(world: dict) -> list[str]:
    """Every admin URL of the app, with object ids from ``world``."""
    objects = {
        "event": world["event"].pk,
        "workflowrun": world["waiting"].pk,
        "workflowrunpending": world["pending"].pk,
    }
    urls = [reverse("admin:app_list", args=["kumiko_workflows"])]
    for model, pk in objects.items():
        urls.append(reverse(f"admin:kumiko_workflows_{model}_changelist"))
        urls.append(reverse(f"admin:kumiko_workflows_{model}_add"))
        for view in ("change", "history", "delete"):
            urls.append(reverse(f"admin:kumiko_workflows_{model}_{view}", args=[pk]))
    return urls


def _action_posts(world: dict) -> list[dict]:
    runs = [str(world["waiting"].pk), str(world["failed"].pk)]
    return [
        {"action": action, "_selected_action": runs, "kw_confirm": "yes", "reason": "r"}
        for action in ACTION_PERMS
    ] + [{"action": "wake_now", "_selected_action": runs, "select_across": "1", "index": "0"}]


RUNS = "admin:kumiko_workflows_workflowrun_changelist"


# --- admin: refused users ------------------------------------------------------------


@pytest.mark.parametrize("who", ["anonymous", "non-staff with every permission"])
def test_every_admin_url_and_action_sends_non_staff_to_the_login(client, django_user_model, who):
    world = _world("default")
    if who != "anonymous":
        client.force_login(_user(django_user_model, "pat", ALL_PERMS, staff=False))
    before = _snapshot()

    for url in _admin_urls(world):
        for method in (client.get, client.post):
            response = method(url, {"post": "yes", "reason": "x"})
            assert response.status_code == 302, (method, url, response.status_code)
            assert response["Location"].startswith(reverse("admin:login")), url
    for data in _action_posts(world):
        response = client.post(reverse(RUNS), data)
        assert response.status_code == 302 and "/login/" in response["Location"], data

    assert _snapshot() == before


def test_staff_without_permissions_are_refused_everywhere(client, django_user_model):
    world = _world("default")
    client.force_login(_user(django_user_model, "sam"))
    before = _snapshot()

    for url in _admin_urls(world):
        for method in (client.get, client.post):
            response = method(url, {"post": "yes"})
            # 403, or a 404 for the app index of an app the user may not see.
            assert response.status_code in (403, 404), (method, url, response.status_code)
    for data in _action_posts(world):
        assert client.post(reverse(RUNS), data).status_code == 403

    assert _snapshot() == before


def test_view_only_staff_can_look_but_change_nothing(client, django_user_model):
    world = _world("default")
    client.force_login(_user(django_user_model, "vic", VIEW_PERMS))
    before = _snapshot()

    for url in _admin_urls(world):
        client.get(url)
        response = client.post(url, {"post": "yes", "status": "completed", "tenant_id": "x"})
        if re.search(r"/(add|change|delete)/$", url):
            assert response.status_code == 403, (url, response.status_code)
    for data in _action_posts(world):
        response = client.post(reverse(RUNS), data)
        assert response.status_code in (200, 302), data

    assert _snapshot() == before
    assert client.get(reverse(RUNS)).status_code == 200  # they can look


@pytest.mark.parametrize("action", ACTION_PERMS)
def test_each_action_needs_its_own_permission(client, django_user_model, action):
    world = _world("default")
    others = [perm for name, perm in ACTION_PERMS.items() if name != action]
    client.force_login(_user(django_user_model, "ann", [*VIEW_PERMS, *others]))
    before = _snapshot()

    for data in _action_posts(world):
        if data["action"] == action:
            client.post(reverse(RUNS), data)
            client.post(reverse(RUNS), {**data, "_kw_return": "1"})

    assert _snapshot() == before


# --- admin: tenants kept apart -----------------------------------------------------------


@pytest.fixture
def scoped(settings):
    settings.KUMIKO_WORKFLOWS = {
        **settings.KUMIKO_WORKFLOWS,
        "ADMIN_TENANT": "tests.integration.test_security.tenant_of_user",
    }


def test_tenant_staff_cannot_reach_another_tenant_by_editing_urls(
    client, django_user_model, scoped
):
    _world("acme")
    theirs = _world("globex")
    client.force_login(_user(django_user_model, "alice", ALL_PERMS, tenant="acme"))
    before = _snapshot()

    listings = {reverse(f"admin:kumiko_workflows_{model}_changelist") for model in MODELS}
    for url in _admin_urls(theirs)[1:]:
        if url.endswith("/add/"):
            continue
        for method in (client.get, client.post):
            response = method(url, {"post": "yes"})
            if url in listings:
                assert "globex" not in response.content.decode(), url
            else:
                # Their objects do not exist for alice: the admin redirects (or,
                # for a POST to a read-only page, refuses before looking).
                assert response.status_code in (302, 403), (url, response.status_code)
                if response.status_code == 302:
                    assert response["Location"] == reverse("admin:index"), url
                assert "globex" not in response.content.decode(), url

    # Filters and searches in the URL cannot widen the list.
    their_pages = [url for url in _admin_urls(theirs) if url.endswith("/change/")]
    for model in MODELS:
        listing = reverse(f"admin:kumiko_workflows_{model}_changelist")
        for query in (
            {"tenant_id": "globex"},
            {"tenant_id__exact": "globex"},
            {"q": str(theirs["waiting"].run_id)},
            {"q": "globex"},
        ):
            response = client.get(listing, query)
            rows = response.context["cl"].result_list if response.status_code == 200 else []
            assert all(row.tenant_id == "acme" for row in rows), (model, query)
            page = response.content.decode()
            for url in their_pages:
                assert url not in page, (model, query, url)
    assert _snapshot() == before


def test_tenant_staff_cannot_act_on_another_tenant_by_posting_ids(
    client, django_user_model, scoped
):
    mine = _world("acme")
    theirs = _world("globex")
    client.force_login(_user(django_user_model, "alice", ALL_PERMS, tenant="acme"))
    their_runs = lambda: list(  # noqa: E731
        WorkflowRun.objects.filter(tenant_id="globex").order_by("run_id").values()
    )
    their_events = Event.objects.filter(tenant_id="globex").count()
    before = their_runs()

    for data in _action_posts(theirs):
        client.post(reverse(RUNS), data)
        client.post(reverse(RUNS), {**data, "_kw_return": "1"})
    # Mixed selections and "select all" act on alice's tenant only.
    mixed = [str(mine["waiting"].pk), str(theirs["waiting"].pk)]
    client.post(reverse(RUNS), {"action": "wake_now", "_selected_action": mixed})
    client.post(
        reverse(RUNS),
        {"action": "cancel_runs", "_selected_action": mixed, "select_across": "1", "index": "0"}
        | {"kw_confirm": "yes", "reason": "all of them"},
    )

    assert their_runs() == before
    assert Event.objects.filter(tenant_id="globex").count() == their_events
    assert types_of(mine["waiting"].run_id)[-2:] == [et.WAKE_REQUESTED, et.RUN_CANCELLED]


# --- run events hold references, never copies or raw errors ---------------------------


def test_run_events_hold_references_not_payloads_or_raw_errors(past, caplog):
    marker = f"MARKER-{uuid.uuid4().hex}"
    secret = {"card": f"{marker}-card", "note": f"{marker}-note"}
    # A mixed workload: completed, suspended, awaited, retried, failed, cancelled runs.
    trigger("t.wait", **{"for": past}, **secret)
    waiting = trigger("t.wait", **{"for": "P1D"}, **secret)
    awaited_start = trigger("t.signed-up", user_id="u1", timeout="P7D", **secret)
    append_event(uuid.uuid4(), "user", "t.verified", {"user_id": "u1", "secret": marker})
    trigger("t.retry", fail_attempts=1, **secret)
    trigger("t.retry", fail_attempts=9, **secret)
    trigger("t.fail", **secret)
    trigger("t.branch", **{"for": past}, **secret)
    trigger("t.faults-result", junk="set", **secret)
    trigger("t.faults-args", **{"for": past}, match={"version": 1, "expr": marker}, **secret)
    hostile = trigger("t.signed-up", user_id="u2", timeout="P7D", **secret)
    WorkflowRunPending.objects.filter(
        run_id=run_id_for("t-event", hostile.payload["run_key"])
    ).update(match_expr={"version": 1, "expr": {"kind": marker}})
    append_event(uuid.uuid4(), "user", "t.verified", {"user_id": "u2", "secret": marker})
    later = timezone.now() + timedelta(hours=2)
    for _ in range(3):
        resume_due_runs(now=later)
    cancel_run(run_id_for("t-wait", waiting.payload["run_key"]), reason="customer asked")
    wake_run(run_id_for("t-event", awaited_start.payload["run_key"]))

    run_events = Event.objects.filter(aggregate_type=et.RUN_AGGREGATE_TYPE)
    kinds = set(run_events.values_list("type", flat=True))
    assert {et.RUN_COMPLETED, et.RUN_FAILED, et.RETRY_SCHEDULED, et.RUN_CANCELLED} <= kinds
    reasons = {e.payload["reason"] for e in run_events.filter(type=et.RUN_FAILED)}
    assert {"step_failed", "invalid_step_result", "invalid_step_argument", "invalid_match"} <= (
        reasons
    )
    # Whole phrases: a short needle like "4242" turns up in random hex ids.
    forbidden = [marker, "hunter2", "card 4242", "secret-detail", "Traceback", 'File "']
    for event in run_events:
        text = json.dumps(event.payload) + json.dumps(event.metadata)
        for needle in forbidden:
            assert needle not in text, (event.type, needle, event.payload)
    # References by id instead: the trigger and the awaited event.
    started = run_events.filter(type=et.RUN_STARTED)
    assert all(isinstance(e.payload["trigger_event_id"], int) for e in started)
    resumed_with = [e.payload.get("awaited_event_id") for e in run_events.filter(type=et.RESUMED)]
    assert any(isinstance(i, int) for i in resumed_with)
    # The raw text exists, but only in the mutable status rows and the log: the
    # scan above could have found it.
    last_errors = " ".join(WorkflowRun.objects.values_list("last_error", flat=True))
    assert "hunter2" in last_errors and "secret-detail" in last_errors
    assert "hunter2" in caplog.text or any(
        "hunter2" in str(r.exc_info[1]) for r in caplog.records if r.exc_info
    )


# --- raw SQL uses parameters only -----------------------------------------------------

SQL_WORDS = re.compile(
    r"\b(SELECT|INSERT|UPDATE|DELETE|FROM|WHERE|LOCK TABLE|CREATE|DROP|ANALYZE|LISTEN|NOTIFY)\b"
)
#: How an identifier (never a value) is spelled where it is put into SQL text
#: (``db._now_sql``: the database clock's expression, a constant per vendor; the wake-up
#: checks' fragments, ``wait_paths_cte``, ``_scanned_waits`` and the append's
#: ``_build_insert``, built from identifiers and placeholders alone).
IDENTIFIER_SOURCES = re.compile(
    r"quote_name\(|_meta\.db_table|\bself\.table\(|\bself\.scratch_like\(|\bself\.prefix\b"
    r"|sql\.Identifier\(|\b_now_sql\(|\bwait_paths_cte\(|\b_scanned_waits\(|\b_build_insert\("
    r"|\b_ident\(|\b_probe\(|\b_only\(|\b_array_of\("
)


def _sql_strings(tree: ast.AST):
    """Every f-string, %-formatted or .format()ted string literal that looks like SQL."""
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            text = "".join(v.value for v in node.values if isinstance(v, ast.Constant))
            if SQL_WORDS.search(text):
                yield node, "f-string"
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
            if isinstance(node.left, ast.Constant) and isinstance(node.left.value, str):
                if SQL_WORDS.search(node.left.value):
                    yield node, "%-formatting"
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            target = node.func.value
            if node.func.attr == "format" and isinstance(target, ast.Constant):
                if isinstance(target.value, str) and SQL_WORDS.search(target.value):
                    yield node, ".format()"


def _assignments(tree: ast.AST) -> dict[str, list[ast.AST]]:
    found: dict[str, list[ast.AST]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    found.setdefault(target.id, []).append(node.value)
    return found


def _is_identifier(expr: ast.AST, assigned: dict[str, list[ast.AST]], depth: int = 0) -> bool:
    if IDENTIFIER_SOURCES.search(ast.unparse(expr)):
        return True
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return True  # a constant column list, say
    if isinstance(expr, ast.JoinedStr):
        return all(
            _is_identifier(v.value, assigned, depth + 1)
            for v in expr.values
            if isinstance(v, ast.FormattedValue)
        )
    if isinstance(expr, ast.IfExp):
        return _is_identifier(expr.body, assigned, depth) and _is_identifier(
            expr.orelse, assigned, depth
        )
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
        return _is_identifier(expr.left, assigned, depth) and _is_identifier(
            expr.right, assigned, depth
        )
    if (
        isinstance(expr, ast.Call)
        and isinstance(expr.func, ast.Attribute)
        and expr.func.attr == "join"
        and isinstance(expr.func.value, ast.Constant)
        and len(expr.args) == 1
    ):
        # ", ".join(...) of identifiers, or of "%s" placeholders.
        items = expr.args[0]
        if isinstance(items, ast.BinOp) and isinstance(items.op, ast.Mult):
            items = items.left
        if isinstance(items, ast.GeneratorExp | ast.ListComp):
            return _is_identifier(items.elt, assigned, depth)
        if isinstance(items, ast.List | ast.Tuple):
            return all(_is_identifier(e, assigned, depth) for e in items.elts)
        return False
    if isinstance(expr, ast.Name) and depth < 4:
        values = assigned.get(expr.id, [])
        return bool(values) and all(_is_identifier(v, assigned, depth + 1) for v in values)
    return False


def _scopes(tree: ast.Module):
    """Each function, and the module's own statements, as a scope for names."""
    functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
    top = [n for n in tree.body if not isinstance(n, ast.FunctionDef | ast.ClassDef)]
    return [*functions, ast.Module(body=top, type_ignores=[])]


def _sql_problems(source: str) -> list[str]:
    tree = ast.parse(source)
    problems = []
    for scope in _scopes(tree):
        assigned = _assignments(scope)
        for node, how in _sql_strings(scope):
            where = f"line {node.lineno}: {ast.unparse(node)[:80]}"
            if how != "f-string":
                problems.append(f"{where}: SQL built with {how}")
                continue
            for value in node.values:
                if isinstance(value, ast.FormattedValue) and not _is_identifier(
                    value.value, assigned
                ):
                    problems.append(f"{where}: {ast.unparse(value.value)} is put into SQL text")
    return sorted(set(problems))


def test_raw_sql_in_the_package_takes_values_as_parameters_only():
    checked = 0
    for path in sorted(PACKAGE.rglob("*.py")):
        if "migrations" in path.parts:
            continue
        source = path.read_text()
        problems = _sql_problems(source)
        assert not problems, f"{path.relative_to(PACKAGE.parent)}: {problems}"
        checked += bool(re.search(r"\.execute\(|\.raw\(|\.extra\(|RawSQL\(", source))
    assert checked >= 1  # the database module


#: What raw SQL looks like from Python; only the database layer's modules may hold it.
RAW_SQL = re.compile(r"\.execute\(|\.executemany\(|\.raw\(|\.extra\(|RawSQL\(|\.cursor\(")
#: The database layer: the connection, the hot cursors and the statements.
SQL_MODULES = [
    PACKAGE / "store" / name
    for name in (
        "db.py",
        "cursors.py",
        "appends.py",
        "claims.py",
        "statements.py",
        "slots.py",
        "wake_checks.py",
        "distribution.py",
        "choices.py",
    )
]


def test_no_raw_sql_outside_the_database_module():
    """Every raw statement is in the database layer, kumiko_workflows/store (migrations aside)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "migrations" in path.parts or path in SQL_MODULES:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if RAW_SQL.search(line) and not line.lstrip().startswith("#"):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{number}: {line.strip()}")
    assert found == []
    # The check sees what it looks for, in each of them.
    for path in SQL_MODULES:
        assert RAW_SQL.search(path.read_text()), path


@pytest.mark.parametrize(
    "bad",
    [
        "cursor.execute(f\"SELECT * FROM t WHERE tenant_id = '{tenant}'\")",
        'cursor.execute("SELECT * FROM t WHERE id = %s" % run_id)',
        'cursor.execute("DELETE FROM t WHERE id = {}".format(pk))',
        'table = quote_name(x)\nsql = f"SELECT * FROM {table} WHERE k = {key}"',
        'name = request.GET["t"]\ncursor.execute(f"LOCK TABLE {name}")',
        'where = f"id = {pk}" if pk else "1 = 1"\nsql = f"SELECT * FROM t WHERE {where}"',
        'cols = ", ".join(request.GET)\nsql = f"SELECT {cols} FROM t"',
    ],
)
def test_the_raw_sql_check_catches_values_in_sql_text(bad):
    assert _sql_problems(bad)


@pytest.mark.parametrize(
    "good",
    [
        'cursor.execute("SELECT * FROM t WHERE id = %s", [pk])',
        'table = connection.ops.quote_name(M._meta.db_table)\ncursor.execute(f"DELETE FROM {table}'
        ' WHERE id = %s", [pk])',
    ],
)
def test_the_raw_sql_check_allows_identifiers_and_parameters(good):
    assert not _sql_problems(good)


# --- resuming is not reachable over HTTP ----------------------------------------------


def _patterns(resolvers, prefix=""):
    for entry in resolvers:
        if isinstance(entry, URLResolver):
            yield from _patterns(entry.url_patterns, prefix + str(entry.pattern))
        elif isinstance(entry, URLPattern):
            yield prefix + str(entry.pattern), entry


def test_no_view_of_the_app_resumes_runs_only_the_admin_with_permissions():
    views = []
    for route, pattern in _patterns(get_resolver().url_patterns):
        callback = pattern.callback
        module = getattr(callback, "__module__", "")
        model_admin = getattr(callback, "model_admin", None)
        if module.startswith("kumiko_workflows") or (
            model_admin is not None and model_admin.__module__.startswith("kumiko_workflows")
        ):
            views.append((route, model_admin))
    # Every view the app serves is an admin view of one of its models...
    assert views and all(admin is not None for _, admin in views), views
    assert {admin.model for _, admin in views} == set(MODELS.values())
    # ...and the admin never resumes a run itself: its actions only append a
    # request (wake, retry, cancel) that a worker acts on.
    admin_source = "\n".join(path.read_text() for path in (PACKAGE / "admin").glob("*.py"))
    for name in ("resume_due_runs", "resume_row", "run_segment", "Worker"):
        assert not re.search(rf"\b{name}\b", admin_source), name
    for _, admin in views:
        for action in getattr(admin, "actions", None) or ():
            function = getattr(admin, action) if isinstance(action, str) else action
            assert getattr(function, "allowed_permissions", None), function


def test_a_superuser_hitting_every_url_does_not_resume_a_due_run(admin_client, past):
    due = run_id_for("t-wait", trigger("t.wait", **{"for": past}).payload["run_key"])
    world = _world("default")
    for route, _pattern in _patterns(get_resolver().url_patterns):
        if "<" in route or "(?P" in route:
            continue
        url = "/" + route.lstrip("^").rstrip("$")
        admin_client.get(url)
        admin_client.post(url, {"action": "wake_now", "_selected_action": [str(due)]})
    for url in _admin_urls(world):
        admin_client.get(url)
        admin_client.post(url, {"post": "yes"})
    admin_client.post(reverse(RUNS), {"action": "wake_now", "_selected_action": [str(due)]})

    assert et.RESUMED not in types_of(due)
    assert WorkflowRunPending.objects.filter(run_id=due).exists()
    assert resume_due_runs().completed >= 1  # the worker still can
    assert types_of(due)[-1] == et.RUN_COMPLETED
