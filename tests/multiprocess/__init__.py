"""Tests with real processes: workers, proxies, reloads, races against PostgreSQL."""
