"""pgcoord: a client for pgcoord-agent (see proto/PROTOCOL.md).

    from pgcoord import Client
    with Client("/run/pgcoord/agent.sock") as c:
        c.session_open("scheduler")
        with c.permit("job-7", {"tenant-42": 1}) as p:
            ...
        with c.lease("reconciler") as lead:
            while lead.valid:
                ...
"""

from .aio import AsyncClient, AsyncLead
from .belief import mono_ms
from .client import DEFAULT_SOCKET, Client, Lead
from .errors import *  # noqa: F401,F403
from .errors import CODES, PgcoordError, error_from_wire
from .types import *  # noqa: F401,F403

__all__ = ["Client", "AsyncClient", "Lead", "AsyncLead", "DEFAULT_SOCKET", "PgcoordError",
           "CODES", "error_from_wire", "mono_ms"]
