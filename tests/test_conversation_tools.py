"""The conversation measurements' plumbing on the real model, at tiny lengths: Session.add feeds
given turns as a turn would, the recall tool's full cache finds a fact stated turns before the
question while an evicting setting reaches its ratio, and the budget tool never holds more than
its budget, counting the bytes as the cache does."""
import pytest

from mnn_h2o import config
from mnn_h2o.engine import Llm
from mnn_h2o.session import Session
from mnn_h2o.tools import conversation_budget as budget_tool
from mnn_h2o.tools import conversation_recall as recall

pytestmark = pytest.mark.model

# Short conversations: a context small enough that the budget tool's default reaches it quickly;
# floors small enough that a few hundred tokens can be evicted.
SMALL = {"runtime": {"max_context": 640}, "eviction": {"sink_tokens": 16, "recent_tokens": 32, "trigger_min_tokens": 0}}


@pytest.fixture(scope="module")
def llm():
    return Llm.load("smollm2", config.validate(SMALL), progress=False)


def test_add_feeds_given_turns_like_a_conversation_prefilled_at_once(llm):
    tok = llm.tokenizer
    given = [{"role": "user", "content": "My name is Ada."}, {"role": "assistant", "content": recall.ACK}]
    question = {"role": "user", "content": "What is my name?"}
    with Session(llm) as s:
        fed = s.add(given)
        assert s.messages == given
        assert fed == len(s.token_ids) == len(tok.encode(tok.render_chat(given, add_generation_prompt=False)))
        r = s.say(question["content"], max_new_tokens=4)
        # The history, then only the question: the ids are those of the whole render (ChatML turns
        # start at special tokens, which BPE never merges across).
        whole = tok.encode(tok.render_chat(given + [question]))
        assert r.prompt_tokens == len(whole) - fed and s.token_ids[:len(whole)] == whole
        with pytest.raises(ValueError, match="extend"):
            s.add([question])


def test_recall_full_cache_finds_facts_stated_turns_before_the_question(llm):
    convs = recall.conversations(llm.tokenizer, "test", 400, 96)
    conv = convs[0]
    assert len(conv.turns) >= 3 and all(p.value in conv.turns[0] for p in conv.probes)
    assert not any(p.value in t for p in conv.probes for t in conv.turns[1:])
    full, evicting = recall.parse_settings("full,default@3.2", "h2o", "q8")
    rs = recall.run_conversation(llm, recall.setting_config(llm.cfg, full), conv)
    # SmolLM2-135M answers two of the three (the third with the acknowledgement it was shown).
    assert sum(r["hit"] for r in rs) >= 2, [r["answer"] for r in rs]
    tokens = rs[0]["history_tokens"]
    assert 300 <= tokens <= 400 and rs[0]["whole_model_ratio"] < 1.05  # f16 rows in whole blocks
    ev = recall.run_conversation(llm, recall.setting_config(llm.cfg, evicting), conv)
    assert ev[0]["history_tokens"] == tokens and 0.9 * 3.2 <= ev[0]["whole_model_ratio"] <= 1.1 * 3.2


def test_budget_tool_holds_at_most_its_budget(llm):
    budget = budget_tool.budget_bytes(llm, 160)
    first, fillers, asked = budget_tool.facts(llm.tokenizer, "test", 32)
    assert all(value in first for _, value in asked)
    rows = {}
    for name in ("f16", "default"):
        rows[name] = r = budget_tool.grow(llm, budget_tool.config_for(llm.cfg, name, budget), budget,
                                          first, fillers, asked)
        assert r["max_bytes_after_a_turn"] <= budget and all(h["kv_bytes_held"] <= budget for h in r["history"])
        assert len(r["recall"]) == 3
    f16, default = rows["f16"], rows["default"]
    # The f16 full cache stops at the budget, holding whole blocks of every token it was given:
    # its bytes are the budget's formula at its own length.
    assert f16["stopped_by"] == "budget" and f16["tokens"] <= 160
    assert f16["tokens_held"] == f16["tokens"] and f16["kv_bytes_held"] == budget_tool.budget_bytes(llm, f16["tokens"])
    # The default (q8, the byte cap) runs into the context instead, at several times the tokens.
    assert default["stopped_by"] == "context" and default["tokens"] >= 3 * f16["tokens"]


def test_the_first_turn_tool_times_the_three_ways_and_they_hold_what_they_should(llm):
    """tools.session_ttft --first-turn: the compression after the answer holds what the one in
    the turn holds (the same budget over the same tokens), no eviction the whole prompt; after
    the answer the pass is timed apart, in compress_s."""
    from mnn_h2o.tools import session_ttft

    cfg = config.validate({**SMALL, "eviction": dict(SMALL["eviction"], policy="kvzip")})
    r = session_ttft.measure_first_turn(llm, cfg, 300, 1)
    a, b, c = r["in_turn"], r["after_answer"], r["no_eviction"]
    assert r["policy"] == "kvzip" and r["prompt_tokens"] > 300
    assert b["compress_s"]["median"] > 0.2 * a["ttft_s"]["median"] and a["compress_s"]["median"] < 0.05
    assert 2.8 < a["whole_model_ratio"] < 3.4 and 2.8 < b["whole_model_ratio"] < 3.4  # 3.2 in blocks of 16
    assert abs(a["kv_bytes_held"] - b["kv_bytes_held"]) < 0.1 * a["kv_bytes_held"]
    assert c["whole_model_ratio"] < 2.0 and c["kv_bytes_held"] > 1.4 * a["kv_bytes_held"]  # q8 rows, all kept
