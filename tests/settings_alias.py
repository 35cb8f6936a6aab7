"""A site whose workflow tables live on a second database alias, ``workflows``.

Used by ``tests/multiprocess/test_database_alias.py`` in subprocesses: ``default`` holds
only the site's own tables (auth, sessions, the example app);
``KUMIKO_TEST_ALIAS_DEFAULT`` and ``KUMIKO_TEST_ALIAS_WORKFLOWS`` name the two
databases (on SQLite, two files).
"""

import os

from tests.settings import *  # noqa: F403

# PostgreSQL: two databases on its server; SQLite: two files (the NAMEs are paths).
_server = env.db("DATABASE_URL", default="sqlite:///unused")  # noqa: F405
DATABASES = {
    "default": {**_server, "NAME": os.environ["KUMIKO_TEST_ALIAS_DEFAULT"]},
    "workflows": {**_server, "NAME": os.environ["KUMIKO_TEST_ALIAS_WORKFLOWS"]},
}
DATABASE_ROUTERS = ["kumiko_workflows.routers.WorkflowsRouter"]
KUMIKO_WORKFLOWS = {**KUMIKO_WORKFLOWS, "DATABASE": "workflows"}  # noqa: F405
