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
# The dashboard scenario asks for admin pages with Django's test client.
ALLOWED_HOSTS: list[str] = ["testserver"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "kumiko_workflows",
    "kumiko_bench",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "kumiko_bench.urls"
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
