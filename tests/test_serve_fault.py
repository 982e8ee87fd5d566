"""A crash and a clean stop with a disk session store: every completed turn was written there, so
the next server on the same directory continues every conversation (docs/serve.md, "What
survives a crash")."""
import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")

from serve_process import Server, get_json, post  # noqa: E402

pytestmark = pytest.mark.model

QUESTIONS = ["Name a large animal.", "Name a small bird.", "Name a cold place."]


def test_every_written_turn_survives_kill_9_and_a_clean_stop(tmp_path):
    import json
    import time

    # The least budget: only the conversation just answered stays in memory, the others are on disk.
    settings = {"serve.kv_budget_bytes": 1, "serve.session_store": f"disk:{tmp_path / 'sessions'}"}

    def ask(server, messages):
        status, r = post(server.url + "/v1/chat/completions",
                         json.dumps({"messages": messages, "max_tokens": 6, "temperature": 0}).encode())
        assert status == 200, r
        assert r["choices"][0]["finish_reason"] in ("stop", "length") and r["usage"]["completion_tokens"] >= 1
        messages.append(r["choices"][0]["message"])
        return r["usage"]

    def follow_up(server, conv, text):
        conv.append({"role": "user", "content": text})
        return ask(server, conv)

    def written(server):
        """/health once the turns answered are written (the writer thread is behind the answer)."""
        deadline = time.monotonic() + 60
        while (h := get_json(server.url + "/health"))["store"]["writes_pending"]:
            assert time.monotonic() < deadline, h
            time.sleep(0.1)
        return h

    convs = [[{"role": "user", "content": q}] for q in QUESTIONS]
    with Server(tmp_path, settings) as first:
        for c in convs:
            ask(first, c)
        health = written(first)
        # The last one answered is in memory and, like the others, on disk.
        assert (health["sessions_saved"], health["sessions_in_memory"]) == (3, 1)
        assert health["stored_turns"] == 3 and health["store"]["available"]
        first.kill()  # kill -9: nothing written is lost

    with Server(tmp_path, settings) as second:
        assert get_json(second.url + "/health")["sessions_saved"] == 3
        usages = [follow_up(second, c, "And another one?") for c in convs]
        assert [u["session"] for u in usages] == ["restored"] * 3
        for u in usages:  # the restored ones prefill the new message only
            assert u["prompt_tokens_details"]["cached_tokens"] > 0 and u["prompt_tokens"] < 20
        assert second.stop() == 0  # Ctrl-C: a clean stop writes whatever the writer had not

    with Server(tmp_path, settings) as third:
        assert get_json(third.url + "/health")["sessions_saved"] == 3  # one value per conversation
        usages = [follow_up(third, c, "One more, please.") for c in convs]
        assert [u["session"] for u in usages] == ["restored"] * 3
        assert get_json(third.url + "/health")["restore_failed"] == 0
