"""SIMULATED SGLang package: a TEST DOUBLE from deployctl's sandbox, not the real sglang.

Installed on each sandbox host's python path (``~/pylib``). ``python3 -m sglang.launch_server``
starts a small stdlib HTTP server that behaves like SGLang where deployctl depends on it (flags,
log lines, HTTP endpoints, EAGLE-3 weight-name resolution and its effect on acceptance); it loads
no model and uses no GPU. ``python3 -m sglang.bench_serving`` prints SGLang's benchmark block
from the stand-in's simulated timings. See each module's docstring for what is and is not faithful.
"""

import os
import time

# A real SGLang (0.5.23) takes ~2.6 s and ~320 MiB to import (torch and friends). The stand-in
# pays the time too, so a deployctl code path that regresses to `import sglang` (instead of reading
# the package metadata) shows up in timings. SGLANG_SIM_IMPORT_SECONDS overrides it.
time.sleep(float(os.environ.get("SGLANG_SIM_IMPORT_SECONDS", "2.5")))

from sglang.version import __version__  # noqa: E402

__all__ = ["__version__"]
