"""Running a spec: launch, close, lifecycle (stop/resume), retention, reproduce, drills."""
