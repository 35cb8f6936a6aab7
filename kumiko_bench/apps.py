"""App configuration of the benchmark: it brings only its management command."""

from django.apps import AppConfig


class KumikoBenchConfig(AppConfig):
    name = "kumiko_bench"
    verbose_name = "Workflows benchmark"
