"""The host side's HTTP client (deploy/remote/http_plain.py) against answers written byte by byte.

Generated well-formed answers (status, headers, Content-Length / chunked / to the end, bodies of
every size around the limit) must read exactly as urllib.request (http.client) reads them; broken
answers (cut bodies, bad status lines and chunk sizes, endless headers) must be an OSError naming
what was wrong, never a made-up answer; what the client sends is checked on the wire.
"""

from __future__ import annotations

import random
import socket
import threading
import urllib.error
import urllib.request

import pytest

from deploy.remote import http_plain

TIMEOUT = 5.0


class RawServer:
    """Answers every connection on 127.0.0.1 with ``answer`` bytes, records each request."""

    def __init__(self, answer: bytes = b"", hold: bool = False) -> None:
        self.answer, self.hold, self.requests = answer, hold, []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = "http://127.0.0.1:%d" % self.sock.getsockname()[1]
        self.release = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(TIMEOUT)
                data = b""
                try:
                    while b"\r\n\r\n" not in data:
                        chunk = conn.recv(65536)
                        if not chunk:
                            break
                        data += chunk
                    head, _, body = data.partition(b"\r\n\r\n")
                    length = [int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:")]
                    while length and len(body) < length[0]:
                        body += conn.recv(65536)
                    self.requests.append((head.decode("latin-1"), body))
                    if self.hold:
                        self.release.wait(TIMEOUT)
                        continue
                    conn.sendall(self.answer)
                except OSError:
                    pass

    def close(self) -> None:
        self.release.set()
        self.sock.close()


@pytest.fixture
def server():
    servers = []

    def make(answer: bytes = b"", hold: bool = False) -> RawServer:
        servers.append(RawServer(answer, hold))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


def urllib_read(url: str, limit: int):
    try:
        with urllib.request.urlopen(urllib.request.Request(url), timeout=TIMEOUT) as resp:
            return resp.status, resp.read(limit)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(limit)


def chunked(body: bytes, rng: random.Random) -> bytes:
    out, i = b"", 0
    while i < len(body):
        n = rng.randint(1, max(1, len(body) // 3 + 1))
        ext = b";name=value" if rng.random() < 0.2 else b""
        out += b"%x%s\r\n%s\r\n" % (len(body[i:i + n]), ext, body[i:i + n])
        i += n
    return out + b"0\r\n\r\n"


def generated_answers(count: int):
    rng = random.Random("deployctl-http-plain")
    statuses = (200, 201, 202, 400, 401, 404, 409, 422, 500, 502, 503)
    for index in range(count):
        status = rng.choice(statuses)
        size = rng.choice((0, 1, 299, 300, 301, 1000, 4096, 70000))
        body = bytes(rng.randrange(256) for _ in range(size))
        framing = rng.choice(("length", "chunked", "close"))
        headers = [b"Server: raw", b"Content-Type: application/json"]
        if rng.random() < 0.3:
            headers.append(b"X-Long: " + b"a" * rng.randint(100, 8000))
        if framing == "length":
            headers.append(b"Content-Length: %d" % size)
            payload = body
        elif framing == "chunked":
            headers.append(b"Transfer-Encoding: chunked")
            payload = chunked(body, rng)
        else:
            headers.append(b"Connection: close")
            payload = body
        limit = rng.choice((300, 1 << 20))
        answer = b"HTTP/1.1 %d Reason Words\r\n%s\r\n\r\n%s" % (status, b"\r\n".join(headers), payload)
        yield pytest.param(answer, limit, id="%d-%d-%s-%d" % (index, status, framing, size))


@pytest.mark.parametrize("answer, limit", list(generated_answers(40)))
def test_a_well_formed_answer_reads_as_urllib_reads_it(server, answer, limit):
    srv = server(answer)
    expected = urllib_read(srv.url + "/x", limit)
    status, _, body = http_plain.fetch("GET", srv.url + "/x", timeout=TIMEOUT, limit=limit)
    assert (status, body) == expected


def test_an_interim_100_continue_is_skipped(server):
    srv = server(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
    assert http_plain.fetch("GET", srv.url) == (200, "OK", b"ok")


BROKEN = {
    "empty": b"",
    "not-http": b"SSH-2.0-OpenSSH_9.2\r\n",
    "http-2-line": b"HTTP/2 200 OK\r\n\r\n",
    "status-not-3-digits": b"HTTP/1.1 20 OK\r\n\r\n",
    "status-letters": b"HTTP/1.1 2OO OK\r\n\r\n",
    "cut-body": b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc",
    "negative-length": b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\nabc",
    "word-length": b"HTTP/1.1 200 OK\r\nContent-Length: ten\r\n\r\nabc",
    "bad-chunk-size": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
    "cut-chunk": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nabc",
    "header-without-colon": b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
    "endless-headers": b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * 200 + b"\r\n",
    "endless-line": b"HTTP/1.1 200 OK\r\nX: " + b"y" * 70000 + b"\r\n\r\n",
    "endless-status-line": b"HTTP/1.1 200 " + b"O" * 70000 + b"\r\n\r\n",
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_a_broken_answer_is_an_error_not_an_answer(server, name):
    srv = server(BROKEN[name])
    with pytest.raises(OSError) as info:
        http_plain.fetch("GET", srv.url, timeout=TIMEOUT)
    assert str(info.value)


def test_nothing_listening_is_connection_refused():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    with pytest.raises(ConnectionRefusedError):
        http_plain.fetch("GET", "http://127.0.0.1:%d/health" % port, timeout=TIMEOUT)


def test_a_silent_server_times_out(server):
    srv = server(hold=True)
    with pytest.raises(OSError) as info:
        http_plain.fetch("GET", srv.url, timeout=0.3)
    assert "timed out" in str(info.value)


@pytest.mark.parametrize("url", ["ftp://127.0.0.1/", "127.0.0.1:80/", "http://", "http://127.0.0.1:99999/",
                                 "http://127.0.0.1:port/", "file:///etc/passwd", ""])
def test_what_is_not_an_http_url_is_a_value_error(url):
    with pytest.raises(ValueError):
        http_plain.fetch("GET", url, timeout=TIMEOUT)


@pytest.mark.parametrize("name, value", [("X-Key", "a\r\nInjected: 1"), ("X-Key", "a\nb"), ("Bad:Name", "v"),
                                         ("", "v"), ("X\r\nY", "v"), ("X-Key", "a\0b")])
def test_a_header_cannot_inject_lines(server, name, value):
    srv = server(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
    with pytest.raises(ValueError):
        http_plain.fetch("GET", srv.url, headers={name: value}, timeout=TIMEOUT)
    assert srv.requests == []


def test_what_goes_on_the_wire(server):
    srv = server(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
    assert http_plain.post_json(srv.url + "/generate?x=1", {"text": "hi"}, TIMEOUT,
                                {"Authorization": "Bearer k"}) == b"{}"
    http_plain.fetch("DELETE", srv.url + "/workers/a%20b", timeout=TIMEOUT)
    http_plain.fetch("POST", srv.url + "/flush", timeout=TIMEOUT)
    (post, body), (delete, _), (empty_post, _) = srv.requests
    lines = post.split("\r\n")
    assert lines[0] == "POST /generate?x=1 HTTP/1.1"
    assert "Host: " + srv.url[len("http://"):] in lines and "Connection: close" in lines
    assert "Authorization: Bearer k" in lines and "Content-Type: application/json" in lines
    assert "Content-Length: %d" % len(body) in lines and body == b'{"text": "hi"}'
    assert delete.split("\r\n")[0] == "DELETE /workers/a%20b HTTP/1.1"
    assert not any(line.lower().startswith("content-length") for line in delete.split("\r\n"))
    assert "Content-Length: 0" in empty_post.split("\r\n")  # as http.client sends a bodiless POST


def test_post_json_raises_the_status_of_an_error_answer(server):
    srv = server(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 5\r\n\r\nnope!")
    with pytest.raises(http_plain.HTTPStatusError) as info:
        http_plain.post_json(srv.url + "/generate", {}, TIMEOUT)
    assert (info.value.code, info.value.reason, info.value.body) == (401, "Unauthorized", b"nope!")
    assert isinstance(info.value, OSError)


def test_an_ipv6_loopback_url():
    try:
        sock = socket.socket(socket.AF_INET6)
        sock.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    sock.listen(1)
    port = sock.getsockname()[1]

    def answer():
        conn, _ = sock.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nv6")

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        assert http_plain.fetch("GET", "http://[::1]:%d/" % port, timeout=TIMEOUT) == (200, "OK", b"v6")
    finally:
        thread.join(TIMEOUT)
        sock.close()
