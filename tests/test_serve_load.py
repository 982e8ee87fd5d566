"""Load on loopback: 8 conversations at once, 5 turns each, under a KV budget that holds about one
of them, so sessions go to the disk store and come back all the time (and every turn is written
there too). Bounded: 40 requests of a few tokens
each, every one with a timeout; the test stops by itself."""
import threading
import time

import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")
openai = pytest.importorskip("openai", reason="the test extra's openai client is not installed")

from serve_process import Server, get_json  # noqa: E402

pytestmark = [pytest.mark.model, pytest.mark.slow]

CONVERSATIONS = 8
TURNS = 5
OPENING_CHARS = 5000       # about 1200 tokens of essay: ~15 MiB of q8 KV per conversation
BUDGET = 16 << 20          # about one conversation: the others wait on disk
SLACK = 32 << 20           # Python heap, allocator and thread-stack growth under load
REQUEST_TIMEOUT_S = 600


def test_eight_conversations_five_turns_under_a_budget_that_forces_offloading(tmp_path, smollm2_gguf):
    from mnn_h2o.essays import essay_text

    c = smollm2_gguf.config
    embedding_bytes = c.vocab * c.hidden * 2  # the f16 table, read row by row from the export's file
    text = essay_text()
    with Server(tmp_path, {"serve.kv_budget_bytes": BUDGET}) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                               timeout=REQUEST_TIMEOUT_S)

        def ask(messages):
            return client.chat.completions.create(model="smollm2", messages=messages, max_tokens=6, temperature=0)

        # Warm-up: one conversation of the same shape, so the baseline memory holds the model,
        # MNN's buffers for a prompt of this length and one conversation's cache.
        ask([{"role": "user", "content": text[:OPENING_CHARS] + "\n\nSummarise this."}])
        warm = server.memory_kib()

        usages = {i: [] for i in range(CONVERSATIONS)}
        errors = []

        def converse(i):
            start = (i + 1) * OPENING_CHARS
            msgs = [{"role": "user", "content": text[start:start + OPENING_CHARS] + "\n\nWhat is this about?"}]
            try:
                for turn in range(TURNS):
                    r = ask(msgs)
                    c = r.choices[0]
                    assert c.finish_reason in ("stop", "length") and r.usage.completion_tokens >= 1, (i, turn, r)
                    usages[i].append(r.usage)
                    msgs += [{"role": "assistant", "content": c.message.content},
                             {"role": "user", "content": f"Tell me more, point {turn + 1}."}]
            except Exception as e:  # reported below, with the conversation
                errors.append((i, repr(e)))

        # The kernel keeps no peak of anonymous memory alone: sample it. Holding conversations
        # beyond the budget would last for turns, not milliseconds, so sampling cannot miss it.
        anon_peak, done = [warm["RssAnon"]], threading.Event()

        def sample_anon():
            while not done.wait(0.01):
                anon_peak[0] = max(anon_peak[0], server.memory_kib()["RssAnon"])

        threads = [threading.Thread(target=converse, args=(i,)) for i in range(CONVERSATIONS)]
        sampler = threading.Thread(target=sample_anon)
        sampler.start()
        for t in threads:
            t.start()
        for t in threads:
            t.join(REQUEST_TIMEOUT_S * TURNS)
        done.set()
        sampler.join()
        assert not any(t.is_alive() for t in threads), "a conversation hung"
        assert not errors, errors
        mem = server.memory_kib()
        deadline = time.monotonic() + REQUEST_TIMEOUT_S  # the last turns' writes follow their answers
        while (health := get_json(server.url + "/health"))["store"]["writes_pending"]:
            assert time.monotonic() < deadline, health
            time.sleep(0.1)

    largest = max(u.model_extra["kv_bytes_held"] for us in usages.values() for u in us)
    for i, us in usages.items():
        assert len(us) == TURNS
        ways = [u.model_extra["session"] for u in us]
        # Every follow-up continued its conversation's cache (none started over), and every
        # conversation's cache came back from disk at least once.
        assert ways[0] == "new" and "new" not in ways[1:] and "restored" in ways, (i, ways)
        for before, after in zip(us, us[1:]):
            assert after.prompt_tokens_details.cached_tokens >= before.prompt_tokens + before.completion_tokens - 1
            assert after.prompt_tokens < 40  # the new message, not the ~1200-token history
    assert largest > BUDGET / 2, "the conversations are too small for the budget to mean anything"
    assert health["restore_failed"] == 0 and health["offloaded"] >= CONVERSATIONS
    # The disk store got every turn: one value per conversation, the warm-up's too.
    assert health["sessions_saved"] == CONVERSATIONS + 1 and health["store"]["writes_pending"] == 0
    # Memory is bounded by the budget, not by the number of conversations: the anonymous memory's
    # peak over the warm-up's is at most the budget (conversations held in memory) plus three
    # conversations (the one answered, which may exceed the budget alone; one being restored
    # before another is offloaded; the serialised bytes of a save or a load in flight) plus slack.
    # Holding all 8 would take about 8 conversations over the warm-up's one. The whole RSS grows by
    # that and by few file pages: the embedding's rows are read from the file, not mapped (mapped,
    # the rows the new text touched and their neighbours stayed in RSS: up to the whole table).
    allowance_kib = (BUDGET + 3 * largest + SLACK) // 1024
    print(f"peak anonymous memory {anon_peak[0] / 1024:.0f} MiB (after warm-up {warm['RssAnon'] / 1024:.0f} MiB, "
          f"allowance {allowance_kib / 1024:.0f} MiB); peak RSS {mem['VmHWM'] / 1024:.0f} MiB (after warm-up "
          f"{warm['VmHWM'] / 1024:.0f} MiB; file pages {warm['RssFile'] / 1024:.0f} -> "
          f"{mem['RssFile'] / 1024:.0f} MiB); "
          f"largest conversation {largest / 2**20:.1f} MiB; {health}")
    assert anon_peak[0] <= warm["RssAnon"] + allowance_kib, (anon_peak, mem, warm, largest)
    assert mem["VmHWM"] <= warm["VmHWM"] + allowance_kib + embedding_bytes // 1024, (mem, warm, largest)
    assert mem["RssFile"] - warm["RssFile"] < embedding_bytes // 1024 // 4, "file pages grew as if the table were mapped"
    assert (CONVERSATIONS - 1) * largest // 1024 > allowance_kib, "the bound would not catch 8 in memory"
