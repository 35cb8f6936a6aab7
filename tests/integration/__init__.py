"""Tests through the public API against a real database.

SQLite, or PostgreSQL with ``DATABASE_URL``.
"""
