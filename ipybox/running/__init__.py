"""The contract of a running workspace: its state file, the typed status and control protocol, and
attaching an application to it."""
