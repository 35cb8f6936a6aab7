"""The benchmark of kumiko_workflows: ``manage.py kumiko_bench`` and its scenarios.

A Django app of this repository, never shipped in the package (``setup.cfg``
finds only ``kumiko_workflows``). Only ``kumiko_bench.settings`` and the test
settings install it. Every run works in a scratch database it creates and
drops, so the database named in the settings is never written.
"""
