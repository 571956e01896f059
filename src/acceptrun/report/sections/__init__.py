"""A run kind's own section of the report: batch inference, serving (read from their facts)."""
