"""The HTTP servers ``serve`` runs the app in: uvicorn, or Granian with SIGTERM routed through the drain."""

import asyncio
import logging
import math
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..extras import GRANIAN, Extra
from ..settings import Settings

APP_FACTORY = "gateway.http.app:create_app_from_env"
log = logging.getLogger("gateway")


def _run_uvicorn(settings: Settings) -> None:
    import uvicorn

    uvicorn.run(
        APP_FACTORY,
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=settings.workers,
        access_log=False,  # the gateway writes its own access lines
        log_config=None,
        timeout_graceful_shutdown=math.ceil(settings.graceful_timeout),  # whole seconds, as Granian takes it
        http="gateway.serving:OneWriteHttpToolsProtocol",  # a killed replica never leaves half an answer
    )


def _run_granian(settings: Settings) -> None:
    """Granian: a supervisor process and ``workers`` worker processes, each running the app factory.

    On SIGTERM the supervisor closes its copy of the listening socket and sends SIGTERM to every
    worker; it kills a worker that has not finished ``drain_seconds + graceful_timeout`` later.
    """
    from granian.constants import HTTPModes, Interfaces
    from granian.http import HTTP1Settings
    from granian.server import Server

    server = Server(
        "gateway.cli.servers:granian_worker_app",
        address=settings.host,
        port=settings.port,
        interface=Interfaces.ASGI,
        workers=settings.workers,
        http=HTTPModes.http1,
        # The limits on request heads, as uvicorn gets them from gateway.serving: a longer head is a 431,
        # a head not sent within header_timeout closes the connection.
        http1_settings=HTTP1Settings(
            header_read_timeout=max(1, round(settings.header_timeout * 1000)), max_buffer_size=settings.max_header_bytes
        ),
        websockets=False,
        factory=True,
        log_access=False,  # the gateway writes its own access lines
        # Granian's own lines go through the gateway's handler (JSON or text), as uvicorn's do.
        log_dictconfig={"loggers": {"_granian": {"propagate": True}, "granian.access": {"propagate": True}}},
        workers_kill_timeout=max(1, math.ceil(settings.drain_seconds + settings.graceful_timeout)),
    )
    _granian_supervisor.append(server)  # a forked worker finds it here: see granian_worker_app
    server.serve()


@dataclass(frozen=True, slots=True)
class HttpServer:
    run: Callable[[Settings], None]
    extra: Extra | None  # the pip extra it needs beyond the core


SERVERS = {"uvicorn": HttpServer(_run_uvicorn, None), "granian": HttpServer(_run_granian, GRANIAN)}


_granian_supervisor: list[Any] = []  # the supervisor's Server, as a forked worker inherits it


_early_sigterm: list[int] = []  # SIGTERMs a worker received before its event loop could act on them


def granian_worker_app() -> Any:
    """The app factory as a Granian worker calls it, with SIGTERM routed through the gateway's drain.

    A Granian worker stops serving as soon as its event loop sees SIGTERM or SIGINT (handlers added
    with ``loop.add_signal_handler`` just after this factory returns). The gateway's lifespan puts its
    drain (``/readyz`` fails, ``drain_seconds`` pass) in front of whatever Python handler SIGTERM has
    when the lifespan starts. So before the lifespan runs, SIGTERM is taken off the loop and given a
    plain handler that raises SIGINT, which the loop still answers with Granian's graceful stop: the
    drain comes first, then Granian stops accepting and finishes the requests in flight.

    A SIGTERM that comes while the worker starts would be lost: a forked worker inherits the
    supervisor's handler, which only marks the supervisor's (copied) state, and the worker would
    serve on after its siblings stopped. Such a SIGTERM, noted in that state or by this factory's
    own handler, ends the worker as soon as its loop runs, before Granian has made its server: it
    has accepted nothing, so there is nothing to drain. It exits at once rather than through
    Granian's graceful stop, which was seen to hang, under load, when asked this early.
    """
    from ..http.app import create_app_from_env
    from ..serving import StrictFraming

    signal.signal(signal.SIGTERM, lambda signum, frame: _early_sigterm.append(signum))
    _sigterm_when_the_supervisor_dies()
    app = StrictFraming(create_app_from_env())
    loop = asyncio.get_event_loop()
    loop.call_soon(_route_sigterm_through_sigint, loop)  # runs before the lifespan's first step
    return app


def _sigterm_when_the_supervisor_dies() -> None:
    """Linux: a worker whose supervisor dies, even by SIGKILL, gets SIGTERM instead of serving on as an orphan.

    (A forked worker of a supervisor that is already gone is stopped by the same check as an early SIGTERM.)
    """
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def _route_sigterm_through_sigint(loop: asyncio.AbstractEventLoop) -> None:
    if not loop.remove_signal_handler(signal.SIGTERM):
        log.warning("granian worker: no SIGTERM handler on the event loop; SIGTERM stops the worker without a drain")
        return

    def stop_granian(signum: int, frame: Any) -> None:
        os.kill(os.getpid(), signal.SIGINT)

    signal.signal(signal.SIGTERM, stop_granian)
    orphaned = any(os.getppid() != getattr(server, "pid", None) for server in _granian_supervisor)
    interrupted = any(getattr(server, "interrupt_signal", False) for server in _granian_supervisor)
    if _early_sigterm or interrupted or orphaned:
        log.info("granian worker: SIGTERM while starting, or its supervisor is gone; exiting")
        logging.shutdown()
        os._exit(0)
