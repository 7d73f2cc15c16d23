"""ubatch.chunks: the passes a submission is cut into, as llama.cpp's ubatches (the arithmetic decided here)."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ramforge.engine.ubatch import chunks


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 700), past=st.integers(0, 700), batch=st.sampled_from([1, 4, 16, 64]),
       ubatch=st.sampled_from([64, 128, 512]), aligned=st.booleans(), all_logits=st.booleans())
def test_chunks_tile_the_submission_within_ubatches(n, past, batch, ubatch, aligned, all_logits):
    cs = chunks(n, past, batch, ubatch, aligned=aligned, all_logits=all_logits)
    assert [c.start for c in cs] == [0] + [c.stop for c in cs[:-1]] and cs[-1].stop == n
    for c in cs:
        assert 1 <= c.size <= batch
        if aligned:                                   # a chunk never straddles a ubatch from position 0
            n_ub, off = c.view
            ub = past + c.start - off
            assert ub % max(batch, ubatch // batch * batch) == 0 and off + c.size <= n_ub
        else:
            assert c.view is None
    wanted = [c for c in cs if c.rows is not None]
    assert wanted == (cs if all_logits else [cs[-1]])
    if not all_logits:
        assert cs[-1].rows == slice(cs[-1].size - 1, cs[-1].size)


def test_one_decode_token_is_a_batch_of_its_own():
    (c,) = chunks(1, 37, 64, 512)
    assert (c.start, c.stop, c.view, c.rows, c.only, c.kind) == (0, 1, None, slice(0, 1), None, None)


@pytest.mark.parametrize("outputs_all", [False, True])
def test_unwanted_chunks_skip_the_last_layer_past_attention(outputs_all):
    cs = chunks(100, 0, 64, 512, aligned=True, outputs_all=outputs_all)
    assert cs[0].only == slice(64, 64) and cs[0].rows is None
    assert cs[1].only == (None if outputs_all else slice(35, 36))
