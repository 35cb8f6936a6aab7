"""A site whose workflow tables live on a second database alias, ``workflows``.

Used by ``tests/test_database_alias.py`` in subprocesses: ``default`` holds
only the site's own tables (auth, sessions, the example app);
``KUMIKO_TEST_ALIAS_DEFAULT`` and ``KUMIKO_TEST_ALIAS_WORKFLOWS`` name the two
PostgreSQL databases.
"""

import os

from tests.settings import *  # noqa: F403

_server = env.db("DATABASE_URL")  # noqa: F405 - PostgreSQL only
DATABASES = {
    "default": {**_server, "NAME": os.environ["KUMIKO_TEST_ALIAS_DEFAULT"]},
    "workflows": {**_server, "NAME": os.environ["KUMIKO_TEST_ALIAS_WORKFLOWS"]},
}
DATABASE_ROUTERS = ["kumiko_workflows.routers.WorkflowsRouter"]
KUMIKO_WORKFLOWS = {**KUMIKO_WORKFLOWS, "DATABASE": "workflows"}  # noqa: F405
