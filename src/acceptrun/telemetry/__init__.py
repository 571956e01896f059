"""Telemetry: host and GPU samples, workload timings, summaries, hints, live view, exports.

The supervisor samples the machine into ``telemetry.jsonl``; the client API writes step
timings into ``events.jsonl``; :mod:`acceptrun.telemetry.summary` reads both back into a
time breakdown, percentiles and hints for ``show``, the report and the verdict.
"""
