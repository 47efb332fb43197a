"""Tool calls and reasoning through `spark serve`, end to end with the
official `openai` client.

A small test model cannot be made to write Spark's tool-call markup, so
these servers run in the test-only script mode (SPARK_SERVE_SCRIPT): the
replies below are replayed token by token in place of sampling, while the
prompt is still rendered, tokenized and evaluated. What is tested is the
server's parsing of the model's output and the wire format."""
import json

import pytest

from test_server_support import Server, server_model

TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {"type": "object",
                       "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                       "required": ["city"]},
    },
}]
CALL = ("Let me look that up.</think><tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>"
        "<arg_key>days</arg_key><arg_value>3</arg_value></tool_call>")
ANSWER = "The tool says sunny.</think>It is sunny in Paris for 3 days."
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return server_model(tmp_path_factory.mktemp("serve-tools"))


@pytest.fixture
def scripted(model, tmp_path):
    """Start a server replaying the given replies in turn."""
    servers = []

    def start(*replies):
        path = tmp_path / f"script{len(servers)}.txt"
        path.write_text("\n%%\n".join(replies))
        srv = Server(model, "--parallel", 1, env={"SPARK_SERVE_SCRIPT": str(path)})
        servers.append(srv)
        return srv, srv.client()

    yield start
    for srv in servers:
        log = srv.stop()
        assert "TEST MODE" in log


def check_call(call):
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "days": 3}


def test_tool_call_round_trip(scripted, model):
    srv, client = scripted(CALL, ANSWER)
    first = client.chat.completions.create(model=model.name, messages=ASK, tools=TOOLS, tool_choice="auto")
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    assert choice.message.reasoning_content == "Let me look that up."
    assert len(choice.message.tool_calls) == 1
    check_call(choice.message.tool_calls[0])
    assert first.usage.completion_tokens > 5

    # feed the result back as role "tool"; the reply is ordinary content
    call = choice.message.tool_calls[0]
    follow = ASK + [
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": call.id, "type": "function",
                         "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"sky": "sunny", "c": 21})},
    ]
    second = client.chat.completions.create(model=model.name, messages=follow, tools=TOOLS)
    msg = second.choices[0].message
    assert second.choices[0].finish_reason == "stop"
    assert msg.content == "It is sunny in Paris for 3 days." and not msg.tool_calls
    assert msg.reasoning_content == "The tool says sunny."
    # the longer conversation was rendered (tool turn included) and reused the first prompt's prefix
    assert second.usage.prompt_tokens > first.usage.prompt_tokens + 10
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 1


def test_tool_call_streamed(scripted, model):
    srv, client = scripted(CALL)
    chunks = list(client.chat.completions.create(model=model.name, messages=ASK, tools=TOOLS, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    calls = [tc for d in deltas for tc in (d.tool_calls or [])]
    assert len(calls) == 1 and calls[0].index == 0
    check_call(calls[0])
    reasoning = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
    assert reasoning == "Let me look that up."
    assert not "".join(d.content or "" for d in deltas)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_several_calls_and_a_string_argument(scripted, model):
    two = ("</think>Checking both.<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>"
           "<tool_call>get_weather<arg_key>city</arg_key><arg_value>42</arg_value></tool_call>")
    srv, client = scripted(two)
    r = client.chat.completions.create(model=model.name, messages=ASK, tools=TOOLS)
    m = r.choices[0].message
    assert m.content == "Checking both."
    args = [json.loads(c.function.arguments) for c in m.tool_calls]
    # "city" is declared a string, so 42 stays the string "42"
    assert args == [{"city": "Paris"}, {"city": "42"}]
    assert len({c.id for c in m.tool_calls}) == 2


def test_tool_choice_none_stops_at_the_call(scripted, model):
    srv, client = scripted("Thinking.</think>I will not call it.<tool_call>get_weather</tool_call>")
    r = client.chat.completions.create(model=model.name, messages=ASK, tools=TOOLS, tool_choice="none")
    m = r.choices[0].message
    assert m.content == "I will not call it." and not m.tool_calls
    assert r.choices[0].finish_reason == "stop"


def test_reasoning_split_thinking_on_and_off(scripted, model):
    srv, client = scripted("Reasoning goes here.</think>The answer.", "Just the answer.")
    on = client.chat.completions.create(model=model.name, messages=ASK).choices[0].message
    assert on.reasoning_content == "Reasoning goes here." and on.content == "The answer."
    off = client.chat.completions.create(model=model.name, messages=ASK,
                                         extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert off.choices[0].message.content == "Just the answer."
    assert getattr(off.choices[0].message, "reasoning_content", None) is None


def test_unfinished_tool_call_is_returned_as_text(scripted, model):
    srv, client = scripted("</think><tool_call>get_weather<arg_key>city</arg_key>")
    r = client.chat.completions.create(model=model.name, messages=ASK, tools=TOOLS)
    m = r.choices[0].message
    assert not m.tool_calls and r.choices[0].finish_reason == "stop"
    assert "get_weather" in m.content


def test_bad_tools_are_400(scripted, model):
    import openai
    srv, client = scripted("x")
    bad = [{"type": "function"}]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model.name, messages=ASK, tools=bad)
    assert e.value.body["param"] == "tools"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model.name, messages=ASK, tools=TOOLS,
                                       tool_choice={"type": "function", "function": {"name": "nope"}})
    assert "nope" in str(e.value)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=model.name, messages=ASK + [
            {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "[1]"}}]}])
