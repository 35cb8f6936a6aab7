"""Settings for the test suite: SQLite by default, PostgreSQL via DATABASE_URL.

Subprocesses started by tests (workers, racing appenders) use these settings
too, with ``KUMIKO_TEST_DB_NAME`` pointing them at the test database.
"""

import os
from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent
OUTPUT_DIR = Path(os.environ.get("KUMIKO_TEST_OUTPUT", BASE_DIR / "test-output"))
OUTPUT_DIR.mkdir(parents=True, exist_ok=True)

env = environ.Env()
SECRET_KEY = "tests-only"
DEBUG = False
ALLOWED_HOSTS = ["localhost", "127.0.0.1", "testserver"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "kumiko_workflows",
    "example_project.orders",
    "tests.testapp",
    # The benchmark (not shipped): tests/acceptance/test_bench.py runs its scenarios.
    "kumiko_bench",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "example_project.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]
STATIC_URL = "static/"

DATABASES = {
    "default": env.db("DATABASE_URL", default=f"sqlite:///{OUTPUT_DIR / 'tests.sqlite3'}"),
}
_default = DATABASES["default"]
if _default["ENGINE"] == "django.db.backends.sqlite3":
    _default.setdefault("OPTIONS", {})["timeout"] = 30
    # A file, not memory, so that subprocesses can open the test database.
    _default["TEST"] = {"NAME": str(OUTPUT_DIR / f"test-{os.getpid()}.sqlite3")}
if os.environ.get("KUMIKO_TEST_DB_NAME"):
    _default["NAME"] = os.environ["KUMIKO_TEST_DB_NAME"]

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

KUMIKO_WORKFLOWS: dict[str, object] = {
    "DEFAULT_TENANT": "default",
}
# Worker processes a race test starts with each batch's rows claimed when their
# turn comes (tests/multiprocess/test_worker.py).
if os.environ.get("KUMIKO_TEST_BATCH_TOGETHER") == "0":
    KUMIKO_WORKFLOWS["BATCH_TOGETHER"] = False

# Django's Tasks framework on this app (tests/integration/test_tasks.py); the backport on
# Django 5.2.
TASKS = {
    "default": {
        "BACKEND": "kumiko_workflows.tasks.WorkflowTaskBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {"MAX_ATTEMPTS": 1, "BASE_DELAY": 10},
    },
}
