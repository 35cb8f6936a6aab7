"""Tests of pure code: no database."""
