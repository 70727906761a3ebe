"""The shell both servers build on: ``kunlunlab serve-retriever`` (:mod:`kunlunlab.retrieval.service`) and
``kunlunlab serve-llm`` (:mod:`kunlunlab.agent.server`).

:func:`service_app` is the FastAPI app with what they share: a lifespan that starts and stops the server's work,
``app.state.drain`` (called by :func:`make_server` at the first SIGTERM, before uvicorn waits for the requests in
flight), :class:`RequestGuard` (the bearer key and the body cap, before any body is read) and 422s in one line.
:func:`busy` is the 503 with ``Retry-After`` that the clients (:mod:`kunlunlab.http.client`) wait on;
:func:`client_gone` lets a handler drop work whose client left; :class:`ServerThread` runs an app on loopback in
a thread (notebooks, tests).

Only serving needs FastAPI and uvicorn: the clients' module imports neither.
"""
from __future__ import annotations

import hmac
import json
import threading
import time
from contextlib import asynccontextmanager, suppress
from typing import Awaitable, Callable

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from kunlunlab.http.client import free_port

CLIENT_CLOSED_REQUEST = 499  # nginx's status for a request whose client left before the answer (never seen by it)
RETRY_AFTER_S = 1  # what a busy server asks its clients to wait


class RequestGuard:
    """ASGI middleware in front of both servers: the API key, then the body size, before anything parses the body.

    ``api_key``: every path but ``open_paths`` (``/health``, for probes) needs ``Authorization: Bearer <key>``, as
    vLLM's ``--api-key``; otherwise 401. ``max_body_bytes``: a declared ``Content-Length`` above it is answered 413
    at once and the connection closed, so the body is never read (issue 44: a 40 MB body was read whole before its
    422); a body sent without a length is counted as it arrives and refused when it passes the limit."""

    def __init__(self, app, api_key: str | None = None, max_body_bytes: int | None = None,
                 open_paths: tuple[str, ...] = ("/health",)):
        self.app, self.api_key, self.max_body_bytes, self.open_paths = app, api_key, max_body_bytes, open_paths

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        if self.api_key and scope.get("path") not in self.open_paths:
            given = headers.get("authorization", "").encode()
            if not hmac.compare_digest(given, f"Bearer {self.api_key}".encode()):
                return await _refuse(send, 401, "missing or wrong API key: send the header 'Authorization: Bearer "
                                                "<key>' (the server's --api-key)", {"www-authenticate": "Bearer"})
        limit = self.max_body_bytes
        if limit is None:
            return await self.app(scope, receive, send)
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            return await _refuse(send, 413, f"request body of {declared} bytes is over the limit of {limit} bytes "
                                            "(max_body_bytes)")
        received = 0

        async def limited_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:  # FastAPI passes an HTTPException raised while it reads the body on as is
                    raise HTTPException(status_code=413, detail=f"request body is over the limit of {limit} bytes "
                                                                "(max_body_bytes)")
            return message

        await self.app(scope, limited_receive, send)


async def _refuse(send, status: int, detail: str, headers: dict[str, str] | None = None) -> None:
    """An error answered before the body is read; ``Connection: close`` so the unread body is not parsed as the
    next request."""
    body = json.dumps({"detail": detail}).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
           (b"connection", b"close")] + [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


def one_line_validation_errors(app: FastAPI) -> None:
    """A malformed body is a 422 whose ``detail`` is one line (where and what), not FastAPI's list of error
    objects: the clients print ``detail`` as it is."""

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
        where = ".".join(str(part) for part in first.get("loc", ()) if part != "body") or "body"
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        return JSONResponse({"detail": f"invalid request: {where}: {first.get('msg')}{more}"}, status_code=422)


def busy(detail: str) -> HTTPException:
    """The 503 a server answers when it cannot take the request now (queue full, starting, shutting down):
    ``Retry-After`` tells the client how long to wait before it asks again."""
    return HTTPException(status_code=503, detail=detail, headers={"Retry-After": str(RETRY_AFTER_S)})


def service_app(title: str, *, drain: Callable[[], Awaitable[None]], stop: Callable[[], Awaitable[None]],
                start: Callable[[], Awaitable[None]] | None = None, api_key: str | None = None,
                max_body_bytes: int | None = None) -> FastAPI:
    """The app both servers start from: ``start`` runs before the first request (a failure there means the server
    never starts), ``stop`` at shutdown, ``drain`` at the first SIGTERM (no new work; the waiting requests are
    answered, :func:`make_server`); then :class:`RequestGuard` and one-line 422s. The routes are the caller's."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if start is not None:
            await start()
        try:
            yield
        finally:
            await stop()

    app = FastAPI(title=title, version="1", lifespan=lifespan)
    app.state.drain = drain
    app.add_middleware(RequestGuard, api_key=api_key, max_body_bytes=max_body_bytes)
    one_line_validation_errors(app)
    return app


async def client_gone(request: Request) -> None:
    """Returns once the client has closed the connection. Call it after the body has been read: the server's
    next message is then ``http.disconnect``, sent when the socket closes, so this waits without polling."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def make_server(app, host: str, port: int, log_level: str = "info", graceful_s: float = 5.0):
    """A uvicorn server that calls ``await app.state.drain()`` (when the app has one) as soon as it is told to stop.

    uvicorn waits for the requests in flight before it runs the lifespan's shutdown, so work they wait for (a queue,
    a generation) must be stopped first, or one SIGTERM only logs "Waiting for background tasks to complete"
    (issue 44). ``graceful_s`` bounds that wait (uvicorn's ``timeout_graceful_shutdown``)."""
    import uvicorn  # deferred: only serving needs the ASGI server

    class _DrainingServer(uvicorn.Server):
        async def shutdown(self, sockets=None):
            drain = getattr(app.state, "drain", None) if hasattr(app, "state") else None
            if drain is not None:
                await drain()
            await super().shutdown(sockets=sockets)

    return _DrainingServer(uvicorn.Config(app, host=host, port=port, log_level=log_level,
                                          timeout_graceful_shutdown=graceful_s))


class ServerThread:
    """Runs ``app`` on loopback in a background thread (notebooks, tests): ``with ServerThread(app) as url:``.
    A server that does not start within ``start_timeout_s`` (its startup failed, the port is taken) raises
    ``start_error``."""

    start_error: type[Exception] = RuntimeError

    def __init__(self, app, port: int | None = None, start_timeout_s: float = 20.0):
        self.port, self.start_timeout_s = port or free_port(), start_timeout_s
        self.server = make_server(app, "127.0.0.1", self.port, log_level="warning")
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with suppress(SystemExit):  # uvicorn exits when the startup fails; start() reports it
            self.server.run()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> str:
        self.thread.start()
        deadline = time.time() + self.start_timeout_s
        while not self.server.started:
            if time.time() > deadline or not self.thread.is_alive():
                raise self.start_error(f"server did not start on port {self.port} (see the log above: a failed "
                                       "startup or a port in use)")
            time.sleep(0.02)
        return self.url

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


__all__ = ["CLIENT_CLOSED_REQUEST", "RETRY_AFTER_S", "RequestGuard", "ServerThread", "busy", "client_gone",
           "make_server", "one_line_validation_errors", "service_app"]
