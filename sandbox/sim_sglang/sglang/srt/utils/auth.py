"""SIMULATED ``sglang.srt.utils.auth`` (deployctl sandbox TEST DOUBLE): ``decide_request_auth`` as the
0.5.21 and 0.5.23 wheels write it (the two files are identical), and the route levels of their
``srt/entrypoints/http_server.py`` for the routes the stand-in serves.

- /health*, /ready*, /metrics*: always allowed.
- ADMIN_OPTIONAL (``@auth_level(AuthLevel.ADMIN_OPTIONAL)``: /begin_weight_update,
  /update_weights_from_tensor, /end_weight_update, /flush_cache): with ``--admin-api-key`` only that
  key; else with ``--api-key`` only that key; with neither, anyone.
- NORMAL (every other route: /server_info, /model_info, /generate, /v1/...): with ``--api-key`` that key
  (even when ``--admin-api-key`` is set too, which is not accepted there); without, anyone.
A refusal is 401 (ADMIN_FORCE's 403 is not used by these routes)."""

from __future__ import annotations

import secrets

ADMIN_OPTIONAL_PATHS = ("/begin_weight_update", "/update_weights_from_tensor", "/end_weight_update", "/flush_cache")


def auth_level(path: str) -> str:
    return "admin_optional" if path in ADMIN_OPTIONAL_PATHS else "normal"


def _bearer(header: str | None, expected: str) -> bool:
    if not header:
        return False
    parts = header.split(" ", 1)
    return len(parts) == 2 and parts[0].lower() == "bearer" and secrets.compare_digest(parts[1], expected)


def decide_request_auth(*, method: str, path: str, authorization_header: str | None, api_key: str | None,
                        admin_api_key: str | None) -> bool:
    if method == "OPTIONS" or path.startswith(("/health", "/ready", "/metrics")):
        return True
    if auth_level(path) == "admin_optional":
        if admin_api_key:
            return _bearer(authorization_header, admin_api_key)
        if api_key:
            return _bearer(authorization_header, api_key)
        return True
    if api_key:
        return _bearer(authorization_header, api_key)
    return True
