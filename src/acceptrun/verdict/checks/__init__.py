"""The verdict's check functions, one module per group of :data:`acceptrun.verdict.core.GROUPS`.

Each function takes the :class:`~acceptrun.verdict.core.CheckInput` of a run and returns
its checks (none when the check does not apply); ``registered_checks()`` in
:mod:`acceptrun.verdict.decide` lists them in order. See docs/architecture.md, "How to add a
verdict check".
"""
