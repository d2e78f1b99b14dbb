"""What a hostile-input case checks besides the exit code: no file it could touch has changed.

``tree_state`` records every entry under a directory (regular files by sha256, links by their text,
FIFOs and directories by kind), hidden files and new files included, without following links and
without opening FIFOs; large sparse files are hashed too (they are the size-limit cases).
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def tree_state(root: Path) -> dict[str, str]:
    state: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in sorted(dirnames + filenames):
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                state[rel] = "link:" + os.readlink(path)
            elif stat.S_ISREG(st.st_mode):
                state[rel] = f"file:{st.st_size}:{oct(stat.S_IMODE(st.st_mode))}:" + _sha256(path)
            elif stat.S_ISDIR(st.st_mode):
                state[rel] = "dir"
            else:
                state[rel] = f"other:{stat.S_IFMT(st.st_mode)}"
    return state


def assert_clean_failure(code: int, expected: int, out: str, err: str, fragments, before, after) -> None:
    text = out + err
    assert "Traceback" not in text, text
    assert code == expected, f"exit {code}, expected {expected}: {text[-2000:]}"
    for fragment in fragments:
        assert fragment in text, f"{fragment!r} not in: {text[-2000:]}"
    changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
    assert not changed, f"files changed: {sorted(changed)}"
