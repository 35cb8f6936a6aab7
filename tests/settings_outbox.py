"""``tests.settings_alias`` with an outbox on the site's database (``OUTBOX_DATABASES``).

Used by ``tests/test_outbox.py`` in subprocesses: an append inside a
transaction on ``default`` goes to its outbox, relayed to ``workflows``.
"""

from tests.settings_alias import *  # noqa: F403

KUMIKO_WORKFLOWS = {**KUMIKO_WORKFLOWS, "OUTBOX_DATABASES": ["default"]}  # noqa: F405
