"""The README's Python runs: every ```python block, in order, against the test database.

The blocks share one namespace, as a reader following the README top to
bottom would (the run the "From Python" block acts on is the order placed
in "Write a workflow"). The site's own workflows are hidden meanwhile, so
the README's definitions stand alone. A block that cannot run on its own (a
line of settings.py) says why in a ``<!-- not-run: reason -->`` comment
right above it; there are few.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest

from kumiko_workflows import event_types as et
from kumiko_workflows import load_stream, run_id_for
from kumiko_workflows.conf import DEFAULTS
from kumiko_workflows.models import WorkflowRun
from kumiko_workflows.workflow.definition import registry
from tests.conftest import REPO

README = REPO / "README.md"
NOT_RUN = re.compile(r"^<!-- not-run: (?P<reason>.*\S) -->$")
#: Blocks the README may leave unrun; each costs a reader's trust.
MOST_NOT_RUN = 3


@dataclass
class Block:
    line: int  # the README line of the block's first line of code
    code: str
    not_run: str | None  # why it is not run, or None


def python_blocks(text: str) -> list[Block]:
    lines = text.splitlines()
    blocks: list[Block] = []
    index = 0
    while index < len(lines):
        if lines[index].strip() != "```python":
            index += 1
            continue
        before = index - 1
        while before >= 0 and not lines[before].strip():
            before -= 1
        marker = NOT_RUN.match(lines[before].strip()) if before >= 0 else None
        end = lines.index("```", index + 1)
        blocks.append(
            Block(index + 2, "\n".join(lines[index + 1 : end]), marker and marker["reason"])
        )
        index = end + 1
    return blocks


BLOCKS = python_blocks(README.read_text())


def test_the_readme_has_python_blocks_and_few_are_not_run():
    assert len(BLOCKS) >= 8
    not_run = [block for block in BLOCKS if block.not_run]
    assert len(not_run) <= MOST_NOT_RUN, [(block.line, block.not_run) for block in not_run]
    for block in BLOCKS:
        compile(block.code, f"README.md:{block.line}", "exec")  # even those not run parse


def test_the_block_finder_sees_markers_and_lines():
    text = "a\n```python\nx = 1\n```\n\n<!-- not-run: settings -->\n\n```python\ny = 2\n```\n"
    assert python_blocks(text) == [Block(3, "x = 1", None), Block(9, "y = 2", "settings")]


@pytest.mark.django_db
def test_every_python_block_of_the_readme_runs_in_order():
    namespace: dict = {"__name__": "readme"}
    site = [workflow.name for workflow in registry.all()]
    with registry.without(*site):
        for block in BLOCKS:
            if block.not_run:
                continue
            # Padded so that a traceback names the README's own line numbers.
            code = compile("\n" * (block.line - 1) + block.code, str(README), "exec")
            exec(code, namespace)  # noqa: S102 - the README's own code

        # What the blocks did, as the README says they do.
        order_run = WorkflowRun.objects.get(
            run_id=run_id_for("order-fulfilment", namespace["order_id"])
        )
        assert order_run.status == "cancelled"
        types = [event.type for event in load_stream(order_run.run_id)]
        assert types[:2] == [et.RUN_STARTED, et.WAITING_FOR_EVENT]
        assert et.RUN_CANCELLED in types
        assert namespace["report"].resumed == 1  # woken by order.paid, then waiting an hour
        assert registry.get("dunning") is namespace["nightly_dunning"]
    assert registry.get("dunning") is None


def test_the_settings_block_shows_every_default():
    (block,) = (block for block in BLOCKS if '"DATABASE": "default",' in block.code)
    namespace: dict = {}
    exec(block.code, namespace)  # noqa: S102 - the README's own code
    assert namespace["KUMIKO_WORKFLOWS"] == DEFAULTS
