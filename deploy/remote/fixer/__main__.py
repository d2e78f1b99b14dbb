"""``python3 -m deploy.remote.fixer ARGS`` (the zipapp on a host has its own entry, see
deploy/facts/helpers.py: ``python3 fixer.pyz ARGS``)."""

from __future__ import annotations

import sys

from .cli import main

sys.exit(main())
