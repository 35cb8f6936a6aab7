"""Running workflows: segments of steps, the resume loop, the worker, cron, wake-ups.

:mod:`.segment` runs a run's steps (the inline start and each resumed
segment); :mod:`.resume` claims due rows and resumes them (and acts on one
run: cancel, wake, rerun); :mod:`.worker` loops over passes; :mod:`.cron`
fires schedules; :mod:`.wakeups` wakes runs an awaited event ends.
"""
