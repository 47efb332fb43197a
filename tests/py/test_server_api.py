"""`spark serve` through the official `openai` Python client: chat and text
completions, streamed and not, stop strings, seeds, sampling fields, usage,
reasoning with thinking on and off, prompt-prefix reuse, the context limit,
/v1/models, /health, /metrics, the 503 of a full queue, cancelling on
disconnect, and the CLI's flags."""
import json
import time

import openai
import pytest

from sparktest import run_spark
from test_server_support import Server, server_model

HELLO = [{"role": "user", "content": "Hello, who are you?"}]
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return server_model(tmp_path_factory.mktemp("serve"))


@pytest.fixture(scope="module")
def server(model):
    srv = Server(model, "--parallel", 2)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return server.client()


@pytest.fixture(scope="module")
def model_id(client):
    return client.models.list().data[0].id


def wait_for(condition, timeout=10):
    deadline = time.time() + timeout
    while not condition():
        assert time.time() < deadline, "condition not met in time"
        time.sleep(0.02)


def chat(client, model_id, **kw):
    kw.setdefault("messages", HELLO)
    return client.chat.completions.create(model=model_id, **kw)


def test_models_and_health(server, client, model):
    models = client.models.list().data
    assert [m.id for m in models] == [model.name]
    assert client.models.retrieve(model.name).id == model.name
    h = server.health()
    assert h["status"] == "ok" and h["sessions"] == 2 and h["model"] == model.name


def test_chat_completion(client, model_id):
    r = chat(client, model_id, max_tokens=12, seed=1, **{"extra_body": NO_THINK})
    c = r.choices[0]
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert c.message.role == "assistant" and isinstance(c.message.content, str) and c.message.content
    assert c.finish_reason == "length"
    assert r.usage.completion_tokens == 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + 12


def test_usage_counts_the_rendered_prompt(client, model_id, model, tmp_path):
    """prompt_tokens is the length of the Spark chat rendering of the messages."""
    (tmp_path / "m.json").write_text(json.dumps(HELLO))
    proc = run_spark(["chat-template", model, "--messages", tmp_path / "m.json", "--no-think", "--json"])
    ids = json.loads(proc.stdout)["ids"]
    r = chat(client, model_id, max_tokens=3, seed=1, extra_body=NO_THINK)
    assert r.usage.prompt_tokens == len(ids)


def test_chat_stream_equals_non_stream(client, model_id):
    kw = dict(max_tokens=24, seed=42, temperature=1.0, extra_body=NO_THINK)
    whole = chat(client, model_id, **kw).choices[0].message.content
    chunks = list(chat(client, model_id, stream=True, stream_options={"include_usage": True}, **kw))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 24
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 3  # really streamed


def test_text_completion_stream_and_not(client, model_id):
    kw = dict(model=model_id, prompt="And God said,", max_tokens=16, seed=3)
    r = client.completions.create(**kw)
    assert r.object == "text_completion" and r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 16
    parts = list(client.completions.create(stream=True, **kw))
    assert "".join(p.choices[0].text for p in parts) == r.choices[0].text
    assert parts[-1].choices[0].finish_reason == "length"


def test_completion_prompt_as_token_ids(client, model_id):
    r = client.completions.create(model=model_id, prompt=[100, 200, 300], max_tokens=4, seed=1)
    assert r.usage.prompt_tokens == 3


def test_seed_reproducibility(client, model_id):
    kw = dict(max_tokens=40, temperature=1.0, top_p=1.0, extra_body=NO_THINK)
    a = chat(client, model_id, seed=1234, **kw).choices[0].message.content
    b = chat(client, model_id, seed=1234, **kw).choices[0].message.content
    c = chat(client, model_id, seed=99, **kw).choices[0].message.content
    assert a == b
    assert a != c


def test_stop_strings(client, model_id):
    kw = dict(model=model_id, prompt="And the LORD said unto Moses,", max_tokens=40, temperature=0)
    full = client.completions.create(**kw).choices[0].text
    word = next(w for w in full.split()[2:] if len(w) >= 3)
    cut = full.index(word)
    r = client.completions.create(stop=[word, "zzzz-never"], **kw)
    assert r.choices[0].text == full[:cut]
    assert r.choices[0].finish_reason == "stop"
    # a single string works too, and streaming cuts at the same place
    parts = list(client.completions.create(stop=word, stream=True, **kw))
    assert "".join(p.choices[0].text for p in parts) == full[:cut]


def test_sampling_fields_are_honoured(client, model_id, model):
    # logit_bias +100 on one token makes it the only choice
    ids = json.loads(run_spark(["tokenize", model, "--text", " the", "--json"]).stdout)
    assert len(ids) == 1
    tok_id = ids[0]
    r = client.completions.create(model=model_id, prompt="In the beginning", max_tokens=5, seed=1,
                                  logit_bias={str(tok_id): 100})
    assert r.choices[0].text == " the" * 5
    # the penalties and top_p are accepted and change nothing about validity
    r = chat(client, model_id, max_tokens=8, seed=1, presence_penalty=1.5, frequency_penalty=0.5, top_p=0.5,
             extra_body=NO_THINK)
    assert r.usage.completion_tokens == 8


def test_reasoning_content_thinking_on_and_off(client, model_id):
    on = chat(client, model_id, max_tokens=16, seed=5).choices[0].message
    # the prompt ends in <think>: what the model writes first is reasoning
    assert isinstance(on.reasoning_content, str) and on.reasoning_content
    off = chat(client, model_id, max_tokens=16, seed=5, extra_body=NO_THINK).choices[0].message
    assert getattr(off, "reasoning_content", None) is None
    assert off.content
    # streamed: reasoning arrives as reasoning_content deltas
    chunks = list(chat(client, model_id, max_tokens=16, seed=5, stream=True))
    streamed = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks if c.choices)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed + content == on.reasoning_content + on.content


def test_prefix_reuse(client, model_id):
    """A continuing conversation reuses the cached prefix of its history."""
    first = chat(client, model_id, max_tokens=8, seed=1, extra_body=NO_THINK)
    follow = HELLO + [{"role": "assistant", "content": first.choices[0].message.content},
                      {"role": "user", "content": "Tell me more."}]
    second = chat(client, model_id, messages=follow, max_tokens=8, seed=1, extra_body=NO_THINK)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= first.usage.prompt_tokens - 1, (cached, first.usage)
    # reuse changes nothing about the answer: the same request from scratch agrees
    again = chat(client, model_id, messages=follow, max_tokens=8, seed=1, extra_body=NO_THINK)
    assert again.choices[0].message.content == second.choices[0].message.content


def test_context_overflow_is_400_with_numbers(client, model_id, server):
    n_ctx = client.models.list().data[0].model_extra["context_length"]
    long = "and " * (n_ctx + 50)
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, model_id, messages=[{"role": "user", "content": long}], max_tokens=4)
    assert f"maximum context length is {n_ctx} tokens" in str(e.value)
    assert e.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, model_id, max_tokens=n_ctx)
    msg = str(e.value)
    assert f"{n_ctx} in the completion" in msg and "in the messages" in msg


def test_metrics(server, client, model_id):
    chat(client, model_id, max_tokens=4, seed=1)
    m = server.metrics()
    assert m['spark_requests_total{endpoint="chat_completions"}'] >= 1
    assert m["spark_generated_tokens_total"] >= 4
    assert m["spark_generate_tokens_per_second"] > 0
    for name in ("spark_queue_depth", "spark_sessions_active", "spark_sessions", "spark_prompt_tokens_total",
                 "spark_requests_cancelled_total", "spark_requests_rejected_total"):
        assert name in m
    assert server.http("GET", "/metrics")[1]["content-type"].startswith("text/plain")


def test_chat_page_is_served(server):
    status, headers, text = server.http("GET", "/")
    assert status == 200 and headers["content-type"].startswith("text/html")
    assert "spark.c chat" in text and "/v1/chat/completions" in text


def test_disconnect_cancels_generation(server, client, model_id):
    before = server.metrics()["spark_requests_cancelled_total"]
    stream = chat(client, model_id, max_tokens=1500, seed=1, stream=True)
    for i, _ in enumerate(stream):
        if i == 3:
            break
    stream.close()
    t0 = time.time()
    server.wait_idle(timeout=10)
    assert time.time() - t0 < 5
    assert server.metrics()["spark_requests_cancelled_total"] == before + 1
    # and the server goes on serving
    assert chat(client, model_id, max_tokens=2).usage.completion_tokens == 2


def test_disconnect_cancels_a_non_streamed_request(server, model_id):
    before = server.metrics()["spark_requests_cancelled_total"]
    conn = server.send("POST", "/v1/chat/completions",
                       {"model": model_id, "messages": HELLO, "max_tokens": 1500, "seed": 2})
    wait_for(lambda: server.health()["sessions_active"] == 1)
    conn.close()
    server.wait_idle(timeout=10)
    assert server.metrics()["spark_requests_cancelled_total"] == before + 1


def test_every_token_banned(server, model_id, model):
    """A bias that bans the whole vocabulary: 400 when not streamed; in a
    stream (already 200) an error event, then [DONE]."""
    n_vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    body = {"model": model_id, "messages": HELLO, "max_tokens": 4,
            "logit_bias": {str(i): -100 for i in range(n_vocab)}}
    status, _, text = server.http("POST", "/v1/chat/completions", body)
    assert status == 400 and "banned" in json.loads(text)["error"]["message"]
    status, headers, text = server.http("POST", "/v1/chat/completions", dict(body, stream=True))
    assert status == 200 and headers["content-type"] == "text/event-stream"
    events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and "banned" in json.loads(events[-2])["error"]["message"]


def test_queue_full_is_503(model):
    srv = Server(model, "--parallel", 1, "--queue", 1)
    try:
        client = srv.client()
        long = dict(model=model.name, messages=HELLO, max_tokens=1500, seed=1, stream=True)
        running = client.chat.completions.create(**long)
        next(iter(running))
        waiting = srv.send("POST", "/v1/chat/completions", long)
        wait_for(lambda: srv.health()["queue_depth"] == 1)
        with pytest.raises(openai.InternalServerError) as e:
            client.chat.completions.create(model=model.name, messages=HELLO, max_tokens=2)
        assert e.value.status_code == 503 and e.value.body["code"] == "server_busy"
        # the waiting client leaves: it is dropped from the queue at once
        waiting.close()
        wait_for(lambda: srv.health()["queue_depth"] == 0, timeout=2)
        running.close()
        srv.wait_idle(timeout=10)
        m = srv.metrics()
        assert m["spark_requests_rejected_total"] == 1 and m["spark_requests_cancelled_total"] >= 1
    finally:
        srv.stop()


def test_serve_help_and_bad_flags(model):
    out = run_spark(["serve", "--help"]).stdout
    for flag in ("--host", "--port", "--api-key", "--parallel", "--ctx", "--queue", "--threads"):
        assert flag in out
    assert "serve" in run_spark(["--help"]).stdout
    run_spark(["serve", "--bogus"], expect_rc=2)
    run_spark(["serve", "--port", "70000"], expect_rc=2)
    run_spark(["serve", "--parallel", "0"], expect_rc=2)
    run_spark(["serve", "--port"], expect_rc=2)
    p = run_spark(["serve", "-m", "/nonexistent/model", "--port", "0"], expect_rc=1)
    assert "/nonexistent/model" in p.stderr


def test_shutdown_as_a_worker_lets_go_of_its_job(model):
    """SIGTERM in the moment after a worker dropped its finished job and
    before it took the scheduler lock again (SPARK_SERVE_TEST_LINGER_MS holds
    that moment open). The shutdown must not reach the job through the slot:
    by then the job is freed, and the ASan build reports a use-after-free
    (CI caught this once by luck at the end of another test)."""
    srv = Server(model, "--parallel", 1, env={"SPARK_SERVE_TEST_LINGER_MS": "1500"})
    body = {"model": model.name, "messages": HELLO, "max_tokens": 2, "seed": 1}
    status, _, text = srv.http("POST", "/v1/chat/completions", body)
    assert status == 200, text
    t0 = time.time()
    srv.stop()
    # the worker still joined: it lingered, then saw the server stopping
    assert time.time() - t0 < 10


def test_shutdown_with_requests_in_flight(model):
    """SIGTERM with one stream generating and one queued: both streams end
    well-formed (the queued one with an error event), the server exits 0."""
    srv = Server(model, "--parallel", 1)
    body = {"model": model.name, "messages": HELLO, "max_tokens": 1500, "seed": 1, "stream": True}
    running = srv.send("POST", "/v1/chat/completions", body)
    r1 = running.getresponse()
    assert r1.status == 200 and r1.readline().startswith(b"data: ")
    queued = srv.send("POST", "/v1/chat/completions", body)
    wait_for(lambda: srv.health()["queue_depth"] == 1)
    t0 = time.time()
    srv.proc.send_signal(15)
    rest1 = r1.read().decode()
    r2 = queued.getresponse()
    rest2 = r2.read().decode()
    srv.stop()
    assert time.time() - t0 < 10
    assert rest1.rstrip().endswith("data: [DONE]")
    assert r2.status == 200 and rest2.rstrip().endswith("data: [DONE]") and "shutting down" in rest2
