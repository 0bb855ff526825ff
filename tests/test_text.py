"""Append-only streamed text: UTF-8 hold-back and stop strings."""

from engine.text import IncrementalText, cut_at_stop


def byte_decoder(pieces):
    """A decoder over byte pieces, like byte-level BPE: incomplete UTF-8 decodes to U+FFFD."""
    return lambda ids: b"".join(pieces[i] for i in ids).decode("utf-8", errors="replace")


def test_incomplete_character_is_held_back():
    pieces = [b"caf", "é".encode()[:1], "é".encode()[1:], b"!"]
    text = IncrementalText(byte_decoder(pieces))
    assert text.update([0], complete=False) == "caf"
    assert text.update([0, 1], complete=False) == ""
    assert text.update([0, 1, 2], complete=False) == "é"
    assert text.update([0, 1, 2, 3], complete=True) == "!"
    assert text.emitted == "café!"


def test_possible_stop_prefix_is_held_back_until_decided():
    pieces = [b"one ", b"#", b"#", b"x", b"#", b"##", b" two"]
    text = IncrementalText(byte_decoder(pieces), stop=["###"])
    assert text.update([0], complete=False) == "one "
    assert text.update([0, 1], complete=False) == ""  # "#" could start "###"
    assert text.update([0, 1, 2, 3], complete=False) == "##x"  # it did not
    assert not text.stopped
    assert text.update([0, 1, 2, 3, 4, 5], complete=False) == ""
    assert text.stopped and text.emitted == "one ##x"


def test_completion_flushes_everything_held():
    text = IncrementalText(byte_decoder([b"ab", b"#"]), stop=["##"])
    assert text.update([0, 1], complete=False) == "ab"
    assert text.update([0, 1], complete=True) == "#"


def test_cut_at_earliest_stop():
    assert cut_at_stop("a STOP b END", ["END", "STOP"]) == ("a ", True)
    assert cut_at_stop("nothing", ["x"]) == ("nothing", False)
