"""`spark chat` driven through a pseudo-terminal, as a person uses it:
several turns on one KV cache, /reset, /system, /save + /load, the context
overflow policy, and Ctrl-C (stop a reply; twice exits)."""
import json
import re

import pexpect
import pytest

from conftest_models import make_chat_model
from sparktest import SPARK_BIN, SANITIZER_MARKS

PROMPT = "> "


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_chat_model(tmp_path_factory.mktemp("chat"))


def start(model, *args):
    child = pexpect.spawn(SPARK_BIN, ["chat", "-m", str(model), "--temp", "0", "--no-think", *map(str, args)],
                          encoding="utf-8", timeout=120, dimensions=(40, 200))
    child.expect_exact(PROMPT)
    return child


def say(child, text):
    """Send a message; return the prompt-token count reported for the turn."""
    child.sendline(text)
    child.expect(r"prompt: (\d+) tokens")
    n = int(child.match.group(1))
    child.expect_exact(PROMPT)
    return n


def finish(child):
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    out = child.before or ""
    for mark in SANITIZER_MARKS:
        assert mark not in out
    assert child.exitstatus == 0, out


def test_turns_reuse_the_cache(model):
    child = start(model, "-n", "12")
    first = say(child, "Hello there, who are you?")
    second = say(child, "Tell me more.")
    third = say(child, "And then?")
    # each later turn evaluates only its own tokens (+ the EOS closing the
    # previous reply), not the growing history
    assert second < first and third < first, (first, second, third)
    assert second <= 12 and third <= 12
    finish(child)


def test_reset_starts_over(model):
    child = start(model, "-n", "8")
    first = say(child, "Hello there, who are you?")
    say(child, "More.")
    child.sendline("/reset")
    child.expect_exact("[conversation reset]")
    child.expect_exact(PROMPT)
    again = say(child, "Hello there, who are you?")
    assert again == first  # the whole system + user turn again
    finish(child)


def test_save_and_load(model, tmp_path):
    f = tmp_path / "conv.json"
    child = start(model, "-n", "6")
    say(child, "Remember the word apple.")
    child.sendline(f"/save {f}")
    child.expect_exact("[saved to")
    child.expect_exact(PROMPT)
    finish(child)
    conv = json.loads(f.read_text())
    assert [m["role"] for m in conv] == ["user", "assistant"]
    assert conv[0]["content"] == "Remember the word apple."
    child = start(model, "-n", "6")
    child.sendline(f"/load {f}")
    child.expect_exact("[loaded")
    child.expect_exact(PROMPT)
    n = say(child, "What word?")
    assert n <= 12  # the loaded history is already in the cache
    finish(child)


def test_system_and_help(model):
    child = start(model, "-n", "4")
    child.sendline("/help")
    child.expect_exact("/reset")
    child.expect_exact(PROMPT)
    child.sendline("/system You are terse.")
    child.expect_exact("[system message set]")
    child.expect_exact(PROMPT)
    say(child, "Hi")
    child.sendline("/bogus")
    child.expect_exact("unknown command")
    child.expect_exact(PROMPT)
    finish(child)


def test_context_overflow_drops_oldest_turns(model):
    child = start(model, "-n", "16", "--ctx", "160")
    notices = 0
    for i in range(8):
        child.sendline(f"Message number {i}: " + "words and more words " * 4)
        idx = child.expect([r"\[context full", r"prompt: \d+ tokens"])
        if idx == 0:
            notices += 1
            child.expect(r"prompt: \d+ tokens")
        child.expect_exact(PROMPT)
    assert notices >= 1
    # a message that can never fit is refused, and the REPL goes on
    child.sendline("too long " * 400)
    child.expect_exact("not sent")
    child.expect_exact(PROMPT)
    say(child, "still here?")
    finish(child)


def interrupt_reply(child, text):
    child.sendline(text)
    child.expect_exact(text + "\r\n")  # the terminal's echo: the line was read
    child.expect(r"\S")  # the reply has started
    child.sendintr()
    child.expect(r"\(stopped\)")
    child.expect_exact(PROMPT)


def test_ctrl_c_stops_a_reply_then_twice_exits(model):
    child = start(model, "-n", "-1", "--ignore-eos", "--ctx", "4096")
    interrupt_reply(child, "Write forever.")
    interrupt_reply(child, "Again, forever.")  # the conversation goes on after a stopped reply
    child.sendintr()
    child.expect_exact("Ctrl-C again")
    child.sendintr()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 130, (child.exitstatus, child.signalstatus)
