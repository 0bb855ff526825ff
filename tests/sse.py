"""The one server-sent-events parser the tests share."""

from __future__ import annotations

import json


def sse_events(text: str) -> list:
    """`data:` payloads of an SSE body, parsed (the final "[DONE]" stays a string).

    Strict on purpose: every event must be a single `data: ` line followed by a blank line, which is
    all the server sends.
    """
    events = []
    for block in text.split("\n\n"):
        if block.strip():
            assert block.startswith("data: ") and "\n" not in block, block
            payload = block[len("data: ") :]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events
