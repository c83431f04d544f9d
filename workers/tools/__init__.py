"""Command-line tools that ship with the agent; each is `python -m workers.tools.<name>`."""
