"""``workflow_settings``: read once, and again whenever ``KUMIKO_WORKFLOWS`` changes."""

import pytest
from django.test import override_settings

from kumiko_workflows.conf import DEFAULTS, workflow_settings


def test_a_changed_setting_is_read_again_and_the_old_value_comes_back_after_it():
    before = workflow_settings.BATCH_SIZE

    with override_settings(KUMIKO_WORKFLOWS={"BATCH_SIZE": before + 7}):
        assert workflow_settings.BATCH_SIZE == before + 7
        # A setting the site leaves out keeps its default.
        assert workflow_settings.BATCH_SECONDS == DEFAULTS["BATCH_SECONDS"]

    assert workflow_settings.BATCH_SIZE == before


def test_the_settings_fixture_is_seen_at_each_assignment(settings):
    settings.KUMIKO_WORKFLOWS = {"MAX_PAYLOAD_BYTES": 1234}
    assert workflow_settings.MAX_PAYLOAD_BYTES == 1234

    settings.KUMIKO_WORKFLOWS = {"MAX_PAYLOAD_BYTES": 4321}
    assert workflow_settings.MAX_PAYLOAD_BYTES == 4321

    settings.KUMIKO_WORKFLOWS = {}
    assert workflow_settings.MAX_PAYLOAD_BYTES == DEFAULTS["MAX_PAYLOAD_BYTES"]


def test_another_setting_changing_keeps_the_values_read():
    read = workflow_settings.BATCH_SIZE

    with override_settings(USE_TZ=True):
        assert workflow_settings.BATCH_SIZE == read


def test_a_name_that_is_no_setting_is_refused_by_name():
    with pytest.raises(AttributeError, match="KUMIKO_WORKFLOWS has no setting 'BATCH_SIZES'"):
        workflow_settings.BATCH_SIZES  # noqa: B018 - the lookup is the test


def test_a_key_the_site_made_up_is_no_setting_either():
    with (
        override_settings(KUMIKO_WORKFLOWS={"NOT_A_SETTING": 1}),
        pytest.raises(AttributeError, match="no setting 'NOT_A_SETTING'"),
    ):
        workflow_settings.NOT_A_SETTING  # noqa: B018 - the lookup is the test
