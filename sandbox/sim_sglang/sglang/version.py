"""SIMULATED sglang.version (deployctl sandbox TEST DOUBLE): the version comes from the sim config.

The sandbox writes ``~/.sim/config.json`` with ``sglang_version``; ``$SGLANG_SIM_CONFIG`` points at
it. Without a config the stand-in reports 0.5.11.
"""

import json
import os

DEFAULT_VERSION = "0.5.11"


def _configured_version() -> str:
    path = os.environ.get("SGLANG_SIM_CONFIG") or os.path.expanduser("~/.sim/config.json")
    try:
        with open(path) as f:
            return str(json.load(f).get("sglang_version") or DEFAULT_VERSION)
    except (OSError, ValueError):
        return DEFAULT_VERSION


__version__ = _configured_version()
