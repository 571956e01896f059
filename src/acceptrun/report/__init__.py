"""Reports of a run: the terminal view (``acceptrun show``, :mod:`~acceptrun.report.terminal`),
the HTML (:mod:`~acceptrun.report.html`) and Markdown report, from :mod:`~acceptrun.report.data`.

Each is imported from its module where it is used, so that registering the report
commands (``acceptrun.cli.report``) keeps ``acceptrun --help`` fast.
"""
