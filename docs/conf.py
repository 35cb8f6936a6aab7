"""Sphinx configuration of the documentation site: MyST Markdown pages, autodoc.

Build it with ``sphinx-build -E -W --keep-going -b html docs docs/_build/html``
(``.ci/run`` does: every page read afresh, warnings as errors). Autodoc imports the package, so
Django is set up here with the fewest settings that let its modules import;
the build touches no database.
"""

from __future__ import annotations

import sys
from pathlib import Path

import django
from django.conf import settings

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE / "_ext")]

if not settings.configured:
    settings.configure(
        INSTALLED_APPS=[
            "django.contrib.auth",
            "django.contrib.contenttypes",
            "kumiko_workflows",
        ],
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
        USE_TZ=True,
    )
    django.setup()

from kumiko_workflows import __version__  # noqa: E402 - after Django is set up

project = "kumiko_workflows"
author = "The kumiko_workflows authors"
copyright = "the kumiko_workflows authors"
release = __version__
version = __version__

extensions = ["myst_parser", "sphinx.ext.autodoc", "fences"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
# A link to a heading (page.md#a-heading) is checked like a link to a page.
myst_heading_anchors = 3
# Links between pages and to headings are checked (a broken one is a warning,
# so an error). Python cross-references inside docstrings are not
# (nitpicky off): without intersphinx, which needs the network, every
# standard-library type in a signature would be one.
autodoc_member_order = "bysource"
autodoc_typehints = "description"
html_theme = "alabaster"
html_title = "kumiko_workflows"
highlight_language = "none"  # a fence without a language is plain text (command output)
