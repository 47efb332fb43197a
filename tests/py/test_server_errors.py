"""`spark serve` refusing bad requests: a table of malformed bodies, wrong
types and values, unsupported options, wrong methods and paths, a body over
the limit — each answered with its 4xx in the OpenAI error shape, none
crashing the server — and API-key authentication."""
import json

import openai
import pytest

from test_server_support import Server, server_model

HELLO = [{"role": "user", "content": "Hello"}]
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


def chat_body(**kw):
    return {"messages": HELLO, "max_tokens": 2, **kw}


# (method, path, body, status, param or None); body: bytes/str sent raw, dict as JSON
CASES = [
    ("POST", CHAT, b"{", 400, None),
    ("POST", CHAT, b"not json at all", 400, None),
    ("POST", CHAT, b"", 400, None),
    ("POST", CHAT, b"[" * 100000, 400, None),  # nesting bomb
    ("POST", CHAT, [], 400, None),
    ("POST", CHAT, {}, 400, "messages"),
    ("POST", CHAT, {"messages": "hi"}, 400, "messages"),
    ("POST", CHAT, {"messages": []}, 400, "messages"),
    ("POST", CHAT, {"messages": [42]}, 400, "messages"),
    ("POST", CHAT, {"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages"),
    ("POST", CHAT, {"messages": [{"role": "user", "content": 5}]}, 400, "messages"),
    ("POST", CHAT, chat_body(n=2), 400, "n"),
    ("POST", CHAT, chat_body(max_tokens=-1), 400, "max_tokens"),
    ("POST", CHAT, chat_body(max_tokens=0), 400, "max_tokens"),
    ("POST", CHAT, chat_body(max_tokens="10"), 400, "max_tokens"),
    ("POST", CHAT, chat_body(max_tokens=1.5), 400, "max_tokens"),
    ("POST", CHAT, chat_body(max_completion_tokens=-5), 400, "max_completion_tokens"),
    ("POST", CHAT, chat_body(temperature="hot"), 400, "temperature"),
    ("POST", CHAT, chat_body(temperature=-1), 400, "temperature"),
    ("POST", CHAT, chat_body(temperature=3), 400, "temperature"),
    ("POST", CHAT, chat_body(top_p=1.5), 400, "top_p"),
    ("POST", CHAT, chat_body(presence_penalty=5), 400, "presence_penalty"),
    ("POST", CHAT, chat_body(frequency_penalty=[1]), 400, "frequency_penalty"),
    ("POST", CHAT, chat_body(stop=5), 400, "stop"),
    ("POST", CHAT, chat_body(stop=["ok", 2]), 400, "stop"),
    ("POST", CHAT, chat_body(stop=[f"s{i}" for i in range(17)]), 400, "stop"),
    ("POST", CHAT, chat_body(seed="x"), 400, "seed"),
    ("POST", CHAT, chat_body(stream="yes"), 400, "stream"),
    ("POST", CHAT, chat_body(stream_options=1), 400, "stream_options"),
    ("POST", CHAT, chat_body(logit_bias=[1]), 400, "logit_bias"),
    ("POST", CHAT, chat_body(logit_bias={"abc": 1}), 400, "logit_bias"),
    ("POST", CHAT, chat_body(logit_bias={"5": 500}), 400, "logit_bias"),
    ("POST", CHAT, chat_body(logit_bias={"99999999": 1}), 400, "logit_bias"),
    ("POST", CHAT, chat_body(model="gpt-4o"), 400, "model"),
    ("POST", CHAT, chat_body(model=7), 400, "model"),
    ("POST", CHAT, chat_body(logprobs=True), 400, "logprobs"),
    ("POST", CHAT, chat_body(tools={}), 400, "tools"),
    ("POST", CHAT, chat_body(tools=[{"type": "function", "function": {}}]), 400, "tools"),
    ("POST", CHAT, chat_body(tool_choice="sometimes"), 400, "tool_choice"),
    ("POST", CHAT, chat_body(chat_template_kwargs="x"), 400, "chat_template_kwargs"),
    ("POST", CHAT, chat_body(chat_template_kwargs={"enable_thinking": "no"}), 400, "enable_thinking"),
    ("POST", CHAT, chat_body(response_format={"type": "json_object"}), 400, "response_format"),
    ("POST", COMPLETIONS, {}, 400, "prompt"),
    ("POST", COMPLETIONS, {"prompt": 5}, 400, "prompt"),
    ("POST", COMPLETIONS, {"prompt": [5000000]}, 400, "prompt"),
    ("POST", COMPLETIONS, {"prompt": ["a", "b"]}, 400, "prompt"),
    ("POST", COMPLETIONS, {"prompt": "x", "echo": True}, 400, "echo"),
    ("POST", COMPLETIONS, {"prompt": "x", "best_of": 2}, 400, "best_of"),
    ("POST", COMPLETIONS, {"prompt": "x", "n": 3}, 400, "n"),
    ("POST", COMPLETIONS, {"prompt": "x", "suffix": "y"}, 400, "suffix"),
    ("POST", CHAT, b"x" * (5 << 20), 413, None),  # over the 4 MB default
    ("GET", CHAT, None, 405, None),
    ("DELETE", "/v1/models", None, 405, None),
    ("POST", "/health", b"{}", 405, None),
    ("PUT", "/", b"hello", 405, None),
    ("GET", "/v1/nope", None, 404, None),
    ("POST", "/v1/engines/x/completions", {"prompt": "x"}, 404, None),
    ("GET", "/v1/models/not-this-one", None, 404, None),
    ("GET", "/v1/chat/completions/", None, 404, None),
]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return server_model(tmp_path_factory.mktemp("serve-errors"))


@pytest.fixture(scope="module")
def server(model):
    srv = Server(model, "--parallel", 1)
    yield srv
    srv.stop()


def check_error_shape(text):
    err = json.loads(text)["error"]
    assert isinstance(err["message"], str) and err["message"]
    assert isinstance(err["type"], str)
    assert "param" in err and "code" in err
    return err


@pytest.mark.parametrize("method,path,body,status,param", CASES,
                         ids=[f"{c[0]} {c[1]} {c[3]} {c[4] or repr(c[2])[:30]}" for c in CASES])
def test_malformed_request(server, method, path, body, status, param):
    got, _, text = server.http(method, path, body)
    assert got == status, text
    err = check_error_shape(text)
    if param:
        assert err["param"] == param or param in err["message"], err


def test_server_survives_the_table(server):
    for method, path, body, status, _ in CASES:
        assert server.http(method, path, body)[0] == status
    assert server.health()["status"] == "ok"
    # odd but valid input still works: invalid UTF-8 and markup in a message
    raw = b'{"messages":[{"role":"user","content":"\xff\xfe <|User|> <think>"}],"max_tokens":2}'
    got, _, text = server.http("POST", CHAT, raw)
    assert got == 200, text
    m = server.metrics()
    assert m['spark_responses_total{code="4xx"}'] >= 2 * len(CASES)


def test_body_limit_is_configurable(model):
    srv = Server(model, "--max-body", 4096)
    try:
        big = {"messages": [{"role": "user", "content": "a" * 5000}], "max_tokens": 1}
        assert srv.http("POST", CHAT, big)[0] == 413
        assert srv.http("POST", CHAT, chat_body())[0] == 200
    finally:
        srv.stop()


def test_api_key(model):
    srv = Server(model, api_key="s3cret-key")
    try:
        good = srv.client()
        assert good.models.list().data
        assert good.chat.completions.create(model=model.name, messages=HELLO, max_tokens=2).usage
        with pytest.raises(openai.AuthenticationError) as e:
            srv.client(api_key="wrong").chat.completions.create(model=model.name, messages=HELLO, max_tokens=2)
        assert e.value.status_code == 401
        check_error_shape(json.dumps(e.value.body and {"error": e.value.body}))
        for headers in ({}, {"Authorization": "Basic czNjcmV0LWtleQ=="}, {"Authorization": "Bearer s3cret-ke"},
                        {"Authorization": "Bearer s3cret-key-and-more"}):
            for path in ("/v1/models", "/metrics"):
                got, h, text = srv.http("GET", path, headers=headers, auth=False)
                assert got == 401, (headers, path)
                assert h.get("www-authenticate") == "Bearer"
                check_error_shape(text)
            assert srv.http("POST", CHAT, chat_body(), headers=headers, auth=False)[0] == 401
        # the page and the health check stay open (the page asks for the key itself)
        assert srv.http("GET", "/health", auth=False)[0] == 200
        assert srv.http("GET", "/", auth=False)[0] == 200
    finally:
        srv.stop()


def test_api_key_from_environment(model):
    srv = Server(model, env={"SPARK_API_KEY": "from-env"})
    try:
        assert srv.http("GET", "/v1/models", auth=False)[0] == 401
        assert srv.http("GET", "/v1/models", headers={"Authorization": "Bearer from-env"}, auth=False)[0] == 200
    finally:
        srv.stop()
