"""The `endpoint` label of BentoML's HTTP metrics: the route that served a request, never its raw path.

BentoML's traffic middleware (the outermost layer of its app) labels `bentoml_service_request_*` with the
request's path as sent. Any client then adds series at will: every distinct path, a 404 scan or a fuzzer's
`/v1/models/<random bytes>`, is a new series kept for the worker's life (memory and /metrics grow without
bound), and its bytes, control characters included, are copied into /metrics. A browser that opens /metrics
after such a request sniffs those bytes as binary and downloads the page instead of showing it.

`EndpointLabels` maps a path to the template of the route that serves it (`/v1/models/{model:path}`), keeps
the paths BentoML serves itself as they are, and maps anything else to `UNMATCHED`, so the label set is as
small as the route table. `install_route_labels` makes BentoML build its middleware with that label, replacing
the class in BentoML's internal module (server/bentoml_internals.py: it refuses to start if that class has
moved or changed shape).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from starlette.routing import BaseRoute, Match, Mount
from starlette.types import ASGIApp, Receive, Scope, Send

from server.bentoml_internals import bentoml_class

# Every path that no route serves (a 404) shares this label.
UNMATCHED = "(unmatched)"
# What BentoML's host app serves itself, before the mounted app: its probes, metrics and schemas.
BENTOML_PATHS = frozenset({"/livez", "/healthz", "/readyz", "/metrics", "/docs.json", "/schema.json"})
# BentoML's own static files (its explorer's assets), one label for the folder.
BENTOML_STATIC = "/static_content"
# The scope key under which the labelled copy of a scope carries the original (see RouteLabelledMetrics).
ORIGINAL_SCOPE = "dllm.original_scope"


def flat_routes(routes: Iterable[BaseRoute]) -> Iterator[BaseRoute]:
    """The routes a router tries, with included routers opened up. FastAPI ≥ 0.16x keeps an included router
    as one lazy entry (`original_router`) where earlier versions copied its routes in; routers here are
    included without a prefix, so the routes inside already carry their full paths."""
    for route in routes:
        included = getattr(route, "original_router", None)
        if included is not None:
            yield from flat_routes(included.routes)
        else:
            yield route


class EndpointLabels:
    """Path -> the `endpoint` label: a route's template, one of BentoML's own paths, or `UNMATCHED`."""

    def __init__(self, routes: Iterable[BaseRoute], own_paths: Iterable[str] = ()):
        self.routes = list(flat_routes(routes))
        self.exact = BENTOML_PATHS | frozenset(own_paths)

    def __call__(self, path: str) -> str:
        if path in self.exact:
            return path
        if path.startswith(BENTOML_STATIC + "/"):
            return BENTOML_STATIC + "/{path}"
        scope = {"type": "http", "path": path, "root_path": "", "method": "GET"}
        for route in self.routes:
            match, _ = route.matches(scope)
            if match is not Match.NONE:  # PARTIAL: the path is served, with another method (a 405)
                return f"{route.path}/{{path}}" if isinstance(route, Mount) else route.path
        return UNMATCHED


def route_labelled(base: type, labels: EndpointLabels) -> type:
    """BentoML's traffic-metrics middleware `base`, recording `labels(path)` where it recorded the path."""

    class RouteLabelledMetrics(base):  # type: ignore[misc, valid-type]
        # `base` records the label from `scope["path"]` and then calls the app with the scope it was given: it
        # gets a copy carrying the label, and the app below gets the request's own scope back.
        def __init__(self, app: ASGIApp, namespace: str, skip_paths: list[str]) -> None:
            async def with_original_scope(scope: Scope, receive: Receive, send: Send) -> None:
                await app(scope.get(ORIGINAL_SCOPE, scope), receive, send)

            super().__init__(with_original_scope, namespace=namespace, skip_paths=skip_paths)

        async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] in ("http", "websocket"):
                label = labels(scope["path"])
                if label != scope["path"]:
                    scope = {**scope, "path": label, ORIGINAL_SCOPE: scope}
            await super().__call__(scope, receive, send)

    return RouteLabelledMetrics


def install_route_labels(labels: EndpointLabels) -> None:
    """Make BentoML build its traffic-metrics middleware with route labels. BentoML 1.4 imports
    `bentoml._internal.server.http.instruments.RunnerTrafficMetricsMiddleware` when it creates the app (after
    the service module is imported) and constructs it as `(app, namespace=..., skip_paths=...)`."""
    instruments, current = bentoml_class(
        "bentoml._internal.server.http.instruments", "RunnerTrafficMetricsMiddleware",
        ["app", "namespace", "skip_paths"], "RouteLabelledMetrics", "server/metrics_labels.py",
    )  # fmt: skip
    base = getattr(current, "labelled_base", current)  # installing twice wraps BentoML's class, not ours
    labelled = route_labelled(base, labels)
    labelled.labelled_base = base
    # Replacing the class is the point: type checkers object to assigning to a class name.
    instruments.RunnerTrafficMetricsMiddleware = labelled  # type: ignore[misc]
