"""The conversion: validate everything, write the sidecar, rewrite headers (in place when the
length allows), convert config.json and the index, verify against the loader simulation."""

from __future__ import annotations

import errno
import os
import stat
from typing import Any, Dict, List, Optional, Tuple

from .errors import EXIT_CHANGE_NEEDED, EXIT_CHECKPOINT, EXIT_IO, EXIT_OK, EXIT_USAGE, EXIT_VERIFY, FixError
from .header import _pread_exact, _read_region, open_regular, read_header
from .fileio import NOFOLLOW, TMP_SUFFIX, _atomic_write, _close_quiet, _copy_range, _fsync_dir, _io_error, _sha256, _stage, _tmp_path, _unb64, _unlink_quiet, _write_all
from .checkpoint import CONFIG_NAME, INDEX_NAME, SIDECAR_NAME, _Checkpoint, _WeightsFile, _dump_json, _read_config, fingerprint
from .sidecar import _json_entry, _known, _load_sidecar, _new_sidecar, _record, _torn_between, seal
from .rename import _parse_rules, _plan_renames, _plan_weight_map
from .plan import FilePlan
from .config import IDS_MODES, config_kind, convert_config, _sglang_ids
from .loader import _merged_shapes, _resolve_generation, _simulate_load, name_problems


def _heal_torn(ckpt: _Checkpoint, sidecar: Dict[str, Any], dry_run: bool, log: List[str]) -> None:
    for weights in ckpt.weights:
        entry = sidecar["files"].get(weights.name)
        if not isinstance(entry, dict) or entry.get("target", {}).get("mode") != "in_place":
            continue
        try:
            region, size = _read_region(weights.real)
        except OSError:
            continue
        source, target = _unb64(entry["source"]["b64"]), _unb64(entry["target"]["b64"])
        current = region
        if current is None or len(current) != len(target):
            try:
                rfd = open_regular(weights.real, weights.path)
            except FixError:
                continue
            try:
                current = _pread_exact(rfd, len(target), 0)
            finally:
                os.close(rfd)
        if _sha256(current) in _known(entry) or not _torn_between(current, source, target):
            continue
        if dry_run:
            raise FixError(EXIT_CHECKPOINT, "%s: an interrupted header rewrite left the header half "
                           "old, half new; run without --check to complete it, or --restore"
                           % weights.path)
        fd: Optional[int] = None
        try:
            fd = os.open(weights.real, os.O_RDWR)
            os.pwrite(fd, target[8:], 8)
            os.fsync(fd)
        except OSError as exc:
            raise _io_error("repair", weights.path, exc)
        finally:
            _close_quiet(fd)
        log.append("%s: completed a header rewrite that an earlier run left half done" % weights.name)


def convert(path: str, *, renames: Any = None, hidden_states_from: str = "keep",
            generation: str = "legacy", full_backup: bool = False, dry_run: bool = False
            ) -> Dict[str, Any]:
    """Convert the drafter at ``path`` for SGLang; returns the summary (the ``--json`` document).

    Raises FixError for invalid input (6), bad arguments (2) and write failures (10). A failed
    verification does not raise: the summary's ``verification.ok`` is False, ``exit_code`` 8.
    """
    gen = _resolve_generation(generation)
    if hidden_states_from not in IDS_MODES:
        raise FixError(EXIT_USAGE, "hidden_states_from must be one of %s, got %r"
                       % (", ".join(IDS_MODES), hidden_states_from))
    rules, custom = _parse_rules(renames)
    ckpt = _Checkpoint(path)
    lock = None if dry_run else _lock_dir(ckpt.dir)
    try:
        return _convert(ckpt, rules, custom, hidden_states_from, gen, full_backup, dry_run)
    finally:
        _close_quiet(lock)


def _lock_dir(directory: str) -> Optional[int]:
    """One fixer at a time per drafter directory (flock; released when the process dies)."""
    try:
        import fcntl
    except ImportError:
        return None
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise FixError(EXIT_IO, "another fix-keys run is working on %s (its lock is held)"
                           % directory)
        return None
    return fd


def _convert(ckpt: _Checkpoint, rules: List[Tuple[str, str]], custom: bool, ids_mode: str,
             generation: str, full_backup: bool, dry_run: bool) -> Dict[str, Any]:
    log: List[str] = []
    sidecar = _load_sidecar(ckpt.sidecar_path)
    if sidecar is not None:
        _heal_torn(ckpt, sidecar, dry_run, log)

    # Read and validate everything before a single byte is written.
    headers = [read_header(w.real, w.path) for w in ckpt.weights]
    shapes_before = _merged_shapes(headers)
    mapping, layers, layer_log = _plan_renames(headers, rules, custom)
    log.extend(layer_log)
    plans = [FilePlan(w, h, mapping) for w, h in zip(ckpt.weights, headers)]
    shapes_after = dict((mapping.get(k, k), v) for k, v in shapes_before.items())

    config_raw, config = _read_config(ckpt.config_path)
    kind = config_kind(config)
    new_config: Optional[Dict[str, Any]] = None
    aux_ids: Optional[List[int]] = None
    config_log: List[str] = []
    if kind == "speculators" and config is not None:
        new_config, config_log, aux_ids = convert_config(config, ids_mode, shapes_after,
                                                          CONFIG_NAME)
    elif kind == "sglang" and config is not None:
        aux_ids = _sglang_ids(config)
        if ids_mode != "keep":
            config_log.append("%s is already in SGLang format: --hidden-states-from %s not "
                              "applied (ids %r left as they are)" % (CONFIG_NAME, ids_mode, aux_ids))
    elif kind == "missing":
        config_log.append("no %s beside the weights: SGLang needs one" % CONFIG_NAME)
    else:
        config_log.append("%s: architectures %r is neither speculators nor SGLang EAGLE-3; left "
                          "alone" % (CONFIG_NAME, config.get("architectures") if config else None))
    new_config_raw = _dump_json(new_config) if new_config is not None else None

    new_index_raw: Optional[bytes] = None
    if ckpt.index is not None and ckpt.index_raw is not None:
        new_map, index_log = _plan_weight_map(ckpt.index["weight_map"], plans, mapping, rules)
        log.extend(index_log)
        if list(new_map.items()) != list(ckpt.index["weight_map"].items()):
            new_index = dict(ckpt.index)
            new_index["weight_map"] = new_map
            new_index_raw = _dump_json(new_index)

    for plan in plans:
        for old, new in plan.renamed:
            log.append("%s -> %s" % (old, new))
    for plan in plans:
        if plan.mode == "in_place":
            log.append("%s: %d key(s) renamed; header rewritten in place (%d bytes, tensor data "
                       "untouched)" % (plan.weights.name, len(plan.renamed), plan.header.header_len))
        elif plan.mode == "rewritten":
            log.append("%s: %d key(s) renamed; the header grew from %d to %d bytes, so the file is "
                       "rewritten next to the original and renamed over it"
                       % (plan.weights.name, len(plan.renamed), plan.header.header_len,
                          len(plan.new_raw) - 8))
        if plan.mode == "copied":
            log.append("%s is %s: replaced by a converted copy (%d bytes); %s is unchanged%s"
                       % (plan.weights.name, plan.weights.shared, plan.new_size, plan.weights.real,
                          "; --restore puts the link back" if plan.weights.link else ""))
        elif plan.weights.real != os.path.abspath(plan.weights.path) and plan.mode != "unchanged":
            log.append("%s is a link to %s; that file is the one changed"
                       % (plan.weights.name, plan.weights.real))
    log.extend(config_log)

    changing = [p for p in plans if p.mode != "unchanged"]
    changed = bool(changing or new_config_raw is not None or new_index_raw is not None)

    summary: Dict[str, Any] = {
        "path": ckpt.input,
        "dry_run": bool(dry_run),
        "files": [{"file": p.weights.name, "mode": p.mode, "renamed": len(p.renamed)}
                  for p in plans],
        "renames": [[old, new] for p in plans for old, new in p.renamed],
        "config": {"converted": new_config is not None, "kind": kind, "aux_layer_ids": aux_ids,
                   "ids_mode": ids_mode},
        "layers": layers,
        "legacy_servable": layers <= 1,
    }

    if not changed:
        leftovers = [n for n in os.listdir(ckpt.dir) if n.endswith(TMP_SUFFIX)]
        if leftovers:
            log.append("note: temporary file(s) from an interrupted run: %s" % ", ".join(leftovers))
        log.append("already converted: no key to rename and %s needs no change; nothing written"
                   % CONFIG_NAME)
        verification = _simulate_load(shapes_before, config, generation)
        summary.update(status="already_converted", verification=verification,
                       fingerprint=fingerprint(ckpt.input), log=log,
                       exit_code=EXIT_OK if verification["ok"] else EXIT_VERIFY)
        return _ordered(summary)

    # Verify the planned result against the loader's rules BEFORE the first byte is written: a
    # checkpoint that would fail (an empty or NUL tensor name, stray tensors SGLang drops, renames
    # that miss the loader's names, no config.json) is left exactly as it was.
    planned_config = new_config if new_config is not None else config
    planned = _simulate_load(shapes_after, planned_config, generation)
    planned["problems"][:0] = name_problems(list(shapes_after))
    if planned["problems"]:
        planned["ok"] = False
    if dry_run:
        log.append("check only: nothing written")
        summary.update(status="needs_conversion",
                       verification=_simulate_load(shapes_before, config, generation),
                       verification_after_conversion=planned,
                       fingerprint=fingerprint(ckpt.input), log=log, exit_code=EXIT_CHANGE_NEEDED)
        return _ordered(summary)
    if kind == "missing":
        raise FixError(EXIT_CHECKPOINT, "%s has no %s: SGLang cannot build the draft model without "
                       "it; nothing was written" % (ckpt.dir, CONFIG_NAME))
    if not planned["ok"]:
        log.append("the converted drafter would fail verification for SGLang %s; nothing written"
                   % planned["sglang_versions"])
        summary.update(status="verify_failed", verification=planned,
                       fingerprint=fingerprint(ckpt.input), log=log, exit_code=EXIT_VERIFY)
        return _ordered(summary)

    sidecar_written = json_touched = False
    try:
        _preflight(ckpt, changing, new_config_raw is not None, new_index_raw is not None,
                   full_backup)
        if full_backup:
            _full_backup(ckpt, changing, new_config_raw is not None, new_index_raw is not None, log)
        _write_sidecar(ckpt, sidecar, plans, config_raw, new_config_raw, new_index_raw, log)
        sidecar_written = True
        # Rewritten files first: they are the ones that can run out of space, and then nothing
        # else has changed yet.
        for plan in sorted(changing, key=lambda p: p.mode == "in_place"):
            if plan.mode == "in_place":
                _write_header_in_place(plan)
            elif plan.mode == "copied":
                _rewrite_file(plan.weights.real, plan.new_raw, plan.header.data_offset,
                              plan.header.data_len, plan.weights.path, dest=plan.weights.path)
                plan.touched = True
            else:
                _rewrite_file(plan.weights.real, plan.new_raw, plan.header.data_offset,
                              plan.header.data_len, plan.weights.path)
                plan.touched = True
        _stage("after_weights_before_config")
        if new_index_raw is not None and ckpt.index_path:
            _atomic_write(ckpt.index_path, new_index_raw, "after_index_tmp", "before_index_replace",
                          "after_index_replace")
            json_touched = True
            log.append("%s: weight_map updated" % INDEX_NAME)
        if new_config_raw is not None:
            _atomic_write(ckpt.config_path, new_config_raw, "after_config_tmp",
                          "before_config_replace", "after_config_replace")
            json_touched = True
            log.append("%s written (the original is in %s)" % (CONFIG_NAME, SIDECAR_NAME))
    except FixError as exc:
        touched = [p.weights.name for p in plans if p.touched]
        if touched or json_touched:
            exc.message += ("; already changed: %s; run again once fixed, or --restore"
                            % ", ".join(touched + ([CONFIG_NAME] if json_touched else [])))
            exc.args = (exc.message,)
        elif sidecar_written and sidecar is None:
            _unlink_quiet(ckpt.sidecar_path)      # nothing changed: a failed first run leaves no trace
            _fsync_dir(ckpt.dir)
        raise
    finally:
        for plan in plans:
            _close_quiet(plan.fd)
            plan.fd = None
    _stage("before_verify")

    final_headers = [read_header(w.real, w.path) for w in ckpt.weights]
    _, final_config = _read_config(ckpt.config_path)
    verification = _simulate_load(_merged_shapes(final_headers), final_config, generation)
    summary.update(status="converted", verification=verification,
                   fingerprint=fingerprint(ckpt.input), log=log,
                   exit_code=EXIT_OK if verification["ok"] else EXIT_VERIFY)
    return _ordered(summary)


def _ordered(summary: Dict[str, Any]) -> Dict[str, Any]:
    first = ("status", "path", "exit_code", "dry_run", "files", "renames", "config", "layers",
             "legacy_servable", "verification", "verification_after_conversion", "fingerprint",
             "log")
    out = dict((k, summary[k]) for k in first if k in summary)
    out.update((k, v) for k, v in summary.items() if k not in out)
    return out


def _preflight(ckpt: _Checkpoint, changing: List[FilePlan], config: bool, index: bool,
               full_backup: bool) -> None:
    """Fail with exit 10 before anything changes: read-only files, directory, space."""
    if not os.access(ckpt.dir, os.W_OK):
        raise FixError(EXIT_IO, "cannot write in %s: permission denied (read-only directory); the "
                       "backup sidecar goes there; nothing was changed" % ckpt.dir)
    for path, name, wanted in ((ckpt.config_path, CONFIG_NAME, config),
                               (ckpt.index_path, INDEX_NAME, index)):
        # a link is replaced, not written through: only the directory must be writable
        if wanted and path and not os.path.islink(path) and not os.access(path, os.W_OK):
            raise FixError(EXIT_IO, "cannot write %s: permission denied (read-only file); nothing "
                           "was changed" % path)
    for plan in changing:
        if plan.mode != "copied" and not os.access(plan.weights.real, os.W_OK):
            raise FixError(EXIT_IO, "cannot write %s: permission denied (read-only file); nothing "
                           "was changed" % plan.weights.path)
    needed = sum(p.new_size for p in changing if p.mode in ("rewritten", "copied"))
    if full_backup:
        needed += sum(p.header.size for p in changing)
    if needed:
        try:
            st = os.statvfs(ckpt.dir)
            free = st.f_bavail * st.f_frsize
        except (AttributeError, OSError):
            free = None
        if free is not None and free < needed + (16 << 20):
            raise FixError(EXIT_IO, "cannot write in %s: no space left on device (%d MiB needed for "
                           "the rewritten copy, %d MiB free); nothing was changed"
                           % (ckpt.dir, needed >> 20, free >> 20))
    for plan in changing:
        if plan.mode != "in_place":
            continue
        try:
            plan.fd = os.open(plan.weights.real, os.O_RDWR)
        except OSError as exc:
            raise _io_error("write", plan.weights.path, exc, "; nothing was changed")
        if _pread_exact(plan.fd, len(plan.header.raw), 0) != plan.header.raw:
            raise FixError(EXIT_CHECKPOINT, "%s changed while it was being read; run again"
                           % plan.weights.path)


def _full_backup(ckpt: _Checkpoint, changing: List[FilePlan], config: bool, index: bool,
                 log: List[str]) -> None:
    # a copied (shared) file's backup goes beside the link, never beside the shared blob
    pairs = [(p.weights.real, (p.weights.path if p.mode == "copied" else p.weights.real) + ".orig")
             for p in changing]
    pairs += [(p, p + ".orig") for p, wanted in ((ckpt.config_path, config), (ckpt.index_path, index))
              if wanted and p]
    for path, backup in pairs:
        if os.path.exists(backup):
            log.append("%s exists; kept" % os.path.basename(backup))
            continue
        tmp = _tmp_path(backup)
        src = dst = None
        try:
            src = open_regular(path)
            _unlink_quiet(tmp)
            dst = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, 0o600)
            _copy_range(src, dst, 0, os.fstat(src).st_size, 0,
                        lambda: _stage("mid_full_backup"))
            os.fchmod(dst, stat.S_IMODE(os.fstat(src).st_mode))
            os.fsync(dst)
            os.close(dst)
            dst = None
            os.replace(tmp, backup)
        except OSError as exc:
            _close_quiet(dst)
            _unlink_quiet(tmp)
            raise _io_error("write", backup, exc, "; nothing was changed")
        finally:
            _close_quiet(src)
        _fsync_dir(os.path.dirname(backup))
        log.append("full copy: %s" % os.path.basename(backup))


def _write_sidecar(ckpt: _Checkpoint, sidecar: Optional[Dict[str, Any]], plans: List[FilePlan],
                   config_raw: Optional[bytes], new_config_raw: Optional[bytes],
                   new_index_raw: Optional[bytes], log: List[str]) -> None:
    """The backup must always hold the ORIGINAL bytes: keep older entries for files in a state
    we produced; replace only entries whose file has changed since (a new original)."""
    side = sidecar if sidecar is not None else _new_sidecar(ckpt)
    files = side["files"]
    for plan in plans:
        entry = files.get(plan.weights.name)
        current = _sha256(plan.header.raw)
        known = isinstance(entry, dict) and current in _known(entry)
        if plan.mode == "unchanged":
            if entry is not None and not known:
                del files[plan.weights.name]
                log.append("backup entry for %s dropped: the file changed since that conversion"
                           % plan.weights.name)
            continue
        target = _record(plan.new_raw, plan.new_size)
        target["mode"] = plan.mode
        if entry is not None and known:
            entry = dict(entry)
        else:
            if entry is not None:
                log.append("backup entry for %s replaced: the file changed since that conversion"
                           % plan.weights.name)
            entry = {"original": _record(plan.header.raw, plan.header.size)}
        entry["source"] = _record(plan.header.raw, plan.header.size)
        entry["target"] = target
        if plan.mode == "copied" and plan.weights.link is not None:
            entry["link"] = plan.weights.link
        entry["known_sha256"] = sorted(set(_known(entry)))
        files[plan.weights.name] = entry
    if new_config_raw is not None and config_raw is not None:
        side["config"], replaced = _json_entry(side.get("config"), config_raw, new_config_raw)
        _note_link(side["config"], ckpt.config_path)
        if replaced:
            log.append("backup of %s replaced: it changed since that conversion" % CONFIG_NAME)
    if new_index_raw is not None and ckpt.index_raw is not None:
        side["index"], _ = _json_entry(side.get("index"), ckpt.index_raw, new_index_raw)
        _note_link(side["index"], ckpt.index_path or "")
    _atomic_write(ckpt.sidecar_path, _dump_json(seal(side)), "after_backup_tmp_write", "",
                  "after_backup_rename")
    log.append("original headers%s saved in %s" % (" and config" if new_config_raw else "",
                                                  SIDECAR_NAME))


def _note_link(entry: Dict[str, Any], path: str) -> None:
    """A JSON file that is a link (the Hugging Face cache) is replaced, never written through;
    the sidecar keeps the link's text so --restore can put the link back."""
    if path and os.path.islink(path) and "link" not in entry:
        entry["link"] = os.readlink(path)


def _write_header_in_place(plan: FilePlan) -> None:
    # Crash model. The header region is rewritten with ONE pwrite() of its N bytes; the length
    # prefix and every tensor byte stay where they are. A process killed at any instant (SIGKILL,
    # OOM killer) leaves the old or the new header when the region [8, 8+N) lies within one page
    # (N < 4088 bytes: every EAGLE-3 drafter seen, ~2 KB for 16 tensors), because Linux copies a
    # page into the page cache under the page lock and checks for fatal signals only between
    # pages (mm/filemap.c generic_perform_write). A header spanning several pages can be cut
    # between two pages; the next run recognises that page-wise mix of the sidecar's source and
    # target and completes it (_heal_torn), and --restore undoes it. Power loss: the page cache
    # reaches the disk in any order; the sidecar, fsynced before this write, and --restore bring
    # the original back.
    assert plan.fd is not None
    body = plan.new_raw[8:]
    _stage("before_header_write")
    try:
        written = os.pwrite(plan.fd, body, 8)
        plan.touched = written > 0
        if written != len(body):
            _write_all(plan.fd, body[written:], 8 + written)
        os.fsync(plan.fd)
    except OSError as exc:
        raise _io_error("write the header of", plan.weights.path, exc,
                        "; the original header is in %s (--restore)" % SIDECAR_NAME)
    _stage("after_header_write")


def _rewrite_file(path: str, new_raw: bytes, data_offset: int, data_len: int, display: str,
                  prefix: str = "", dest: Optional[str] = None) -> None:
    """New file beside the old one: header + data copied in chunks; fsync; atomic rename.

    ``dest``: where the new file goes (default ``path``): a link replaced by a converted copy
    reads from the link's target and renames over the link itself.
    """
    dest = dest or path
    tmp = _tmp_path(dest)
    _unlink_quiet(tmp)
    src = dst = None
    try:
        src = open_regular(path, display)
        st = os.fstat(src)
        dst = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, 0o600)
        _write_all(dst, new_raw, 0)
        if not prefix:
            _stage("before_copy")
        _copy_range(src, dst, data_offset, data_len, len(new_raw),
                    lambda: _stage(prefix + "mid_copy"))
        os.fchmod(dst, stat.S_IMODE(st.st_mode))
        try:
            os.fchown(dst, st.st_uid, st.st_gid)
        except OSError:
            pass
        os.fsync(dst)
        if os.fstat(dst).st_size != len(new_raw) + data_len:
            raise OSError(errno.EIO, "short copy")
        os.close(dst)
        dst = None
        if not prefix:
            _stage("before_replace")
        os.replace(tmp, dest)
    except OSError as exc:
        _close_quiet(dst)
        _unlink_quiet(tmp)
        raise _io_error("write", display, exc, "; %s is unchanged and the partial copy was "
                        "removed" % display)
    except BaseException:
        _close_quiet(dst)
        _unlink_quiet(tmp)
        raise
    finally:
        _close_quiet(src)
    _fsync_dir(os.path.dirname(dest))
    if not prefix:
        _stage("after_replace")
