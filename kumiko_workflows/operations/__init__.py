"""Operating the engine: explanations for people, projection rebuilds, progress lines.

Used by the admin (:mod:`kumiko_workflows.admin`) and the management
commands; the engine never imports these.
"""
