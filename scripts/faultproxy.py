#!/usr/bin/env python3
"""A fault-injecting HTTP proxy for chute's remote-storage tests and benchmarks.

Forwards GET and HEAD requests (HTTP/1.1, keep-alive towards the client, one upstream
connection per request) to an upstream server, and misbehaves on a fixed schedule so that
tests are reproducible:

  --delay-ms N       wait N ms before answering every request (latency injection)
  --pattern LIST     a comma-separated cycle of what to do with successive GET requests:
                       ok     forward the response as it is
                       503    answer 503 Service Unavailable
                       429    answer 429 Too Many Requests
                       cut    send the headers and half the body, then drop the connection
                       reset  drop the connection before answering
                       stall  send half the body, then hang for --stall-s seconds and drop

Requests whose path starts with /always503/ are always answered 503 (the path is otherwise
ignored): a server that never recovers. Under /get503/ the rest of the path is forwarded,
except GET requests for names ending in .tar, answered 503: a shard that opens (HEAD, index)
but never downloads. HEAD requests are otherwise always forwarded as they are.

With --complete-headers the proxy also fills gaps of an upstream's object API that clients
rely on (gcp-storage-emulator's XML API answers HEAD with 501 and GET without Last-Modified,
and ETag, all of which object_store requires): HEAD is answered with the headers of a GET,
and a missing Last-Modified or ETag (a hash of the object's path and size) is added.

Standard library only; listens on 127.0.0.1 (or --host, for a network namespace a test made
itself). Prints "listening on PORT" once ready.
"""

import argparse
import asyncio
import hashlib
import itertools
import sys


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--listen", type=int, default=0, help="port (0: any free port)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--upstream", required=True, help="host:port of the real server")
    p.add_argument("--delay-ms", type=float, default=0.0)
    p.add_argument("--pattern", default="ok")
    p.add_argument("--stall-s", type=float, default=3.0)
    p.add_argument("--port-file", help="write the port here once listening")
    p.add_argument("--complete-headers", action="store_true",
                   help="answer HEAD from a GET upstream; add Last-Modified where missing")
    return p.parse_args()


ARGS = parse_args()
UP_HOST, UP_PORT = ARGS.upstream.rsplit(":", 1)
ACTIONS = itertools.cycle([a.strip() for a in ARGS.pattern.split(",") if a.strip()])
VALID = {"ok", "503", "429", "cut", "reset", "stall"}
for a in ARGS.pattern.split(","):
    if a.strip() and a.strip() not in VALID:
        sys.exit(f"faultproxy: unknown action {a!r} in --pattern; use {sorted(VALID)}")


async def read_head(reader):
    """The request or response line and headers, or None at EOF."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    lines = head.decode("latin-1").split("\r\n")
    first, headers = lines[0], []
    for line in lines[1:]:
        if line:
            k, _, v = line.partition(":")
            headers.append((k.strip(), v.strip()))
    return first, headers


def header(headers, name):
    for k, v in headers:
        if k.lower() == name.lower():
            return v
    return None


async def fetch_upstream(method, target, headers):
    reader, writer = await asyncio.open_connection(UP_HOST, int(UP_PORT))
    keep = [(k, v) for k, v in headers if k.lower() not in ("connection", "keep-alive")]
    req = f"{method} {target} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in keep)
    writer.write((req + "Connection: close\r\n\r\n").encode("latin-1"))
    await writer.drain()
    status, rheaders = await read_head(reader)
    length = header(rheaders, "content-length")
    if method == "HEAD":
        body = b""
    elif length is not None:
        body = await reader.readexactly(int(length))
    else:
        body = await reader.read()
    writer.close()
    return status, rheaders, body


def simple(code, reason):
    body = f"{code} {reason} (faultproxy)\n".encode()
    return (
        f"HTTP/1.1 {code} {reason}\r\nContent-Length: {len(body)}\r\n"
        f"Retry-After: 0\r\nContent-Type: text/plain\r\n\r\n"
    ).encode() + body


async def handle(reader, writer):
    try:
        while True:
            req = await read_head(reader)
            if req is None:
                return
            first, headers = req
            method, target, _ = first.split(" ", 2)
            if ARGS.delay_ms:
                await asyncio.sleep(ARGS.delay_ms / 1000.0)
            if target.startswith("/always503/"):
                writer.write(simple(503, "Service Unavailable"))
                await writer.drain()
                continue
            if target.startswith("/get503/"):
                target = target[len("/get503"):]
                if method == "GET" and target.endswith(".tar"):
                    writer.write(simple(503, "Service Unavailable"))
                    await writer.drain()
                    continue
            action = next(ACTIONS) if method == "GET" else "ok"
            if action == "503":
                writer.write(simple(503, "Service Unavailable"))
                await writer.drain()
                continue
            if action == "429":
                writer.write(simple(429, "Too Many Requests"))
                await writer.drain()
                continue
            if action == "reset":
                return
            up = "GET" if ARGS.complete_headers and method == "HEAD" else method
            status, rheaders, body = await fetch_upstream(up, target, headers)
            out = [(k, v) for k, v in rheaders if k.lower() not in ("connection", "keep-alive")]
            if header(out, "content-length") is None:
                out.append(("Content-Length", str(len(body))))
            if ARGS.complete_headers:
                status = status.replace("HTTP/1.0", "HTTP/1.1", 1)
                if header(out, "last-modified") is None:
                    out.append(("Last-Modified", "Tue, 01 Dec 2026 00:00:00 GMT"))
                if header(out, "etag") is None:
                    # Stable per object: its path and whole size (a range's Content-Range).
                    size = (header(out, "content-range") or "").rpartition("/")[2] or len(body)
                    tag = hashlib.md5(f"{target} {size}".encode()).hexdigest()
                    out.append(("ETag", f'"{tag}"'))
                if method == "HEAD":
                    body = b""
            head = status + "\r\n" + "".join(f"{k}: {v}\r\n" for k, v in out) + "\r\n"
            writer.write(head.encode("latin-1"))
            if action in ("cut", "stall") and len(body) > 1:
                writer.write(body[: len(body) // 2])
                await writer.drain()
                if action == "stall":
                    await asyncio.sleep(ARGS.stall_s)
                return
            writer.write(body)
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        return
    finally:
        writer.close()


async def main():
    server = await asyncio.start_server(handle, ARGS.host, ARGS.listen)
    port = server.sockets[0].getsockname()[1]
    if ARGS.port_file:
        with open(ARGS.port_file + ".tmp", "w") as f:
            f.write(str(port))
        import os

        os.replace(ARGS.port_file + ".tmp", ARGS.port_file)
    print(f"listening on {port}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
