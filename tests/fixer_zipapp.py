"""The key fixer as the hosts get it: ``fixer.pyz``, built by the product's own helper_payloads()."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from deploy.facts.helpers import helper_payloads


def fixer_zipapp() -> Path:
    """Write the zipapp once per content (named by its sha256) and return its path."""
    data = helper_payloads()["fixer.pyz"]
    path = Path(tempfile.gettempdir()) / f"deployctl-test-fixer-{os.getuid()}-{hashlib.sha256(data).hexdigest()[:16]}.pyz"
    if not path.exists() or path.read_bytes() != data:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    return path
