"""Notifications: who is told, how fast, with what evidence (docs/notify.md).

``conditions`` (which recorded events are worth a message, and its words), ``targets``
(webhook, Slack, e-mail, a command), ``notifier`` (follow a run's events.jsonl, deliver in
the background, record every delivery), ``secrets`` (the spec's secret values kept apart
from the record), ``watch`` (``acceptrun watch``: a gone supervisor, told by a process
that outlives it).
"""
