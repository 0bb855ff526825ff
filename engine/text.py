"""Append-only text for streaming: which part of a partly denoised canvas is final.

Diffusion commits tokens in any order, so the text a client may see is the decoded committed *prefix*
(positions 0..first mask), cut at the first EOS/EOT. Two more things are held back so that an emitted
delta never needs correcting: a trailing U+FFFD (byte-level BPE splits a multi-byte character over
tokens, and the rest may not be committed yet) and any suffix that could still grow into a stop string.

Stop strings cut the text at the earliest *start* of one in the final text, whatever order they complete
in: a completed stop only ends the request once no stop that starts earlier can still complete. So the
text depends on the canvas alone, not on how many tokens each step committed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

REPLACEMENT_CHAR = "\ufffd"


def cut_at_stop(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    """Text before the earliest stop string, and whether one was found."""
    cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


def _stop_prefix_overlap(text: str, stop: Sequence[str]) -> int:
    # The earliest position where a stop string may still begin is len(text) minus this.
    """Length of the longest suffix of `text` that is a proper prefix of some stop string."""
    longest = 0
    for s in stop:
        for size in range(min(len(s) - 1, len(text)), longest, -1):
            if text.endswith(s[:size]):
                longest = size
                break
    return longest


class IncrementalText:
    def __init__(self, decode: Callable[[list[int]], str], stop: Sequence[str] = ()):
        self._decode = decode
        self._stop = tuple(stop)
        self.emitted = ""
        self.stopped = False  # a stop string has become final: the request can end

    def update(self, final_ids: list[int], complete: bool) -> str:
        """New text made final by `final_ids` (the committed prefix before EOS/EOT).

        complete: nothing after `final_ids` can still change the text (the request is ending), so
        nothing is held back.
        """
        text = self._decode(final_ids)
        undecided = len(text)  # where a stop string may still begin: nothing past it is final
        if not complete:
            text = text.rstrip(REPLACEMENT_CHAR)
            undecided = len(text) - _stop_prefix_overlap(text, self._stop)
        cut, found = cut_at_stop(text, self._stop)  # no stop strings: (text, False)
        self.stopped = found and len(cut) <= undecided
        text = cut if self.stopped else text[:undecided]
        if not text.startswith(self.emitted):
            # Byte-level decoding only ever extends; keep the stream append-only regardless.
            return ""
        delta = text[len(self.emitted) :]
        self.emitted = text
        return delta
