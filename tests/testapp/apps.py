import os

from django.apps import AppConfig


class TestAppConfig(AppConfig):
    name = "tests.testapp"
    label = "testapp"

    def ready(self) -> None:
        # Worker subprocesses of tests/multiprocess/test_signal_delivery.py record run_completed.
        if os.environ.get("KUMIKO_TEST_SIGNAL_LOG"):
            from tests.testapp.signal_log import connect

            connect(
                os.environ["KUMIKO_TEST_SIGNAL_LOG"],
                float(os.environ.get("KUMIKO_TEST_SIGNAL_DELAY", "0")),
            )
