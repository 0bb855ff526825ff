"""Request ids: `X-Request-ID` is honoured when valid, otherwise a UUIDv7 is generated (ADR 005,
docs/adr/005-openai-compatible-api.md).

UUIDv7 (RFC 9562) starts with a 48-bit Unix millisecond timestamp, so ids sort by arrival time in logs.
Python's `uuid` module gains `uuid7()` only in 3.14; this is the RFC's layout with random bits after the
timestamp (method 1 of §6.2 is not needed: ordering within one millisecond does not matter here).
"""

from __future__ import annotations

import os
import time
import uuid

REQUEST_ID_HEADER = "X-Request-ID"
MAX_REQUEST_ID_LENGTH = 128


def uuid7() -> uuid.UUID:
    unix_ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")  # 80 random bits; 74 are used
    rand_a = rand >> 68 & 0xFFF  # 12 bits
    rand_b = rand & ((1 << 62) - 1)  # 62 bits
    value = (unix_ms & ((1 << 48) - 1)) << 80 | 0x7 << 76 | rand_a << 64 | 0b10 << 62 | rand_b
    return uuid.UUID(int=value)


def new_request_id() -> str:
    return str(uuid7())


def is_valid_request_id(value: str) -> bool:
    """1–128 printable ASCII characters without spaces (safe in logs, headers and completion ids)."""
    return 1 <= len(value) <= MAX_REQUEST_ID_LENGTH and all("!" <= c <= "~" for c in value)
