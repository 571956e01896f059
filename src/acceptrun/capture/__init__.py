"""What is captured before the first step: provenance, the data manifest, preflight checks."""
