"""The drafter store on the host: fix-keys' whole host side as one command (``fixer.pyz store``).

The user's checkpoint directory is never modified. It is fingerprinted; a store entry
``<store>/<fingerprint[:32]>/`` whose ready marker holds that fingerprint is reused (and touched:
the store is pruned least recently used first). Otherwise the checkpoint is copied with
``cp -RL --reflink=auto`` (free on XFS/btrfs; -L: a symlinked shard becomes a file, so converting
the copy can never write through a link into the user's checkpoint) into ``.staging-<fp>``,
fingerprinted again (a training job still writing the checkpoint would tear the copy), converted
and verified there, marked ready and renamed into place, so a drafter that is serving is never
touched and the last good deployment can always be relaunched with its own bytes. Then the store
keeps the ``--keep`` most recently used drafters plus the last good one.

The installed SGLang's version (what the loader simulation verifies against) is read from its
package metadata under the run's ``--sglang-python``, in this same process: ``import sglang``
costs ~2.6 s and ~320 MiB on a real 0.5.23 install, its dist-info ~0.06 s and ~15 MiB.

Prints one JSON summary (see ``store_drafter``); errors are ``{"status": "error", "code", "error"}``.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import time
from typing import Any, Dict, Optional

from .checkpoint import fingerprint
from .conversion import convert
from .errors import EXIT_CHECKPOINT, EXIT_IO, EXIT_OK, EXIT_VERIFY, FixError

READY_MARKER = ".deployctl-ready"
STAGING_PREFIX = ".staging-"
#: a staging dir older than this is a conversion that died midway (a live one is minutes old and
#: belongs to the run holding the host lock)
STALE_STAGING_S = 3600
#: the store summary's exit code when the SGLang version could not be read (nothing was copied)
EXIT_NO_SGLANG_VERSION = 1
VERSION_PROGRAM = "import sys, importlib.metadata as m; sys.stdout.write(m.version('sglang'))"
VERSION_TIMEOUT_S = 60
WHEN = ("always", "changed")


def store_entry(store: str, digest: str) -> str:
    return os.path.join(store, digest[:32])


def staging_entry(store: str, digest: str) -> str:
    return os.path.join(store, STAGING_PREFIX + digest[:32])


def read_sglang_version(python: str) -> Dict[str, Any]:
    """Run the metadata read under ``python``; its raw result, judged by deployctl (facts/fixer.py)."""
    try:
        proc = subprocess.run([python, "-c", VERSION_PROGRAM], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, timeout=VERSION_TIMEOUT_S)
    except FileNotFoundError as exc:
        return {"exit_code": 127, "stdout": "", "stderr": "%s: %s" % (python, exc.strerror)}
    except (OSError, subprocess.SubprocessError) as exc:
        return {"exit_code": None, "stdout": "", "stderr": "%s: %s" % (python, exc)}
    return {"exit_code": proc.returncode, "stdout": proc.stdout.decode("utf-8", "replace")[:200],
            "stderr": proc.stderr.decode("utf-8", "replace")[-2000:]}


def _version_text(read: Dict[str, Any]) -> Optional[str]:
    text = read["stdout"].strip()
    parts = text.split(".")
    if read["exit_code"] == 0 and len(parts) >= 3 and all(p.isdigit() for p in parts[:2]):
        return text
    return None


def _read_marker(entry: str) -> str:
    try:
        with open(os.path.join(entry, READY_MARKER)) as handle:
            return handle.read(200).strip()
    except (OSError, UnicodeDecodeError):
        return ""


def copy_checkpoint(source: str, staging: str) -> None:
    """``cp -RL --preserve=timestamps --reflink=auto SRC/. STAGING/``; a failed copy leaves nothing."""
    os.mkdir(staging, 0o700)
    proc = subprocess.run(["cp", "-RL", "--preserve=timestamps", "--reflink=auto", "--",
                           os.path.join(source, "."), staging + "/"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if proc.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        detail = proc.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or ["cp exited %d" % proc.returncode]
        raise FixError(EXIT_IO, "cannot copy %s into the drafter store: %s" % (source, detail[0][:300]))


def prune_drafters(store: str, keep: int, last_good: str) -> Dict[str, Any]:
    """Keep the ``keep`` most recently used drafters of the store and the last good one."""
    protected = ""
    try:
        with open(last_good) as handle:
            record = json.loads(handle.read(1 << 20))
        if isinstance(record, dict):
            protected = os.path.basename(str(record.get("drafter_path") or "").rstrip("/"))
    except (OSError, ValueError):
        pass
    try:
        names = os.listdir(store)
    except OSError as exc:
        return {"kept": [], "removed": [], "protected": protected or None, "error": str(exc)}
    entries, removed = [], []
    now = time.time()
    for name in names:
        path = os.path.join(store, name)
        try:
            mtime = os.lstat(path).st_mtime
        except OSError:
            continue
        if name.startswith(STAGING_PREFIX):
            if now - mtime > STALE_STAGING_S:
                shutil.rmtree(path, ignore_errors=True)
                removed.append(name)
            continue
        entries.append((mtime, name))
    entries.sort(reverse=True)
    kept = [name for _, name in entries[:keep]]
    for _, name in entries[keep:]:
        if name == protected:
            kept.append(name)
            continue
        shutil.rmtree(os.path.join(store, name), ignore_errors=True)
        removed.append(name)
    return {"kept": kept, "removed": sorted(removed), "protected": protected or None, "error": None}


def _summary(status: str, code: int, drafter: str, digest: str, entry: str, stored_before: bool,
             version: Optional[str], version_read: Optional[Dict[str, Any]],
             conversion: Optional[Dict[str, Any]], pruned: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    conversion = conversion or {}
    return {
        "status": status, "exit_code": code, "drafter": drafter, "fingerprint": digest, "store": entry,
        "stored_before": stored_before, "sglang_version": version, "sglang_version_read": version_read,
        "renamed": len(conversion.get("renames") or []), "files": conversion.get("files") or [],
        "config": conversion.get("config"), "verification": conversion.get("verification"),
        "pruned": pruned,
    }


def store_drafter(drafter: str, store: str, *, keep: int, last_good: str, when: str = "always",
                  hidden_states_from: str = "keep", generation: Optional[str] = None,
                  sglang_python: Optional[str] = None) -> Dict[str, Any]:
    """Fingerprint, reuse or copy + convert + verify + publish, prune; returns the JSON summary.

    ``status``: "unchanged" (``when=changed`` and the store has it: nothing converted or read),
    "already_converted" (the store had it; re-verified), "converted" (copied, converted, published),
    "verify_failed" (exit 8: SGLang would not load it fully; a new copy is not published),
    "no_sglang_version" (exit 1: ``sglang_version_read`` holds the failed read; nothing copied).
    ``generation``: a version or legacy/modern; None reads the version under ``sglang_python``.
    """
    if when not in WHEN:
        raise ValueError("when must be one of %s" % (WHEN,))
    drafter = os.path.abspath(drafter)
    digest = fingerprint(drafter)
    entry = store_entry(store, digest)
    stored = _read_marker(entry) == digest
    if stored:
        try:
            os.utime(entry, None)  # most recently used: the last to be pruned
        except OSError:
            pass
    if stored and when == "changed":
        return _summary("unchanged", EXIT_OK, drafter, digest, entry, True, None, None, None, None)
    version = version_read = None
    if generation is None:
        version_read = read_sglang_version(sglang_python or "python3")
        version = _version_text(version_read)
        if version is None:
            return _summary("no_sglang_version", EXIT_NO_SGLANG_VERSION, drafter, digest, entry, stored, None,
                            version_read, None, None)
    elif generation not in ("legacy", "modern"):
        version = generation
    target = version if version is not None else (generation or "legacy")
    if stored:  # the fixer is idempotent: "already converted", nothing written
        conversion = convert(entry, hidden_states_from=hidden_states_from, generation=target)
        status = "verify_failed" if conversion["exit_code"] == EXIT_VERIFY else conversion["status"]
        return _summary(status, conversion["exit_code"], drafter, digest, entry, True, version, version_read,
                        conversion, None)
    try:
        os.makedirs(store, 0o700, exist_ok=True)
    except OSError as exc:
        raise FixError(EXIT_IO, "cannot create the drafter store %s: %s" % (store, exc.strerror or exc))
    staging = staging_entry(store, digest)
    shutil.rmtree(staging, ignore_errors=True)
    copy_checkpoint(drafter, staging)
    try:
        if fingerprint(drafter) != digest:
            raise FixError(EXIT_CHECKPOINT, "%s changed while it was being copied into the drafter store (is it "
                           "still being written?); nothing was deployed, try again" % drafter)
        conversion = convert(staging, hidden_states_from=hidden_states_from, generation=target)
        if conversion["exit_code"] != EXIT_OK:
            shutil.rmtree(staging, ignore_errors=True)
            status = "verify_failed" if conversion["exit_code"] == EXIT_VERIFY else conversion["status"]
            return _summary(status, conversion["exit_code"], drafter, digest, entry, False, version, version_read,
                            conversion, None)
        with open(os.path.join(staging, READY_MARKER), "w") as handle:
            handle.write(digest + "\n")
        shutil.rmtree(entry, ignore_errors=True)
        os.rename(staging, entry)
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        why = "no space left on device" if exc.errno == errno.ENOSPC else (exc.strerror or str(exc))
        raise FixError(EXIT_IO, "cannot publish %s in the drafter store %s: %s" % (drafter, store, why))
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    # only a new drafter can push an old one out of the store
    pruned = prune_drafters(store, keep, last_good)
    return _summary(conversion["status"], EXIT_OK, drafter, digest, entry, False, version, version_read,
                    conversion, pruned)

