"""The run record: the workspace, one directory per run, and the list of workspaces."""
