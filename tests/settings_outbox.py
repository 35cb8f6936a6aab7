"""``tests.settings_alias`` with an outbox on the site's database (``OUTBOX_DATABASES``).

Used by ``tests/multiprocess/test_outbox.py`` in subprocesses: an append inside a
transaction on ``default`` goes to its outbox, relayed to ``workflows``.
"""

import os

from tests.settings_alias import *  # noqa: F403

KUMIKO_WORKFLOWS = {**KUMIKO_WORKFLOWS, "OUTBOX_DATABASES": ["default"]}  # noqa: F405

# A relay that keeps failing (tests/multiprocess/test_outbox.py): a limit lower than the
# callers' was.
if os.environ.get("KUMIKO_TEST_MAX_PAYLOAD_BYTES"):
    KUMIKO_WORKFLOWS["MAX_PAYLOAD_BYTES"] = int(os.environ["KUMIKO_TEST_MAX_PAYLOAD_BYTES"])
