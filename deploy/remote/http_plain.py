"""HTTP/1.1 for the host side's calls to SGLang and the router (standard library, Python 3.8+).

Why not urllib.request: every host command is a fresh interpreter, and importing urllib.request
(http.client, email, ssl, ...) costs about 29 ms of CPU there, twice what the interpreter itself
costs (measured 2026-12-05 with RUSAGE_CHILDREN, median of 15: ``python3 -I -S -c 'import json'``
15 ms, ``... 'import json, urllib.request'`` 44 ms; a router call of fleet_ops.py 54 ms). A roll
sends about 120 router calls per batch, and one test-suite run sent ~1,200 of them and ~400 of
host_ops' health and verify calls. This module imports ``socket`` and ``urllib.parse`` only.

What it does, like ``urllib.request.urlopen`` with one difference each where noted:

* ``http://`` only, IPv4, IPv6 (``[::1]``) or a name; an ``https://`` URL goes through
  urllib.request, imported then. Nothing else is a URL here (ValueError, as urlopen's).
* One request per connection (``Connection: close``), no proxy (urlopen takes ``http_proxy`` from
  the environment: deployctl talks to the workers and the router on their own addresses, which
  is what the router itself does), no redirect followed (a 3xx is returned as it is).
* Every HTTP status is an answer, not an exception (``fetch``); ``post_json`` raises HTTPStatusError
  (an OSError) for 4xx/5xx like urlopen's HTTPError.
* The answer is read strictly and bounded: a status line and at most 100 header lines of 64 KiB,
  then the body by Content-Length, chunked or to the end, at most ``limit`` bytes kept. A body
  that ends before its length, a bad chunk size or status line is an OSError naming it.
  Network errors are the socket's own (ConnectionRefusedError, socket.timeout "timed out").
"""

import socket
from urllib.parse import urlsplit

MAX_LINE = 65536
MAX_HEADERS = 100
#: the methods whose request carries a body; http.client sends Content-Length: 0 when they have none
BODY_METHODS = ("POST", "PUT", "PATCH")


class HTTPStatusError(OSError):
    """A 4xx or 5xx answer where the caller wanted a document (``post_json``)."""

    def __init__(self, code: int, reason: str, body: bytes = b"") -> None:
        OSError.__init__(self, "HTTP Error %d: %s" % (code, reason))
        self.code, self.reason, self.body = code, reason, body


def _line(reader, what: str) -> bytes:
    line = reader.readline(MAX_LINE + 1)
    if len(line) > MAX_LINE:
        raise ConnectionError("the answer's %s is over %d bytes" % (what, MAX_LINE))
    return line


def _request_bytes(method: str, url: str, body, headers) -> tuple:
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError("unknown url type: %r" % (url,))
    port = parts.port or 80  # .port raises ValueError for a port that is not a number in range
    target = (parts.path or "/") + ("?" + parts.query if parts.query else "")
    lines = ["%s %s HTTP/1.1" % (method, target), "Host: " + parts.netloc.rpartition("@")[2],
             "Accept-Encoding: identity", "Connection: close", "User-Agent: deployctl-host"]
    for name, value in (headers or {}).items():
        if any(c in str(name) + str(value) for c in "\r\n\0") or not str(name) or ":" in str(name):
            raise ValueError("invalid header %r" % (name,))
        lines.append("%s: %s" % (name, value))
    if body is not None or method in BODY_METHODS:
        lines.append("Content-Length: %d" % len(body or b""))
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return (parts.hostname, port), head + (body or b"")


def _read_body(reader, headers: dict, limit: int) -> bytes:
    if headers.get("transfer-encoding", "").lower() == "chunked":
        chunks, kept = [], 0
        while kept < limit:
            size_line = _line(reader, "chunk size").split(b";", 1)[0].strip()
            try:
                size = int(size_line, 16)
            except ValueError:
                raise ConnectionError("the answer has a bad chunk size %r" % (size_line[:40],))
            if size == 0:
                break
            data = reader.read(size)
            if len(data) < size:
                raise ConnectionError("the answer ended inside a chunk")
            chunks.append(data)
            kept += size
            reader.readline(3)  # the chunk's CRLF
        return b"".join(chunks)[:limit]
    if "content-length" in headers:
        try:
            length = int(headers["content-length"])
        except ValueError:
            length = -1
        if length < 0:
            raise ConnectionError("the answer has a bad Content-Length %r" % (headers["content-length"][:40],))
        data = reader.read(min(length, limit))
        if len(data) < min(length, limit):
            raise ConnectionError("the answer ended after %d of its %d bytes" % (len(data), length))
        return data
    return reader.read(limit)


def fetch(method: str, url: str, body=None, headers=None, timeout: float = 10.0, limit: int = 1 << 20):
    """One request: (status, reason, at most ``limit`` bytes of the body)."""
    if url[:8].lower() == "https://":
        return _fetch_urllib(method, url, body, headers, timeout, limit)
    address, request = _request_bytes(method, url, body, headers)
    with socket.create_connection(address, timeout=timeout) as sock:
        sock.sendall(request)
        with sock.makefile("rb") as reader:
            while True:
                status_line = _line(reader, "status line")
                if not status_line:
                    raise ConnectionResetError("the remote end closed the connection without an answer")
                fields = status_line.decode("latin-1").rstrip("\r\n").split(" ", 2)
                if len(fields) < 2 or not fields[0].startswith("HTTP/1.") or not (
                        len(fields[1]) == 3 and fields[1].isdigit()):
                    raise ConnectionError("not an HTTP/1.x status line: %r" % (status_line[:80],))
                status, reason = int(fields[1]), (fields[2] if len(fields) > 2 else "")
                answer_headers = {}
                for _ in range(MAX_HEADERS + 1):
                    line = _line(reader, "header line")
                    if line in (b"\r\n", b"\n", b""):
                        break
                    name, sep, value = line.decode("latin-1").partition(":")
                    if not sep:
                        raise ConnectionError("a header line without a colon: %r" % (line[:80],))
                    answer_headers[name.strip().lower()] = value.strip()
                else:
                    raise ConnectionError("the answer has over %d header lines" % MAX_HEADERS)
                if status >= 200:
                    break  # 1xx (100 Continue) is followed by the real answer, as in http.client
            if method == "HEAD" or status in (204, 304):
                return status, reason, b""
            return status, reason, _read_body(reader, answer_headers, limit)


def _fetch_urllib(method: str, url: str, body, headers, timeout: float, limit: int):
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, data=body, headers=dict(headers or {}), method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return resp.status, resp.reason, resp.read(limit)
    except urllib.error.HTTPError as exc:
        try:
            data = exc.read(limit)
        except OSError:
            data = b""
        return exc.code, str(exc.reason), data
    except urllib.error.URLError as exc:
        reason = exc.reason
        raise reason if isinstance(reason, OSError) else ConnectionError(str(reason))


def post_json(url: str, payload, timeout: float, headers=None, limit: int = 1 << 20) -> bytes:
    """POST a JSON document; the answer's body, or HTTPStatusError for a 4xx/5xx answer."""
    import json

    status, reason, body = fetch("POST", url, json.dumps(payload).encode(),
                                 dict({"Content-Type": "application/json"}, **(headers or {})), timeout, limit)
    if status >= 400:
        raise HTTPStatusError(status, reason, body)
    return body
