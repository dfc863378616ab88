"""tokens/engine_rules.py's settle() in process: where a model turn ends, the same for every engine answer whatever
its finish_reason (an abort's unchecked last token, an EOS inside a speculative run, two SGLang versions' finish
orders, an engine that ran past a stop string), and the cut that keeps a prefix of what was sampled. The tokenizer is
a small vocabulary of multi-character pieces (support/piece_tokenizer.py: 5 is "</search>", 3 and 4 are "</sea" and
"rch>", 99 is "<|im_end|>"), so every expected value is written out."""

import base64
import json
from array import array

import pytest
import torch

from slime_search_r1.episode import Turn
from slime_search_r1.tokens.engine_rules import (
    TurnEnds,
    cut_after_first_stop,
    first_end,
    int32_values,
    keep_first_tokens,
    model_eos_ids,
    settle,
)

from support.piece_tokenizer import TOKENIZER

STOPS = ("</search>", "</answer>")
IM_END = 99
ENDS = TurnEnds(STOPS, frozenset({IM_END}))


def meta(version=None, finish="stop", **more) -> dict:
    info = {"finish_reason": {"type": finish}, **more}
    if version is not None:
        info["weight_version"] = version
    return info


def answer(ids, finish="stop", version="1") -> Turn:
    """An engine answer as tokens/engine.py reads it."""
    pairs = [[-0.25 * (i + 1), token, None] for i, token in enumerate(ids)]
    return Turn(
        list(ids),
        finish,
        log_probs=[-0.25 * (i + 1) for i in range(len(ids))],
        meta_info=meta(version, finish, output_token_logprobs=pairs),
        versions=[(0, len(ids), version)] if ids else [],
    )


# ---- what ends a turn -------------------------------------------------------------------------------------------


def test_a_requests_ends_are_its_stop_strings_the_protocols_and_its_stop_ids_with_the_models_eos():
    ends = TurnEnds.of({"stop": "</x>", "stop_token_ids": [7]}, STOPS, frozenset({8}))
    assert ends == TurnEnds(("</x>", "</search>", "</answer>"), frozenset({7, 8}))
    assert TurnEnds.of({"stop": ["</search>", "</y>"]}, STOPS, frozenset()).stop_strings == (
        "</search>",
        "</y>",
        "</answer>",
    )
    assert TurnEnds.of({}, (), frozenset({8})) == TurnEnds((), frozenset({8}))
    # SGLang's ignore_eos turns off stop_token_ids as well (managers/schedule_batch.py _check_token_based_finish)
    assert TurnEnds.of({"stop_token_ids": [7], "ignore_eos": True}, STOPS, frozenset({8})).stop_ids == frozenset()


def test_the_models_eos_set_is_read_from_its_checkpoint_as_sglang_reads_it(tmp_path):
    class Tokenizer:
        eos_token_id = 151643

    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 151645}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [151643, 151644, "x"]}))
    assert model_eos_ids(str(tmp_path), Tokenizer()) == frozenset({151643, 151644, 151645})
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    (broken / "generation_config.json").write_text(json.dumps(["no", "object"]))
    assert model_eos_ids(str(broken), Tokenizer()) == frozenset({151643})
    assert model_eos_ids("Qwen/Qwen2.5-3B", Tokenizer()) == frozenset({151643})  # a hub name: the tokenizer's
    Tokenizer.eos_token_id = None
    assert model_eos_ids(None, Tokenizer()) == frozenset()


def test_the_first_end_is_a_stop_id_or_a_stop_string_whichever_comes_first():
    assert first_end([2, 99, 5], 0, TOKENIZER, ENDS) == (2, IM_END)
    assert first_end([2, 5, 99], 0, TOKENIZER, ENDS) == (2, "</search>")
    assert first_end([2, 3, 4, 99], 0, TOKENIZER, ENDS) == (3, "</search>")  # spread over two tokens
    assert first_end([2, 6, 6], 0, TOKENIZER, ENDS) is None
    # the first `start` tokens were sampled before an abort: a stop string may end after them, not within them
    assert first_end([2, 3, 4, 6], 2, TOKENIZER, ENDS) == (3, "</search>")
    assert first_end([99, 6, 99], 1, TOKENIZER, ENDS) == (3, IM_END)


# ---- settling an answer into the turn it ends ---------------------------------------------------------------------


def test_an_aborted_answer_whose_last_token_ends_the_turn_finishes_it():
    # an abort runs one more step whose token is appended unchecked: here the turn's <|im_end|>
    settled = settle(answer([2, 6, IM_END], "abort"), [], ENDS, 100, TOKENIZER)
    assert settled.ids == [2, 6, IM_END] and settled.finish_type == "stop" and settled.engine_aborted
    assert settled.meta_info["finish_reason"] == {"type": "stop", "matched": IM_END}
    assert settled.log_probs == [-0.25, -0.5, -0.75] and settled.versions == [(0, 3, "1")]
    # or the token that completes a stop string, here over the tokens sampled before an earlier abort and now
    settled = settle(answer([4], "abort"), [1, 2, 3], ENDS, 100, TOKENIZER)
    assert settled.ids == [4] and settled.finish_type == "stop" and settled.engine_aborted
    assert settled.meta_info["finish_reason"] == {"type": "stop", "matched": "</search>"}


def test_an_aborted_answer_that_ends_nothing_stays_an_abort_unless_its_budget_ran_out():
    settled = settle(answer([2, 6], "abort"), [], ENDS, 100, TOKENIZER)
    assert settled.ids == [2, 6] and settled.finish_type == "abort" and settled.engine_aborted
    assert settled.meta_info["finish_reason"] == {"type": "abort"}
    assert settle(answer([], "abort"), [1, 2], ENDS, 100, TOKENIZER).finish_type == "abort"
    # the unchecked token was the last this call was offered: the engine would have said length
    settled = settle(answer([2, 6, 6], "abort"), [], ENDS, 3, TOKENIZER)
    assert settled.finish_type == "length" and settled.ids == [2, 6, 6] and settled.engine_aborted
    assert settled.meta_info["finish_reason"] == {"type": "length", "length": 3}


@pytest.mark.parametrize("engine_says", ["length", "stop"], ids=["sglang-0.5.15", "sglang-0.5.23"])
def test_a_stop_on_the_last_allowed_token_is_a_stop_whichever_order_the_engine_checks_in(engine_says):
    # 0.5.15.post1 checks length first and says length; 0.5.23 checks stops first and says stop
    for ids in ([2, 6, IM_END], [2, 6, 5]):
        settled = settle(answer(ids, engine_says), [], ENDS, 3, TOKENIZER)
        assert settled.finish_type == "stop" and settled.ids == ids and not settled.engine_aborted


def test_an_eos_inside_a_speculative_run_ends_the_turn_there():
    # speculative decoding: a stop string completed later in one accepted run wins over the EOS before it
    spec = answer([2, IM_END, 6, 5], "stop")
    spec.meta_info["finish_reason"]["matched"] = "</search>"
    settled = settle(spec, [], ENDS, 100, TOKENIZER)
    assert settled.ids == [2, IM_END] and settled.finish_type == "stop"
    assert settled.log_probs == [-0.25, -0.5]
    assert settled.meta_info["output_token_logprobs"] == [[-0.25, 2, None], [-0.5, IM_END, None]]
    assert settled.meta_info["finish_reason"] == {"type": "stop", "matched": IM_END}
    assert settled.versions == [(0, 2, "1")]


def test_a_stop_the_reader_cannot_see_is_the_engines_and_a_length_is_kept():
    unseen = answer([2, 6], "stop")  # e.g. an EOS of the model's that nobody told the reader of
    assert settle(unseen, [], ENDS, 100, TOKENIZER) == unseen
    cut = answer([2, 6, 6], "length")
    assert settle(cut, [], ENDS, 3, TOKENIZER) == cut


def test_an_answer_that_ran_past_its_end_is_cut_after_it_with_its_versions():
    ran_on = answer([1, 2, 5, 6, 6], "length")
    ran_on.versions = [(0, 2, "1"), (2, 5, "2")]
    settled = settle(ran_on, [], ENDS, 100, TOKENIZER)
    assert settled.ids == [1, 2, 5] and settled.finish_type == "stop" and not settled.engine_aborted
    assert settled.versions == [(0, 2, "1"), (2, 3, "2")]


# ---- the stop-string cut ----------------------------------------------------------------------------------------


def cut(ids, stops=STOPS):
    return cut_after_first_stop(ids, TOKENIZER, TOKENIZER.decode(ids), stops)


@pytest.mark.parametrize("length", range(2, 8))
def test_a_turn_is_cut_right_after_the_token_that_completes_its_stop_string(length):
    # the stop string completed by the token at each position of a turn of `length` tokens, with filler after it
    for end in range(1, length + 1):
        ids = [6] * (end - 1) + [5] + [6] * (length - end)
        assert cut(ids) == end, (ids, end)
        split = [6] * (end - 1) + [3, 4] + [6] * (length - end)  # the stop string spread over two tokens
        assert cut(split) == end + 1, (split, end)


def test_a_turn_without_its_stop_string_or_without_stops_is_kept_whole():
    assert cut([1, 2, 6, 6]) == 4
    assert cut([1, 2, 5, 6], stops=()) == 4
    assert cut([5, 6, 6], stops=("</answer>",)) == 3
    assert cut([3, 6, 4]) == 3  # the pieces of a stop string apart are no stop string


def test_the_first_stop_string_in_the_text_wins_whichever_is_listed_first():
    assert cut([7, 8, 6, 5, 6]) == 2
    assert cut([7, 8, 6, 5, 6], stops=("</search>", "</answer>")) == 2
    assert cut([5, 6, 8, 6], stops=("</answer>", "</search>")) == 1
    assert cut([6, 10, 11, 6, 5]) == 3


def test_a_stop_string_written_twice_cuts_after_its_first_occurrence():
    assert cut([5, 6, 5, 6]) == 1
    assert cut([5, 5, 6]) == 1
    assert cut([6, 3, 4, 5]) == 3


def test_a_one_token_turn_is_never_cut():
    assert cut([5]) == 1
    assert cut([]) == 0


def test_the_stop_cut_decodes_special_tokens_as_the_engine_wrote_them():
    # "<|im_end|>" as a stop string: a decode that skipped special tokens would never find it
    assert cut([6, 99, 6, 6], stops=("<|im_end|>",)) == 2


# ---- keep_first_tokens, int32_values ---------------------------------------------------------


def test_keep_first_tokens_cuts_ids_log_probs_and_top_p_arrays_and_reports_a_stop():
    info = meta(
        "4",
        "length",
        output_token_logprobs=[[-0.1, 5], [-0.2, 6], [-0.3, 6]],
        top_p_token_ids=[5, 7, 6, 6, 8, 6],
        top_p_token_offsets=[0, 2, 3, 6],
        prompt_tokens=3,
    )
    turn = Turn([5, 6, 6], "length", text="ignored", log_probs=[-0.1, -0.2, -0.3], meta_info=info)
    kept = keep_first_tokens(turn, 2)
    assert kept.ids == [5, 6]
    assert kept.log_probs == [-0.1, -0.2]
    assert kept.finish_type == "stop"
    assert kept.text == "ignored"
    assert kept.meta_info == {
        "finish_reason": {"type": "stop"},
        "weight_version": "4",
        "output_token_logprobs": [[-0.1, 5], [-0.2, 6]],
        "top_p_token_ids": [5, 7, 6],
        "top_p_token_offsets": [0, 2, 3],
        "prompt_tokens": 3,
    }
    # the engine's answer itself is left as it was
    assert info["finish_reason"] == {"type": "length"}
    assert info["top_p_token_offsets"] == [0, 2, 3, 6]
    assert len(info["output_token_logprobs"]) == 3


def test_keep_first_tokens_reads_the_kept_top_p_names_and_base64_and_leaves_half_a_pair_alone():
    ids = base64.b64encode(array("i", [5, 7, 6, 8]).tobytes()).decode()
    offsets = base64.b64encode(array("i", [0, 2, 3, 4]).tobytes()).decode()
    info = {"top_p_kept_token_ids": ids, "top_p_kept_token_offsets": offsets, "top_p_token_ids": None}
    kept = keep_first_tokens(Turn([5, 6, 8], "stop", meta_info=info), 1)
    assert kept.meta_info["top_p_kept_token_offsets"] == [0, 2]
    assert kept.meta_info["top_p_kept_token_ids"] == [5, 7]
    assert kept.meta_info["top_p_token_ids"] is None
    assert kept.log_probs is None
    assert kept.ids == [5]
    # ids without offsets (or offsets without ids) cannot be cut consistently: left as the engine sent them
    only_ids = keep_first_tokens(Turn([5, 6], "stop", meta_info={"top_p_token_ids": [5, 6]}), 1).meta_info
    assert only_ids == {"finish_reason": {"type": "stop"}, "top_p_token_ids": [5, 6]}
    only_offsets = keep_first_tokens(Turn([5, 6], "stop", meta_info={"top_p_token_offsets": [0, 1, 2]}), 1)
    assert only_offsets.meta_info == {"finish_reason": {"type": "stop"}, "top_p_token_offsets": [0, 1, 2]}


def test_int32_values_reads_every_form_sglang_sends():
    raw = array("i", [0, -3, 70000]).tobytes()
    assert int32_values(base64.b64encode(raw).decode()) == [0, -3, 70000]
    assert int32_values(raw) == [0, -3, 70000]
    assert int32_values(bytearray(raw)) == [0, -3, 70000]
    assert int32_values(memoryview(raw)) == [0, -3, 70000]
    assert int32_values(torch.tensor([4, 5], dtype=torch.int32)) == [4, 5]
    values = int32_values([4.0, 5])
    assert values == [4, 5] and all(type(v) is int for v in values)
