"""Where deployctl keeps its own local state: history, local locks, nightly logs (XDG)."""

from __future__ import annotations

import os
from pathlib import Path


def state_home() -> Path:
    """``$XDG_STATE_HOME/deployctl``, by default ``~/.local/state/deployctl`` (XDG Base Directory)."""
    base = os.environ.get("XDG_STATE_HOME") or ""
    # The spec says a relative $XDG_STATE_HOME is invalid and must be ignored.
    root = Path(base) if base.startswith("/") else Path.home() / ".local" / "state"
    return root / "deployctl"
