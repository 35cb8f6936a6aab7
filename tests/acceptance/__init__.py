"""Tests as a user meets the package.

The browser, the example project, the docs, the packaging, the bench.
"""
