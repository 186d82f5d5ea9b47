"""Incremental detokenization (UTF-8 split across byte-level BPE tokens) and
stop strings across token boundaries."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from gateway.detokenizer import IncrementalDetokenizer, StopStringMatcher
from gateway.tokenizer import TextTokenizer
from tests.gateway.fake_dataplane import EOS, build_metaspace_tokenizer


@pytest.fixture(scope="module")
def text_tokenizer(tokenizer) -> TextTokenizer:
    return TextTokenizer.from_json(tokenizer.to_str())


def stream_text(tok: TextTokenizer, ids: list[int], chunk: int = 1) -> list[str]:
    detok = IncrementalDetokenizer(tok)
    pieces = [detok.push(ids[i : i + chunk]) for i in range(0, len(ids), chunk)]
    pieces.append(detok.flush())
    return pieces


def test_multibyte_characters_split_across_tokens(text_tokenizer):
    text = "日本語 🙂 é, Hello world"
    ids = text_tokenizer.encode(text)
    assert len(ids) > len(text)  # some characters really span several tokens
    pieces = stream_text(text_tokenizer, ids)
    assert "".join(pieces) == text
    assert all("\ufffd" not in piece for piece in pieces)
    # The three byte tokens of "日" give nothing, nothing, then the character.
    assert pieces[:3] == ["", "", "日"]


def test_incomplete_character_is_held_then_flushed(text_tokenizer):
    ids = text_tokenizer.encode("a🙂")
    detok = IncrementalDetokenizer(text_tokenizer)
    assert ids[0] == text_tokenizer.encode("a")[0]
    assert detok.push(ids[:1]) == "a"
    assert detok.push(ids[1:-1]) == ""  # 3 of the emoji's 4 bytes: held
    assert detok.flush() == "\ufffd"  # cut inside a character: the end shows it


def test_special_tokens_are_not_text(text_tokenizer):
    eos = text_tokenizer.token_id(EOS)
    ids = text_tokenizer.encode("Hello world")
    assert "".join(stream_text(text_tokenizer, [*ids, eos])) == "Hello world"


def test_special_token_strings_in_text_encode_as_the_special_token(text_tokenizer):
    # The chat template's turn markers are text that must become their
    # special ids, so a message holding "<|end|>" gets the control token too
    # (as transformers and vLLM tokenize by default), and streamed output
    # skips it like any special token.
    end = text_tokenizer.token_id("<|end|>")
    assert end is not None and text_tokenizer.encode("a<|end|>b")[1] == end
    assert "".join(stream_text(text_tokenizer, text_tokenizer.encode("a<|end|>b"))) == "ab"


@settings(max_examples=60, deadline=None)
@given(text=st.text(max_size=40), chunk=st.integers(min_value=1, max_value=4))
def test_round_trip_any_text_any_chunking(tokenizer, text, chunk):
    tok = TextTokenizer.from_json(tokenizer.to_str())
    # text holding a special token's string is not plain text (test above)
    assume(not any(t.content in text for t in tokenizer.get_added_tokens_decoder().values() if t.special))
    pieces = stream_text(tok, tok.encode(text), chunk)
    assert "".join(pieces) == text
    assert all("\ufffd" not in piece for piece in pieces[:-1]) or "\ufffd" in text


def test_stop_string_split_over_pushes():
    matcher = StopStringMatcher(["o w"])
    assert matcher.push("Hel") == ("Hel", False)
    assert matcher.push("lo") == ("l", False)  # "o" might start "o w"
    assert matcher.push(" ") == ("", False)  # "o " too
    assert matcher.push("wor") == ("", True)  # cut before the stop string
    with pytest.raises(RuntimeError):
        matcher.push("x")


def test_held_text_is_released_when_disproved_or_at_end():
    matcher = StopStringMatcher(["abc"])
    assert matcher.push("xxab") == ("xx", False)
    assert matcher.push("d") == ("abd", False)
    assert matcher.push("a") == ("", False)
    assert matcher.flush() == "a"


def test_first_completed_stop_string_wins():
    # "cd" is complete one character before "bcde": a token-by-token stream
    # stops there, so a single push must cut there too.
    assert StopStringMatcher(["cd", "bcde"]).push("abcdef") == ("ab", True)
    assert StopStringMatcher(["bcd", "abcd"]).push("xabcd") == ("x", True)  # same end: the longer


def test_no_stop_strings_passes_through():
    matcher = StopStringMatcher([])
    assert matcher.push("anything") == ("anything", False)
    assert matcher.flush() == ""


def test_stop_string_across_token_boundaries(text_tokenizer):
    ids = text_tokenizer.encode("one two three four")
    detok = IncrementalDetokenizer(text_tokenizer)
    matcher = StopStringMatcher(["wo th"])
    emitted = ""
    for token in ids:
        text, matched = matcher.push(detok.push([token]))
        emitted += text
        assert "one t".startswith(emitted)  # never ahead of the cut
        if matched:
            break
    assert matched and emitted == "one t"


@settings(max_examples=150, deadline=None)
@given(
    text=st.text(alphabet="abc ", max_size=30),
    stops=st.lists(st.text(alphabet="abc ", min_size=1, max_size=4), max_size=3),
    cuts=st.lists(st.integers(min_value=0, max_value=30), max_size=8),
)
def test_matcher_cuts_at_first_completed_stop_whatever_the_split(text, stops, cuts):
    found = [(i + len(s), i) for s, i in ((s, text.find(s)) for s in stops) if i >= 0]
    expected = text[: min(found)[1]] if found else text
    matcher = StopStringMatcher(stops)
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    emitted, matched = "", False
    for start, end in zip(bounds, bounds[1:]):
        piece, matched = matcher.push(text[start:end])
        emitted += piece
        assert expected.startswith(emitted)  # nothing that may belong to a stop string
        if matched:
            break
    if not matched:
        emitted += matcher.flush()
    assert emitted == expected
    assert matched == bool(found)


def test_context_tokens_give_the_first_new_token_its_leading_space():
    tok = TextTokenizer(build_metaspace_tokenizer())
    hello, world, again = tok.encode("Hello world again")
    assert IncrementalDetokenizer(tok).push([world]) == "world"  # a reply starts fresh
    continued = IncrementalDetokenizer(tok, context=[hello])
    pieces = [continued.push([world]), continued.push([again]), continued.flush()]
    assert pieces == [" world", " again", ""]  # the context itself is never returned


def test_context_contract_on_byte_level_text(text_tokenizer):
    ids = text_tokenizer.encode("Hello 日本語 world")
    for cut in range(1, len(ids)):
        detok = IncrementalDetokenizer(text_tokenizer, context=ids[:cut])
        pieces = [detok.push([token]) for token in ids[cut:]] + [detok.flush()]
        whole, context = text_tokenizer.decode(ids), text_tokenizer.decode(ids[:cut])
        if "\ufffd" not in context:  # a context cut inside a character has no text of its own
            assert "".join(pieces) == whole[len(context) :]
