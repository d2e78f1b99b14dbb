"""One weights file's planned change (the header it gets and how it is written).

Its own module so that conversion.py (which executes plans) and rename.py (which builds the index
from them) both import it without importing each other: rename -> conversion -> loader -> rename
was an import cycle."""

from __future__ import annotations

from typing import Any, Dict, Optional

from .checkpoint import _WeightsFile
from .header import Header, _header_region


def renamed_entries(entries: Dict[str, Any], mapping: Dict[str, str]) -> Dict[str, Any]:
    return dict((mapping.get(k, k) if k != "__metadata__" else k, v) for k, v in entries.items())


class FilePlan(object):
    def __init__(self, weights: _WeightsFile, header: Header, mapping: Dict[str, str]) -> None:
        self.weights = weights
        self.header = header
        self.renamed = [(k, mapping[k]) for k in header.tensor_names if k in mapping]
        self.new_raw = header.raw
        self.mode = "unchanged"
        if self.renamed:
            self.new_raw, in_place = _header_region(renamed_entries(header.entries, mapping),
                                                    header.header_len)
            self.mode = "in_place" if in_place else "rewritten"
            if weights.shared:
                self.mode = "copied"        # never write through a shared file: a converted copy
        self.new_size = header.size - len(header.raw) + len(self.new_raw)
        self.fd: Optional[int] = None
        #: set as soon as a byte of the file may have changed (the backup is needed from then on)
        self.touched = False
