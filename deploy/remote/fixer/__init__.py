"""Make an EAGLE-3 drafter loadable by SGLang: rename its weight keys and config, in place.

Why: SGLang's ``LlamaForCausalLMEagle3.load_weights`` drops every tensor whose name it does not
know without a word. A drafter trained with vLLM's speculators library names its decoder layer
``layers.0.*``; SGLang 0.5.6-0.5.11 only know ``midlayer.*``, so the layer stays randomly
initialised and acceptance collapses to ``accept len: 1.00``. speculators also writes the aux
hidden-state layer ids at the top level of config.json, where the Llama draft path never reads
them (SGLang then captures its default layers).

What it does, for a drafter directory (``model.safetensors``, or shards with
``model.safetensors.index.json``) or one ``.safetensors`` file:

* renames key prefixes in the safetensors header (default ``layers.0.`` -> ``midlayer.``;
  ``--rename OLD=NEW`` replaces the default). A drafter with several decoder layers keeps its
  ``layers.N.*`` names (SGLang 0.5.12+ loads them) and gets ``layers.N.input_layernorm.weight``
  -> ``layers.N.hidden_norm.weight`` for N > 0; SGLang 0.5.11 and older cannot serve it at all.
* rewrites only the header. Same-length renames (``layers.0.`` and ``midlayer.`` are both 9 bytes)
  or a header that got shorter are written in place with one ``pwrite`` (padded with spaces to the
  old length); tensor bytes are never read or moved. Only a longer header makes a new file next
  to the old one (chunked ``copy_file_range``), fsynced and atomically renamed over it.
* converts a speculators config.json to the flat SGLang form (``LlamaForCausalLMEagle3``,
  ``eagle_config.eagle_aux_hidden_state_layer_ids``), see ``--hidden-states-from``.
* keeps the original header bytes, config.json and index in a sidecar
  (``.deployctl-fix-backup.json`` beside the weights) written and fsynced before the first byte
  changes, sealed with a sha256 over its own content; ``--restore`` puts them back byte for byte,
  only after the seal, every name (a plain file name in the directory) and every hash checked.
  It never writes through a link or hard link leaving the directory, and puts a config.json or
  index link back only when it stays inside (or in the Hugging Face cache's ``blobs/``).
* simulates SGLang's name resolution for the chosen SGLang generation and lists, by name, every
  tensor that would be dropped and every parameter that would stay uninitialised.

Guarantees. Nothing is written before every header, config.json and index has been read and
validated. Killed at any instant (SIGKILL), every file stays loadable as its complete old or
complete new version: a header rewritten in place is one pwrite (see _write_header_in_place for
the exact limit), a longer header and every JSON file go through a temporary file and an atomic
rename. The next run finishes the job; ``--restore`` undoes it. Power loss: the sidecar is fsynced
before any other file changes, so ``--restore`` can always bring the original back. Running again
on a converted drafter opens nothing for writing. POSIX only (pread/pwrite, flock).

Usage::

    python3 fixer.pyz [--check] [--json] [--rename OLD=NEW ...]
        [--hidden-states-from {keep,vllm,sglang}]
        [--sglang-generation {legacy,modern} | --sglang-version X.Y.Z]
        [--full-backup] PATH
    python3 fixer.pyz --restore [--json] PATH
    python3 fixer.pyz --fingerprint PATH          (always one JSON document)
    python3 fixer.pyz store --store DIR --keep N --last-good FILE [--when always|changed]
        [--hidden-states-from ...] (--sglang-version V | --sglang-generation G | --sglang-python PY)
        -- DRAFTER                                (the fix-keys step's host side: see store.py)

Exit codes (the same as deployctl's ``deploy.base.errors.ExitCode``): 0 done or already converted and
verified; 1 ``--check``: a change is needed; 2 usage (conflicting ``--rename`` rules included);
3 (``store`` only) the store overlaps the drafter; 6 invalid checkpoint (config.json missing or not
a regular file, a weights file that is a FIFO, a directory or a dangling link, a header field of
the wrong JSON type; nothing written); 8 verification failed (a tensor would be dropped, a
parameter stays uninitialised, a tensor name is empty or holds a control character, aux capture
not configured): the planned result is verified BEFORE the first write, so the checkpoint is left
byte-identical (status ``verify_failed``); an already converted drafter that fails is 8 too;
10 writing failed (read-only, no space); 130 interrupted. ``store`` is a host-side command: only
the zipapp's entry (and ``python3 -m deploy.remote.fixer``) accept it, ``deployctl fix-keys``
refuses it (exit 2).

``--json`` prints exactly one JSON document on stdout::

    {"status": "converted" | "already_converted" | "needs_conversion" | "verify_failed" | "restored",
     "path": str, "exit_code": int, "dry_run": bool,
     "files": [{"file": str, "mode": "in_place" | "rewritten" | "copied" | "unchanged",
                "renamed": int}],
     "renames": [[old, new], ...],
     "config": {"converted": bool, "kind": "speculators" | "sglang" | "other" | "missing",
                "aux_layer_ids": [int, ...] | null, "ids_mode": "keep" | "vllm" | "sglang"},
     "layers": int, "legacy_servable": bool,
     "verification": {"generation": "legacy" | "modern", "sglang_versions": str, "ok": bool,
                      "dropped": [str], "missing": [str], "problems": [str], "notes": [str],
                      "layers": int, "aux_layer_ids": [int, ...] | null},
     "fingerprint": str (hex sha256), "log": [str]}

``--check`` adds ``verification_after_conversion`` (the verification of the planned result).
``--restore``: ``{"status": "restored", "path", "exit_code", "files": [{"file", "mode"}],
"config": {"restored": bool}, "fingerprint", "log"}``. ``--fingerprint`` (always JSON):
``{"status": "fingerprint", "path", "fingerprint", "exit_code"}``. On error:
``{"status": "error", "code": int, "error": str}`` with that exit code.

Hostile input. Every JSON read here has a size limit checked before reading (config.json 16 MiB,
the index 64 MiB, the sidecar 256 MiB, a safetensors header safetensors' own 100 MB) and a depth
limit; NaN and Infinity are refused; an index naming a tensor that no shard has is an incomplete
checkpoint (exit 6). A shard that is a link out of the checkpoint directory (the Hugging Face
cache's ``snapshots/<rev>/x -> ../../blobs/<sha>``) or has several hard links is never written
through: it is replaced by a converted copy (mode ``copied``, space checked first) and
``--restore`` puts the link back.

Standalone: Python 3.8+ standard library only. Shipped to GPU hosts as one zipapp, ``fixer.pyz``
(built deterministically at upload by deploy/facts/helpers.py), and imported by ``deployctl
fix-keys``. Modules: errors, header (also embedded in the doctor's inline program), fileio,
checkpoint, plan, sidecar, rename, config, loader, conversion, restoration, store (the host-side
drafter store), cli. Library API: ``convert``, ``restore``, ``verify``,
``fingerprint``, ``read_header``, ``main`` and ``FixError``.

Test hooks (environment variables, for the fault-injection tests only):

* ``DEPLOYCTL_FIX_KILL_AT=STAGE[:N]`` -- the process sends itself SIGKILL at the N-th (default 1st)
  time it reaches STAGE. Stages, in order: ``mid_full_backup``, ``after_backup_tmp_write``,
  ``after_backup_rename``; per in-place file ``before_header_write``, ``after_header_write``; per
  rewritten file ``before_copy``, ``mid_copy``, ``before_replace``, ``after_replace``;
  ``after_weights_before_config``, ``after_index_tmp``, ``before_index_replace``,
  ``after_index_replace``, ``after_config_tmp``, ``before_config_replace``,
  ``after_config_replace``, ``before_verify``. ``--restore``: ``restore_before_header_write``,
  ``restore_after_header_write``, ``restore_mid_copy``, ``restore_after_config``,
  ``restore_before_sidecar_remove``. ``mid_copy``, ``restore_mid_copy`` and ``mid_full_backup``
  are reached after every chunk copied, so ``mid_copy:5`` kills after the fifth chunk.
* ``DEPLOYCTL_FIX_COPY_CHUNK=BYTES`` -- chunk size of the data copy (default 8 MiB), so tests can
  reach ``mid_copy`` with small files.
"""

from __future__ import annotations

from .checkpoint import CONFIG_NAME, INDEX_NAME, SIDECAR_NAME, fingerprint
from .cli import main
from .config import SGLANG_ARCH
from .conversion import convert
from .errors import (EXIT_CHANGE_NEEDED, EXIT_CHECKPOINT, EXIT_INTERRUPTED, EXIT_IO, EXIT_OK, EXIT_USAGE,
                     EXIT_VERIFY, FixError)
from .fileio import TMP_SUFFIX
from .header import Header, read_header
from .loader import FIRST_MODERN, OLDEST_SUPPORTED, simulate_fixed, verify
from .restoration import restore
from .sidecar import SIDECAR_FORMAT

__all__ = [
    "CONFIG_NAME", "EXIT_CHANGE_NEEDED", "EXIT_CHECKPOINT", "EXIT_INTERRUPTED", "EXIT_IO", "EXIT_OK",
    "EXIT_USAGE", "EXIT_VERIFY", "FIRST_MODERN", "FixError", "Header", "INDEX_NAME", "OLDEST_SUPPORTED",
    "SGLANG_ARCH", "SIDECAR_FORMAT", "SIDECAR_NAME", "TMP_SUFFIX", "convert", "fingerprint", "main",
    "read_header", "restore", "simulate_fixed", "verify",
]
