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


def test_the_cut_is_the_earliest_stop_however_the_prefix_grows():
    # "id" completes before "sidH3H" when the prefix grows a character at a time, but "sidH3H" starts
    # earlier: the text must not depend on how many tokens each step commits.
    pieces = [c.encode() for c in "xsidH3H tail"]
    stops = ["sidH3H", "id"]
    for step in (1, 2, 3, len(pieces)):
        text = IncrementalText(byte_decoder(pieces), stop=stops)
        streamed = ""
        for end in range(step, len(pieces) + step, step):
            streamed += text.update(list(range(min(end, len(pieces)))), complete=False)
            if text.stopped:
                break
        assert (streamed, text.stopped) == ("x", True), step
    # When the earlier candidate fails, the later stop decides, once it is known to be the earliest.
    pieces = [c.encode() for c in "xsidQ more"]
    text = IncrementalText(byte_decoder(pieces), stop=stops)
    assert text.update([0, 1, 2, 3], complete=False) == "x"  # "sid" may still become "sidH3H"
    assert not text.stopped
    assert text.update([0, 1, 2, 3, 4], complete=False) == "s" and text.stopped


def test_a_stop_string_that_occurs_twice_cuts_at_its_first_occurrence():
    assert cut_at_stop("b-a-n-a-n-a", ["-"]) == ("b", True)
    assert cut_at_stop("x END y END", ["END", "y"]) == ("x ", True)
    text = IncrementalText(byte_decoder([c.encode() for c in "b-a-n-a-n-a"]), stop=["-"])
    assert text.update(list(range(11)), complete=False) == "b" and text.stopped


def test_a_final_stop_string_ends_the_request_at_once():
    # "ab" is complete at 1; "abc" could still complete, but it would start at 1 too, so nothing can move the
    # cut: the request stops now instead of waiting for another token.
    text = IncrementalText(byte_decoder([b"x", b"a", b"b"]), stop=["ab", "abc"])
    assert text.update([0, 1, 2], complete=False) == "x"
    assert text.stopped
