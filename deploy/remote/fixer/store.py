"""The drafter store on the host: fix-keys' whole host side as one command (``fixer.pyz store``).

The user's checkpoint directory is never modified. It is fingerprinted; a store entry
``<store>/<fingerprint[:32]>/`` whose ready marker holds that fingerprint is reused (and touched:
the store is pruned least recently used first). Otherwise the checkpoint's files are copied into
``.staging-<fp>`` (copy_file_range: free on XFS/btrfs, see ``copy_checkpoint`` for what is copied
and what is not), the checkpoint is fingerprinted again (a training job still writing it would tear
the copy), the copy is converted and verified there, marked ready and renamed into place, so a
drafter that is serving is never touched and the last good deployment can always be relaunched
with its own bytes. Then the store keeps the ``--keep`` most recently used drafters plus the last
good one.

Ownership. The store deletes only what it created (a user once pointed ``state_dir`` at the disk
holding their checkpoints, and pruning deleted two of them). Every entry and staging directory it
makes holds the owner marker ``.deployctl-store-entry`` (JSON naming the fingerprint), written
before anything else goes in; an entry is deployctl's when it is a real directory (not a link)
named by the fingerprint pattern (32 hex digits, or ``.staging-`` and 32 hex digits) whose owner
marker, a regular file, names a fingerprint starting with that name. Entries made by deployctl
before the owner marker existed are recognised by their ready marker ``.deployctl-ready`` holding
the full 64-hex fingerprint that starts with the entry's name (no user directory looks like that);
an old staging directory has neither and is never deleted (it is reported as foreign, like every
other entry the store cannot prove is its own). A store that is, contains or lies inside the
drafter directory is refused (exit 3) before anything is read or written.

The installed SGLang's version (what the loader simulation verifies against) is read from its
package metadata under the run's ``--sglang-python``, in this same process: ``import sglang``
costs ~2.6 s and ~320 MiB on a real 0.5.23 install, its dist-info ~0.06 s and ~15 MiB.

Prints one JSON summary (see ``store_drafter``); errors are ``{"status": "error", "code", "error"}``.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import stat
import subprocess
import time
from typing import Any, Dict, List, Optional, Tuple

from .checkpoint import CONFIG_NAME, INDEX_NAME, _Checkpoint, _read_config, fingerprint
from .conversion import convert
from .errors import EXIT_CHECKPOINT, EXIT_CONFIG, EXIT_IO, EXIT_OK, EXIT_VERIFY, FixError
from .fileio import _close_quiet, _copy_range, _fsync_dir
from .header import _read_bounded, file_kind, open_regular, read_header

READY_MARKER = ".deployctl-ready"
OWNER_MARKER = ".deployctl-store-entry"
OWNER_FORMAT = "deployctl-drafter-store-entry"
STAGING_PREFIX = ".staging-"
ENTRY_NAME = re.compile(r"^[0-9a-f]{32}$")
STAGING_NAME = re.compile(r"^\.staging-([0-9a-f]{32})$")
FINGERPRINT = re.compile(r"^[0-9a-f]{64}$")
#: a staging dir older than this is a conversion that died midway (a live one is minutes old and
#: belongs to the run holding the host lock)
STALE_STAGING_S = 3600
#: the store summary's exit code when the SGLang version could not be read (nothing was copied)
EXIT_NO_SGLANG_VERSION = 1
VERSION_PROGRAM = "import sys, importlib.metadata as m; sys.stdout.write(m.version('sglang'))"
VERSION_TIMEOUT_S = 60
WHEN = ("always", "changed")
#: a drafter is a handful of files; a tree past these is not one (and the walk stays bounded)
MAX_COPY_FILES = 10000
MAX_COPY_DEPTH = 16
MAX_MARKER_BYTES = 4096


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


def _small_file(path: str, limit: int = MAX_MARKER_BYTES) -> Optional[str]:
    """The text of a small regular file that is not a link (a FIFO is never opened), else None."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return None
        return _read_bounded(path, limit, "a drafter store marker").decode("utf-8")
    except (OSError, FixError, UnicodeDecodeError):
        return None


def _read_marker(entry: str) -> str:
    return (_small_file(os.path.join(entry, READY_MARKER)) or "").strip()[:200]


def _owner_fingerprint(entry: str) -> Optional[str]:
    text = _small_file(os.path.join(entry, OWNER_MARKER))
    try:
        document = json.loads(text) if text is not None else None
    except ValueError:
        return None
    if isinstance(document, dict) and document.get("format") == OWNER_FORMAT:
        value = document.get("fingerprint")
        if isinstance(value, str) and FINGERPRINT.match(value):
            return value
    return None


def owned(store: str, name: str) -> bool:
    """Whether ``<store>/<name>`` is an entry deployctl created (see the module docstring)."""
    path = os.path.join(store, name)
    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            return False
    except OSError:
        return False
    staging = STAGING_NAME.match(name)
    prefix = staging.group(1) if staging else (name if ENTRY_NAME.match(name) else None)
    if prefix is None:
        return False
    owner = _owner_fingerprint(path)
    if owner is not None:
        return owner.startswith(prefix)
    if staging:
        return False        # an old deployctl's staging dir cannot be told from a user's: kept
    ready = _read_marker(path)
    return bool(FINGERPRINT.match(ready)) and ready.startswith(prefix)


def _write_new(path: str, data: bytes) -> None:
    """Create ``path`` (never through an existing file or link), write, fsync."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def overlaps(one: str, other: str) -> bool:
    """``one`` and ``other`` are the same directory or one contains the other (links resolved)."""
    a, b = os.path.realpath(one), os.path.realpath(other)
    return a == b or a.startswith(b.rstrip("/") + "/") or b.startswith(a.rstrip("/") + "/")


def plan_copy(source: str) -> Tuple[List[Tuple[str, str, int]], List[str], List[str]]:
    """What ``copy_checkpoint`` copies: ([(file read, path in the copy, size)], [directories], notes).

    Regular files and real subdirectories inside the drafter directory are copied. A link is
    followed only to a regular file inside the directory, or, for the files the loader reads
    (the weights, config.json, the index), to a regular file anywhere: the Hugging Face cache's
    ``snapshots/<rev>/x -> ../../blobs/<sha>``. Every other link leaving the directory (a
    ``base-model -> /models/...`` link once copied 47 MB; one to the base model would copy all of
    it), every link to a directory and every FIFO, socket or device is skipped and named in the
    notes. A dangling link is an invalid checkpoint (exit 6). Nothing is written here.
    """
    real_source = os.path.realpath(source)
    ckpt = _Checkpoint(source)
    # validated here, in the user's directory, so that an error names the user's file (not the copy)
    for weights in ckpt.weights:
        read_header(weights.real, weights.path)
    _read_config(ckpt.config_path)
    loader_files = set(w.name for w in ckpt.weights) | {CONFIG_NAME, INDEX_NAME}
    files: List[Tuple[str, str, int]] = []
    dirs: List[str] = []
    notes: List[str] = []
    stack = [("", 0)]
    while stack:
        rel, depth = stack.pop()
        here = os.path.join(source, rel) if rel else source
        try:
            names = sorted(os.listdir(here))
        except OSError as exc:
            raise FixError(EXIT_CHECKPOINT, "cannot list %s: %s" % (here, exc.strerror or exc))
        for name in names:
            rel_name = os.path.join(rel, name) if rel else name
            path = os.path.join(source, rel_name)
            if not rel and name in (READY_MARKER, OWNER_MARKER):
                notes.append("%s: deployctl's own store marker, not copied" % path)
                continue
            try:
                lst = os.lstat(path)
            except OSError as exc:
                raise FixError(EXIT_CHECKPOINT, "cannot read %s: %s" % (path, exc.strerror or exc))
            if stat.S_ISLNK(lst.st_mode):
                text = os.readlink(path)
                try:
                    st = os.stat(path)
                except OSError:
                    raise FixError(EXIT_CHECKPOINT, "%s is a dangling link (to %s); fix or remove it "
                                   "before deploying this drafter" % (path, text))
                target = os.path.realpath(path)
                inside = target.startswith(real_source.rstrip("/") + "/")
                if stat.S_ISREG(st.st_mode) and (inside or (not rel and name in loader_files)):
                    files.append((path, rel_name, st.st_size))
                    if not inside:
                        notes.append("%s is a link out of the drafter directory (to %s): its file is "
                                     "copied, the loader reads it" % (path, target))
                elif stat.S_ISDIR(st.st_mode):
                    notes.append("%s is a link to a directory (%s): not followed, not copied"
                                 % (path, target))
                else:
                    notes.append("%s is a link %s (to %s, %s): not copied"
                                 % (path, "inside the drafter directory" if inside else
                                    "out of the drafter directory", target, file_kind(st.st_mode)))
            elif stat.S_ISDIR(lst.st_mode):
                if depth + 1 > MAX_COPY_DEPTH:
                    raise FixError(EXIT_CHECKPOINT, "%s is nested more than %d directories deep; not "
                                   "a drafter directory" % (path, MAX_COPY_DEPTH))
                dirs.append(rel_name)
                stack.append((rel_name, depth + 1))
            elif stat.S_ISREG(lst.st_mode):
                files.append((path, rel_name, lst.st_size))
            else:
                notes.append("%s is %s: not copied" % (path, file_kind(lst.st_mode)))
            if len(files) + len(dirs) > MAX_COPY_FILES:
                raise FixError(EXIT_CHECKPOINT, "%s holds more than %d files; not a drafter directory"
                               % (source, MAX_COPY_FILES))
    return files, sorted(dirs), notes


def _copy_file(source: str, dest: str) -> None:
    src = open_regular(source)      # O_NONBLOCK + fstat: a file swapped for a FIFO is refused
    dst = None
    try:
        st = os.fstat(src)
        dst = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        _copy_range(src, dst, 0, st.st_size, 0)
        # owner read/write: the copy is converted in place (a read-only source stays read-only)
        os.fchmod(dst, stat.S_IMODE(st.st_mode) | 0o600)
        os.close(dst)
        dst = None
        os.utime(dest, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)
    finally:
        _close_quiet(dst)
        os.close(src)


def copy_checkpoint(source: str, staging: str, digest: str) -> List[str]:
    """Copy the drafter's files (see ``plan_copy``) into ``staging``, which gets the owner marker
    first; returns the notes on what was not copied. A failed copy leaves nothing."""
    files, dirs, notes = plan_copy(source)
    needed = sum(size for _, _, size in files)
    try:
        st = os.statvfs(os.path.dirname(staging))
        free: Optional[int] = st.f_bavail * st.f_frsize
    except (AttributeError, OSError):
        free = None
    if free is not None and free < needed + (16 << 20):
        raise FixError(EXIT_IO, "cannot copy %s into the drafter store %s: no space left on device (%d MiB "
                       "needed, %d MiB free); nothing was copied"
                       % (source, os.path.dirname(staging), needed >> 20, free >> 20))
    try:
        os.mkdir(staging, 0o700)
    except OSError as exc:
        raise FixError(EXIT_IO, "cannot create %s: %s" % (staging, exc.strerror or exc))
    try:
        _write_new(os.path.join(staging, OWNER_MARKER), _owner_document(digest))
        for rel in dirs:
            os.mkdir(os.path.join(staging, rel), 0o700)
        for path, rel, _ in files:
            _copy_file(path, os.path.join(staging, rel))
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        why = "no space left on device" if exc.errno == errno.ENOSPC else (exc.strerror or str(exc))
        raise FixError(EXIT_IO, "cannot copy %s into the drafter store: %s" % (source, why))
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return notes


def _owner_document(digest: str) -> bytes:
    return (json.dumps({"format": OWNER_FORMAT, "fingerprint": digest, "tool": "deployctl fixer"}) + "\n"
            ).encode("ascii")


def prune_drafters(store: str, keep: int, last_good: str) -> Dict[str, Any]:
    """Keep the ``keep`` most recently used drafters of the store and the last good one.

    Only entries deployctl created (``owned``) are ever counted or removed; every other entry is
    listed under ``foreign`` and left alone."""
    protected = ""
    text = _small_file(last_good, 1 << 20)
    try:
        record = json.loads(text) if text is not None else None
    except ValueError:
        record = None
    if isinstance(record, dict):
        protected = os.path.basename(str(record.get("drafter_path") or "").rstrip("/"))
    try:
        names = os.listdir(store)
    except OSError as exc:
        return {"kept": [], "removed": [], "protected": protected or None, "error": str(exc), "foreign": []}
    entries, removed, foreign = [], [], []
    now = time.time()
    for name in names:
        path = os.path.join(store, name)
        if not owned(store, name):
            foreign.append(name)
            continue
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
    return {"kept": kept, "removed": sorted(removed), "protected": protected or None, "error": None,
            "foreign": sorted(foreign)}


def _summary(status: str, code: int, drafter: str, digest: str, entry: str, stored_before: bool,
             version: Optional[str], version_read: Optional[Dict[str, Any]],
             conversion: Optional[Dict[str, Any]], pruned: Optional[Dict[str, Any]],
             skipped: Optional[List[str]] = None) -> Dict[str, Any]:
    conversion = conversion or {}
    return {
        "status": status, "exit_code": code, "drafter": drafter, "fingerprint": digest, "store": entry,
        "stored_before": stored_before, "sglang_version": version, "sglang_version_read": version_read,
        "renamed": len(conversion.get("renames") or []), "files": conversion.get("files") or [],
        "config": conversion.get("config"), "verification": conversion.get("verification"),
        "pruned": pruned, "skipped": list(skipped or []),
    }


def _clear_own(store: str, path: str, what: str) -> None:
    """Remove ``path`` when deployctl made it; refuse (nothing deleted) when it did not."""
    if not os.path.lexists(path):
        return
    if not owned(store, os.path.basename(path)):
        raise FixError(EXIT_IO, "%s exists but deployctl did not create it (no %s owner marker): it is "
                       "left alone and %s; move it away" % (path, OWNER_MARKER, what))
    shutil.rmtree(path, ignore_errors=True)


def store_drafter(drafter: str, store: str, *, keep: int, last_good: str, when: str = "always",
                  hidden_states_from: str = "keep", generation: Optional[str] = None,
                  sglang_python: Optional[str] = None) -> Dict[str, Any]:
    """Fingerprint, reuse or copy + convert + verify + publish, prune; returns the JSON summary.

    ``status``: "unchanged" (``when=changed`` and the store has it: nothing converted or read),
    "already_converted" (the store had it; re-verified), "converted" (copied, converted, published),
    "verify_failed" (exit 8: SGLang would not load it fully; a new copy is not published),
    "no_sglang_version" (exit 1: ``sglang_version_read`` holds the failed read; nothing copied).
    ``generation``: a version or legacy/modern; None reads the version under ``sglang_python``.
    ``skipped``: what the copy left out (links leaving the drafter directory, FIFOs, ...).
    """
    if when not in WHEN:
        raise ValueError("when must be one of %s" % (WHEN,))
    drafter = os.path.abspath(drafter)
    if overlaps(store, drafter):
        raise FixError(EXIT_CONFIG, "the drafter store %s and the drafter %s overlap (one is or contains the "
                       "other): the store prunes its entries, so it must not hold the user's checkpoints; "
                       "set the host's state_dir elsewhere; nothing was read or written" % (store, drafter))
    digest = fingerprint(drafter)
    entry = store_entry(store, digest)
    stored = owned(store, os.path.basename(entry)) and _read_marker(entry) == digest
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
    _clear_own(store, staging, "nothing was copied")
    skipped = copy_checkpoint(drafter, staging, digest)
    try:
        if fingerprint(drafter) != digest:
            raise FixError(EXIT_CHECKPOINT, "%s changed while it was being copied into the drafter store (is it "
                           "still being written?); nothing was deployed, try again" % drafter)
        conversion = convert(staging, hidden_states_from=hidden_states_from, generation=target)
        if conversion["exit_code"] != EXIT_OK:
            shutil.rmtree(staging, ignore_errors=True)
            status = "verify_failed" if conversion["exit_code"] == EXIT_VERIFY else conversion["status"]
            return _summary(status, conversion["exit_code"], drafter, digest, entry, False, version, version_read,
                            conversion, None, skipped)
        _write_new(os.path.join(staging, READY_MARKER), (digest + "\n").encode("ascii"))
        _clear_own(store, entry, "nothing was published")
        os.rename(staging, entry)
        _fsync_dir(store)
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        why = "no space left on device" if exc.errno == errno.ENOSPC else (exc.strerror or str(exc))
        raise FixError(EXIT_IO, "cannot publish %s in the drafter store %s: %s" % (drafter, store, why))
    except FixError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        exc.message = exc.message.replace(staging, drafter)     # name the user's file, not the copy
        exc.args = (exc.message,)
        raise
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    # only a new drafter can push an old one out of the store
    pruned = prune_drafters(store, keep, last_good)
    return _summary(conversion["status"], EXIT_OK, drafter, digest, entry, False, version, version_read,
                    conversion, pruned, skipped)
