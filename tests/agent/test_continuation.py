"""`continuation_ids`: what a multi-turn episode appends after a sampled reply is exactly what
the chat template writes for one more message, with no new conversation opened there."""

import pytest

from terminal_rsi.agent.harness import continuation_ids
from terminal_rsi.models.tokenizer import ByteTokenizer, HFTokenizer
from tests.models.reference import CHAT_TEMPLATE, train_bpe

# SmolLM2-135M-Instruct's template (from its GGUF): a default system prompt before a
# conversation that does not open with one
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
# Like Qwen3's: the final assistant message carries a thinking block the earlier ones do not
THINKING_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['role'] == 'assistant' and loop.last %}{{ '<think>\\n\\n</think>\\n\\n' }}"
    "{% endif %}{{ message['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
# Renders the messages last first: no conversation is a prefix of a longer one
REVERSED_TEMPLATE = (
    "{% for message in messages|reverse %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>\\n' }}{% endfor %}")

CONV = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Task: ls"}]
REPLY = "```bash\nls\n```"
OBS = {"role": "observation", "content": "$ ls\nREADME.md"}


@pytest.fixture(scope="module")
def bpe():
    pytest.importorskip("tokenizers")
    return train_bpe()


def _hf(bpe, template):
    return HFTokenizer(bpe, chat_template=template, eos_token="<|im_end|>")


@pytest.mark.parametrize("template", [CHAT_TEMPLATE, SMOLLM2_TEMPLATE], ids=["chatml", "smollm2"])
def test_prompt_reply_and_continuation_render_the_whole_conversation(bpe, template):
    tok = _hf(bpe, template)
    reply = tok.encode(REPLY) + [tok.stop_ids[0]]
    cont = continuation_ids(tok, OBS["role"], OBS["content"], reply)
    whole = tok.render([*CONV, {"role": "assistant", "content": REPLY}, OBS])
    assert tok.render(CONV) + reply + cont == whole
    assert tok.decode(cont) == "\n<|im_start|>observation\n$ ls\nREADME.md<|im_end|>\n" \
                               "<|im_start|>assistant\n"


def test_smollm2_template_gets_no_default_system_prompt_per_observation(bpe):
    tok = _hf(bpe, SMOLLM2_TEMPLATE)
    text = tok.decode(continuation_ids(tok, "observation", "out", [tok.stop_ids[0]]))
    assert "SmolLM" not in text and "system" not in text


def test_a_reply_cut_by_length_is_closed_first(bpe):
    tok = _hf(bpe, CHAT_TEMPLATE)
    cut = tok.encode(REPLY)  # no stop token: the output limit ended it
    cont = continuation_ids(tok, "observation", "out", cut)
    assert cont[0] == tok.stop_ids[0]
    assert cont[1:] == continuation_ids(tok, "observation", "out", cut + [tok.stop_ids[0]])


def test_a_template_that_renders_the_last_reply_differently_is_cut_after_the_user(bpe):
    tok = _hf(bpe, THINKING_TEMPLATE)
    cont = continuation_ids(tok, "observation", "out", [tok.stop_ids[0]])
    assert tok.decode(cont) == "<|im_start|>observation\nout<|im_end|>\n<|im_start|>assistant\n"


def test_a_template_without_prefixes_is_a_typed_error(bpe):
    tok = _hf(bpe, REVERSED_TEMPLATE)
    with pytest.raises(ValueError, match="prefix of the same conversation"):
        continuation_ids(tok, "observation", "out", [tok.stop_ids[0]])


def test_byte_tokenizer_appends_the_message_and_the_generation_prompt():
    tok = ByteTokenizer()
    cont = continuation_ids(tok, "observation", "out", [tok.stop_ids[0]])
    assert tok.decode(cont) == "<|observation|>out<|end|><|assistant|>"
    reply = tok.encode("x") + [tok.stop_ids[0]]
    whole = tok.render([*CONV, {"role": "assistant", "content": "x"},
                        {"role": "observation", "content": "out"}])
    assert tok.render(CONV) + reply + cont == whole
