#!/usr/bin/env python3
"""The HTTP server's floor for the benchmarks: the smallest ASGI app on hypercorn's trio worker
(the server `zvfs serve` runs on, with its access log off) answering a GET of a file of a
directory with its bytes (no ranges, no validators, no tree: one open, read and close a file).
What any app on that server costs; `zvfs serve` can be no faster.

    floorhttp.py ROOT PORT     # serves http://127.0.0.1:PORT/ until SIGTERM/SIGINT
"""

import os
import sys

import trio
from hypercorn.config import Config
from hypercorn.trio import serve


def app_of(root: str):
    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        path = os.path.normpath(scope["path"]).lstrip("/")
        try:
            with open(os.path.join(root, path), "rb") as f:
                body, status = f.read(), 200
        except OSError:
            body, status = b"", 404
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-length", str(len(body)).encode()), (b"content-type", b"application/octet-stream")]})
        await send({"type": "http.response.body", "body": body})
    return app


if __name__ == "__main__":
    root, port = sys.argv[1], int(sys.argv[2])
    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.accesslog = None
    trio.run(serve, app_of(root), config)
