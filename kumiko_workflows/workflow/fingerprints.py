"""The hash a definition's fingerprints are made of: canonical JSON, SHA-256.

A fingerprint is stable across processes and Python versions: a run records
its definition's, and a worker compares it with the one its code declares.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from kumiko_workflows.workflow.step_kind import callable_name


def _unhashable(value: Any) -> dict[str, str]:
    # A static argument JSON cannot hold (validation reports it if it matters)
    # is fingerprinted by its type: stable across processes, unlike repr().
    return {"unserialisable": callable_name(type(value))}


def _hash(value: Any) -> str:
    text = json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=_unhashable
    )
    return hashlib.sha256(text.encode()).hexdigest()
