"""The shared stop-sequence matcher and incremental detokeniser, piece by piece."""

from greenroom.engines.text.detokenize import IncrementalDetokenizer
from greenroom.engines.text.stops import StopMatcher


def feed_all(stops, pieces):
    m = StopMatcher(stops)
    out = "".join(m.feed(p) for p in pieces)
    if m.matched is None:
        out += m.flush()
    return out, m.matched


def test_no_stops_passes_text_through():
    assert feed_all([], ["ab", "cd"]) == ("abcd", None)


def test_stop_inside_one_piece():
    assert feed_all(["END"], ["abcENDdef"]) == ("abc", "END")


def test_stop_spanning_pieces():
    assert feed_all(["STOP"], ["hello S", "T", "OP more"]) == ("hello ", "STOP")


def test_partial_prefix_released_when_it_cannot_match():
    m = StopMatcher(["STOP"])
    assert m.feed("aST") == "a"  # "ST" might begin STOP
    assert m.feed("x") == "STx"
    assert m.matched is None


def test_earliest_of_several_stops_wins():
    assert feed_all(["bb", "a"], ["xxbb a"]) == ("xx", "bb")


def test_flush_returns_held_tail_at_end():
    assert feed_all(["STOP"], ["end ST"]) == ("end ST", None)


def test_detokenizer_waits_for_complete_characters():
    # "é" is two bytes; a byte-level vocabulary may split it across two ids
    table = {1: b"caf", 2: b"\xc3", 3: b"\xa9", 4: b"!"}

    def decode(ids):
        return b"".join(table[i] for i in ids).decode("utf-8", errors="replace")

    d = IncrementalDetokenizer(decode)
    out = [d.add(1), d.add(2), d.add(3), d.add(4)]
    assert out == ["caf", "", "é", "!"]
    assert d.flush() == ""
