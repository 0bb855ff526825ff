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


def named_sse_events(text: str) -> list[tuple[str | None, str]]:
    """(event name, data) of each event of a BentoML native stream (server/native.py): raw text data, an
    optional `event:` line, multi-line data joined with newlines."""
    events = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        name, data = None, []
        for line in block.split("\n"):
            if line.startswith("event: "):
                name = line[len("event: ") :]
            else:
                assert line.startswith("data: "), block
                data.append(line[len("data: ") :])
        events.append((name, "\n".join(data)))
    return events
