"""The key fixer as the hosts get it: ``fixer.pyz``, built by the product's own helper_payloads()."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from deploy.facts.helpers import helper_payloads


def fixer_zipapp() -> Path:
    """Write the zipapp once per content (named by its sha256) in a folder of its own, where it keeps
    its compiled code as on a host (helpers/__pycache__), and return its path."""
    data = helper_payloads()["fixer.pyz"]
    folder = Path(tempfile.gettempdir()) / f"deployctl-test-fixer-{os.getuid()}-{hashlib.sha256(data).hexdigest()[:16]}"
    path = folder / "fixer.pyz"
    if not path.exists() or path.read_bytes() != data:
        folder.mkdir(mode=0o700, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
        # compiled once here, not inside the first test that runs it (the fault tests count its writes)
        subprocess.run([sys.executable, "-I", "-S", str(path), "--help"], capture_output=True, timeout=120)
    return path
