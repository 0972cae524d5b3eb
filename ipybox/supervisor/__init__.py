"""`ipybox up`: the supervisor that runs a workspace, its state files, and the client that reaches it."""

from ipybox.running.control_client import ControlClient
from ipybox.running.state import AlreadyRunningError, NotRunningError, SupervisorState, read_state
from ipybox.supervisor.supervisor import Supervisor

__all__ = [
    "AlreadyRunningError",
    "ControlClient",
    "NotRunningError",
    "Supervisor",
    "SupervisorState",
    "read_state",
]
