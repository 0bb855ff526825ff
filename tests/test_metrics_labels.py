"""BentoML's request metrics are labelled by route (server/metrics_labels.py): the label set stays as small as
the route table whatever paths clients send, and the app below still sees the request's own path. The real
`bentoml serve` is checked in tests/test_http_server.py (`test_metrics_label_routes_not_raw_paths`)."""

from __future__ import annotations

import asyncio

import pytest

from server.metrics_labels import UNMATCHED, EndpointLabels, route_labelled


@pytest.fixture(scope="module")
def labels() -> EndpointLabels:
    import service

    return EndpointLabels(service.app.routes, own_paths=service.native_routes)


@pytest.mark.parametrize(
    ("path", "label"),
    [
        ("/v1/chat/completions", "/v1/chat/completions"),
        ("/v1/completions", "/v1/completions"),
        ("/v1/models", "/v1/models"),
        ("/v1/models/tiny-llada-chat", "/v1/models/{model:path}"),
        ("/v1/models/\x06(\U000e7a8a\x06", "/v1/models/{model:path}"),  # a fuzzer's model id
        ("/v1/embeddings", "/v1/{path:path}"),  # the OpenAI-shaped 404 for the rest of /v1
        ("/", "/"),
        ("/playground", "/playground"),
        ("/playground/playground.js", "/playground/{asset}"),
        ("/docs/assets/swagger-ui.css", "/docs/assets/{name}"),
        ("/bentoml", "/bentoml"),
        ("/readyz", "/readyz"),
        ("/metrics", "/metrics"),
        ("/generate", "/generate"),
        ("/generate_stream", "/generate_stream"),
        ("/static_content/index.css", "/static_content/{path}"),
        ("/wp-login.php", UNMATCHED),
        ("/schemathesis-probe\\\x1b\x01", UNMATCHED),
    ],
)
def test_a_path_is_labelled_by_the_route_that_serves_it(labels, path, label):
    assert labels(path) == label


class RecordingMetrics:
    """Records the label as BentoML's traffic middleware does (from `scope["path"]`), then calls the app."""

    def __init__(self, app, namespace="bentoml_service", skip_paths=()):
        self.app = app
        self.recorded: list[str] = []

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            self.recorded.append(scope["path"])
        await self.app(scope, receive, send)


def test_the_metrics_see_the_label_and_the_app_sees_the_request(labels):
    seen: list[dict] = []

    async def app(scope, receive, send):
        seen.append(scope)

    middleware = route_labelled(RecordingMetrics, labels)(app, namespace="bentoml_service", skip_paths=[])
    for path in ("/v1/models/tiny-llada-chat", "/v1/chat/completions", "/nothing\x1b"):
        scope = {"type": "http", "path": path, "method": "GET"}
        asyncio.run(middleware(scope, None, None))
        assert seen[-1] is scope  # the request's own scope, not a copy
    assert middleware.recorded == ["/v1/models/{model:path}", "/v1/chat/completions", UNMATCHED]
    asyncio.run(middleware({"type": "lifespan"}, None, None))  # not a request: passed through as it is
    assert seen[-1] == {"type": "lifespan"}


def test_route_labels_are_installed_in_bentomls_place_or_fail_loudly(monkeypatch, labels):
    from bentoml._internal.server.http import instruments

    import service  # noqa: F401 - importing the service installs them
    from server.metrics_labels import install_route_labels

    installed = instruments.RunnerTrafficMetricsMiddleware
    assert installed.__name__ == "RouteLabelledMetrics"
    install_route_labels(labels)  # a second install wraps BentoML's class again, not the first wrapper
    assert instruments.RunnerTrafficMetricsMiddleware.labelled_base is installed.labelled_base

    class Reshaped:  # what a BentoML release that changed the internal might ship
        def __init__(self, app, *, prefix): ...

    monkeypatch.setattr(instruments, "RunnerTrafficMetricsMiddleware", Reshaped)
    with pytest.raises(RuntimeError, match="RouteLabelledMetrics cannot replace it"):
        install_route_labels(labels)
