"""Weight-key renames: the rule list, the per-file rename plan, and the sharded index's weight map."""

from __future__ import annotations

import re
from typing import Any, Dict, List, Tuple

from .errors import EXIT_CHECKPOINT, EXIT_USAGE, FixError
from .header import Header
from .checkpoint import INDEX_NAME
from .plan import FilePlan

DEFAULT_RENAMES = (("layers.0.", "midlayer."),)
_LAYER_KEY = re.compile(r"^layers\.(\d+)\.")
_LATER_INPUT_NORM = re.compile(r"^layers\.(\d+)\.input_layernorm\.weight$")


def _parse_rules(renames: Any) -> Tuple[List[Tuple[str, str]], bool]:
    """(rules, custom). ``renames``: None (default), ["OLD=NEW", ...], [(old, new), ...] or a dict."""
    if renames is None:
        return list(DEFAULT_RENAMES), False
    pairs: List[Tuple[str, str]] = []
    items = list(renames.items()) if isinstance(renames, dict) else list(renames)
    for item in items:
        if isinstance(item, str):
            if "=" not in item:
                raise FixError(EXIT_USAGE, "--rename %r: expected OLD=NEW (a key prefix and its "
                               "replacement)" % item)
            old, new = item.split("=", 1)
        else:
            old, new = item
        if not old:
            raise FixError(EXIT_USAGE, "--rename %s=%s: the old prefix is empty" % (old, new))
        if old == new:
            raise FixError(EXIT_USAGE, "--rename %s=%s renames nothing" % (old, new))
        if new.startswith(old):
            raise FixError(EXIT_USAGE, "--rename %s=%s: the new prefix starts with the old one, so "
                           "every run would rename again" % (old, new))
        if (old, new) in pairs:
            continue
        for earlier_old, earlier_new in pairs:
            # the first rule whose OLD starts a key wins: a later rule it shadows never applies
            if old == earlier_old:
                raise FixError(EXIT_USAGE, "--rename %s=%s conflicts with --rename %s=%s (the same "
                               "prefix renamed two ways); nothing was written"
                               % (old, new, earlier_old, earlier_new))
            if old.startswith(earlier_old):
                raise FixError(EXIT_USAGE, "--rename %s=%s never applies: --rename %s=%s comes first and "
                               "matches every key it would; put the longer prefix first; nothing was "
                               "written" % (old, new, earlier_old, earlier_new))
        pairs.append((old, new))
    if not pairs:
        raise FixError(EXIT_USAGE, "no rename given")
    return pairs, True


def _plan_renames(headers: List[Header], rules: List[Tuple[str, str]], custom: bool
                  ) -> Tuple[Dict[str, str], int, List[str]]:
    """(old -> new for every key to rename, decoder layers seen, log lines)."""
    names = [n for h in headers for n in h.tensor_names]
    present = set(names)
    layer_ids = set()
    for name in names:
        match = _LAYER_KEY.match(name)
        if match:
            layer_ids.add(int(match.group(1)))
    multi = any(i > 0 for i in layer_ids)
    log: List[str] = []
    if multi:
        layers = max(layer_ids) + 1
        log.append("%d decoder layers: keeping the layers.N.* names (SGLang 0.5.12+ loads them); "
                   "SGLang 0.5.11 and older cannot serve a drafter with more than one layer "
                   "(\"EAGLE3 currently only supports 1 layer\")" % layers)
    elif layer_ids or any(n.startswith("midlayer.") for n in names):
        layers = 1
    else:
        layers = 0
    mapping: Dict[str, str] = {}
    for name in names:
        new = name
        match = _LATER_INPUT_NORM.match(name) if multi else None
        # SGLang 0.5.12+ uses hidden_norm as the pre-attention norm of layers N > 0; speculators
        # saves that norm as input_layernorm, which would load into an unused parameter.
        if match and int(match.group(1)) > 0:
            target = "layers.%s.hidden_norm.weight" % match.group(1)
            if target not in present:
                new = target
        if custom or not multi:
            for old, repl in rules:
                if new.startswith(old):
                    new = repl + new[len(old):]
                    break
        if new != name:
            if not new:
                raise FixError(EXIT_USAGE, "renaming %r would leave an empty key" % name)
            mapping[name] = new
    owner: Dict[str, str] = {}
    for header in headers:
        for name in header.tensor_names:
            final = mapping.get(name, name)
            if final in owner:
                raise FixError(EXIT_CHECKPOINT, "%s: renaming %r -> %r would create a duplicate key "
                               "(%r is already in %s)" % (header.display, name, final, final,
                                                          owner[final]))
            owner[final] = header.display
    return mapping, layers, log


def _plan_weight_map(weight_map: Dict[str, str], plans: List[FilePlan],
                     mapping: Dict[str, str], rules: List[Tuple[str, str]]
                     ) -> Tuple[Dict[str, str], List[str]]:
    """The index's weight_map as the shards will be: built from their final keys, in the old order.

    Built from the shards, not from this run's renames alone: a run killed between two shards
    leaves the first shard converted and the index old; the next run must still fix its keys.
    """
    managed = set(p.weights.name for p in plans)
    owner: Dict[str, str] = {}
    for plan in plans:
        for name in plan.header.tensor_names:
            owner[mapping.get(name, name)] = plan.weights.name
    new_map: Dict[str, str] = {}
    stale = []
    for key, file_name in weight_map.items():
        if file_name not in managed:
            new_map[key] = file_name            # another shard, not part of this run
            continue
        candidates = [mapping.get(key, key)]
        candidates += [repl + key[len(old):] for old, repl in rules if key.startswith(old)]
        for candidate in candidates:
            if owner.get(candidate) == file_name and candidate not in new_map:
                new_map[candidate] = file_name
                break
        else:
            stale.append((key, file_name))
    if stale:
        # The index promises a tensor no shard has: the checkpoint is incomplete (a shard from
        # another revision, an interrupted download). Rewriting the index without it would hide
        # that; SGLang would then run with that parameter uninitialised.
        shown = ", ".join("%r (in %s)" % item for item in stale[:5])
        raise FixError(EXIT_CHECKPOINT, "%s lists %d tensor(s) that no shard contains: %s%s; the "
                       "checkpoint is incomplete; nothing was written"
                       % (INDEX_NAME, len(stale), shown, " ..." if len(stale) > 5 else ""))
    missing = [name for name in owner if name not in new_map]
    for name in missing:
        new_map[name] = owner[name]
    log = []
    if missing:
        log.append("%s: weight_map rebuilt from the shards (%d entr%s added)"
                   % (INDEX_NAME, len(missing), "y" if len(missing) == 1 else "ies"))
    return new_map, log
