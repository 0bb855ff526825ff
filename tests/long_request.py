"""The one way the tests ask a real server for a request that keeps running while they do something else."""

from __future__ import annotations


def one_block(tokens: int) -> dict:
    """Knobs of a sampled request of `tokens` forward passes: one block of the whole canvas, one token a step.
    Early exit waits for every position before the first end-of-text token, so the request runs to the end of
    its block; in the embedded model's declared blocks of 8 its short answer would end it after 8 to 16 steps
    (well under 0.2 s on the 2-core CPU, too short for a test that needs it still running)."""
    return {"max_tokens": tokens, "num_denoising_steps": tokens, "block_length": tokens, "temperature": 1.0, "seed": 7}
