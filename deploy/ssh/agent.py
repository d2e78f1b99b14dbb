"""The local ssh-agent, reached with a timeout.

paramiko's ``Agent()`` reads the agent's answer with no timeout: an agent that never answers (a
stuck forwarded socket, a stopped process) hung deployctl forever before the first connection.
"""

from __future__ import annotations

import os
import socket

from deploy.base.errors import ConnectionFailed


#: seconds an ssh-agent gets to answer one request: a local agent answers in milliseconds; one
#: that never answers (a stuck forwarding, a stopped process) hung deployctl forever (issue 22)
AGENT_TIMEOUT_S = 5.0
_agent_checked: dict[str, bool] = {}


def timed_agent():
    """paramiko's Agent over a socket with a timeout (its own has none). Raises ConnectionFailed."""
    import paramiko
    from paramiko.agent import AgentSSH

    path = os.environ["SSH_AUTH_SOCK"]
    agent = AgentSSH()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(AGENT_TIMEOUT_S)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        return agent  # a dangling SSH_AUTH_SOCK: no agent, as paramiko and OpenSSH treat it
    try:
        agent._connect(sock)  # noqa: SLF001 - paramiko's own Agent() does exactly this, without the timeout
    except (OSError, paramiko.SSHException) as exc:
        sock.close()
        raise ConnectionFailed(f"the ssh-agent at SSH_AUTH_SOCK={path} did not answer the key listing within "
                               f"{AGENT_TIMEOUT_S:.0f} s ({exc or type(exc).__name__}); restart it, or unset "
                               "SSH_AUTH_SOCK to connect without it") from None
    return agent


def check_agent_answers() -> None:
    """Before paramiko lists the agent's keys itself (allow_agent, no timeout): it answers, or a clear
    ConnectionFailed (exit 4). Once per process and socket."""
    path = os.environ.get("SSH_AUTH_SOCK")
    if not path or _agent_checked.get(path):
        return
    timed_agent()._close()  # noqa: SLF001
    _agent_checked[path] = True
