"""Settings for running the benchmark: ``manage.py kumiko_bench --settings kumiko_bench.settings``.

``DATABASE_URL`` names the server to measure (PostgreSQL for real figures);
the bench creates a scratch database beside the one it names and drops it at
the end, so that database need not even exist. Without ``DATABASE_URL``, the
scratch database is a temporary SQLite file. ``DEBUG`` is off, as in
production: with it on, Django would keep every query in memory.
"""

import environ

env = environ.Env()

SECRET_KEY = "kumiko-bench-not-a-site"
DEBUG = False
ALLOWED_HOSTS: list[str] = []

INSTALLED_APPS = [
    "kumiko_workflows",
    "kumiko_bench",
]
try:  # the reference database backend of Django's tasks, when installed (extra "bench")
    import django_tasks_db  # noqa: F401
except ImportError:
    pass
else:
    INSTALLED_APPS.append("django_tasks_db")

DATABASES = {
    # On SQLite this file is never opened: the bench works in a temporary one.
    "default": env.db("DATABASE_URL", default="sqlite:///kumiko-bench.sqlite3"),
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Wait for the one writer instead of failing at once with "database is locked".
    DATABASES["default"].setdefault("OPTIONS", {})["timeout"] = 30

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"kumiko_workflows": {"handlers": ["console"], "level": "WARNING"}},
}
