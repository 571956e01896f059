"""Drills that prove a run can be recovered: the restore drill and the operations drill."""
