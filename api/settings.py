"""What the app is configured with: `create_app(settings)` takes them, and the routes read them from
`app.state.settings`; the app itself never reads the environment.

The host reads them once, at startup (server/settings.py: DLLM_MAX_REQUEST_BYTES, DLLM_API_KEY), so a
new key or limit takes a restart, as every other setting does.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

# A LLaDA-8B prompt fits in 4,096 tokens, a few hundred KB of JSON at most: a bigger body cannot be served,
# and reading and tokenizing it would only cost time.
DEFAULT_MAX_REQUEST_BYTES = 2 * 2**20


@dataclass(frozen=True)
class ApiSettings:
    # A request body larger than this is a 413, refused before it is buffered or parsed.
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    # None: /v1 is open. Otherwise every /v1 request needs `Authorization: Bearer <key>`. Kept out of the
    # repr, so that logging the settings never logs the key.
    api_key: str | None = field(default=None, repr=False)


def key_matches(authorization: str | None, expected: str) -> bool:
    """Whether an Authorization header carries `Bearer <expected>`; the comparison takes the same time
    whatever the header holds (no timing hint about the key). One definition for /v1 and BentoML's routes."""
    scheme, _, token = (authorization or "").partition(" ")
    return scheme.lower() == "bearer" and secrets.compare_digest(token.strip().encode(), expected.encode())
