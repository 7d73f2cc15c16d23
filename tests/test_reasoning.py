"""The reasoning split (ramforge.generation.reasoning): gpt-oss's harmony channels into thinking and answer, the
same however the text arrives in pieces, and wired into Model's chat completions."""
from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from ramforge.generation.api import Model, Response
from ramforge.generation.reasoning import Harmony, parser_for, split

ANALYSIS, FINAL = "The user asks 2+2. <b>easy</b> a<|b", "It is **4**. (<|)"
TWO = f"<|channel|>analysis<|message|>{ANALYSIS}<|end|><|start|>assistant<|channel|>final<|message|>{FINAL}"


def test_analysis_is_thinking_final_is_content():
    assert split(TWO, Harmony()) == (ANALYSIS, FINAL)


def test_commentary_preamble_is_content_and_call_ends_a_body():
    text = ("<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>commentary<|message|>Let me "
            "check.<|end|><|start|>assistant<|channel|>final<|message|>Done.<|return|>")
    assert split(text, Harmony()) == ("think", "Let me check.Done.")


def test_output_without_a_header_is_all_content():
    assert split("Plain answer <|end|> with a marker", Harmony()) == ("", "Plain answer <|end|> with a marker")
    assert split("<|not a header at all" + "x" * 300, Harmony())[1].startswith("<|not a header")


def test_unfinished_output_keeps_its_body_and_drops_a_partial_header():
    assert split("<|channel|>analysis<|message|>half a thou", Harmony()) == ("half a thou", "")
    assert split(f"{TWO}<|end|><|start|>assis", Harmony()) == (ANALYSIS, FINAL)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, len(TWO)), max_size=12))
def test_any_split_into_pieces_gives_the_same_result(cuts):
    h, thinking, content = Harmony(), "", ""
    bounds = [0, *sorted(cuts), len(TWO)]
    for a, b in zip(bounds, bounds[1:]):
        t, c = h.feed(TWO[a:b])
        thinking, content = thinking + t, content + c
    t, c = h.flush()
    assert (thinking + t, content + c) == (ANALYSIS, FINAL)


def test_only_a_harmony_template_gets_a_parser():
    assert isinstance(parser_for("...<|start|>assistant<|channel|>final<|message|>..."), Harmony)
    assert parser_for("{{ '<|im_start|>' }}") is None and parser_for(None) is None


def _stub(template: str):
    return SimpleNamespace(chat_template=lambda: SimpleNamespace(text=template))


def test_model_chat_moves_reasoning_to_thinking():
    pieces = [TWO[:20], TWO[20:61], TWO[61:]]
    rs = [Response(p, 1) for p in pieces[:-1]] + [Response(pieces[-1], None, done=True, finish_reason="stop")]
    out = list(Model.split_reasoning(_stub("<|channel|> <|message|>"), iter(rs)))
    assert "".join(r.thinking for r in out) == ANALYSIS and "".join(r.text for r in out) == FINAL
    plain = [Response("a<|channel|>b", None, done=True)]
    assert [(r.thinking, r.text) for r in Model.split_reasoning(_stub("{{ x }}"), iter(plain))] == [("", "a<|channel|>b")]
