"""``python3 -m deploy.remote.fixer ARGS``: the host-side command line, ``store`` included, like the
zipapp's own entry (deploy/facts/helpers.py: ``python3 fixer.pyz ARGS``)."""

from __future__ import annotations

import sys

from .cli import main

sys.exit(main(host_verbs=True))
