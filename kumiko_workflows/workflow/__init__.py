"""The workflow model: definitions, durations, matching, suspension records.

Pure Python: nothing here touches the database. The step kinds
(:mod:`kumiko_workflows.steps`) and the run event names
(:mod:`kumiko_workflows.event_types`) belong to this layer too; they sit at
the package's top because users import them.
"""
