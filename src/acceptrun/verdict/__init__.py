"""The verdict: every check of a run against its spec, portability and run-to-run diffs."""
