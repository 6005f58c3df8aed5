"""The checkpoint tokenizer agrees with transformers' fast tokenizer on the same local files."""

import json

import pytest
from tokenizers import Tokenizer as HFTokenizer, models, pre_tokenizers, processors, trainers, decoders

from jaxdllm import CheckpointError, Tokenizer
from support.optional import transformers

CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are helpful.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CORPUS = ["Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.",
          "How many clips did Natalia sell altogether in April and May?",
          "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting."]


@pytest.fixture(scope="module")
def tokdir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok")
    tok = HFTokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mdm_mask|>"]
    tok.train_from_iterator(CORPUS * 10, trainers.BpeTrainer(vocab_size=300, special_tokens=special))
    tok.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", tok.token_to_id("<|endoftext|>"))])
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": CHAT_TEMPLATE,
        "bos_token": "<|endoftext|>", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}))
    return path


def test_encode_decode_match_transformers(tokdir):
    ours = Tokenizer.from_pretrained(tokdir)
    ref = transformers.AutoTokenizer.from_pretrained(tokdir)
    for text in CORPUS + ["unseen wordz 123 <|im_end|>"]:
        assert ours.encode(text) == ref.encode(text)
        assert ours.encode(text, add_special_tokens=False) == ref.encode(text, add_special_tokens=False)
        ids = ours.encode(text)
        assert ours.decode(ids) == ref.decode(ids, skip_special_tokens=True)
        assert ours.decode(ids, skip_special_tokens=False) == ref.decode(ids)
    assert ours.token_to_id("<|mdm_mask|>") == ref.convert_tokens_to_ids("<|mdm_mask|>")
    assert ours.vocab_size == len(ref)


def test_chat_template_matches_transformers(tokdir):
    ours = Tokenizer.from_pretrained(tokdir)
    ref = transformers.AutoTokenizer.from_pretrained(tokdir)
    messages = [{"role": "user", "content": CORPUS[1]}]
    text = ours.apply_chat_template(messages)
    assert text == ref.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")
    ref_ids = ref.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    ref_ids = ref_ids["input_ids"] if isinstance(ref_ids, dict) or hasattr(ref_ids, "keys") else ref_ids
    assert ours.apply_chat_template(messages, tokenize=True) == list(ref_ids)


def test_chat_template_file_wins_and_missing_template_errors(tokdir, tmp_path):
    for f in ("tokenizer.json",):
        (tmp_path / f).write_bytes((tokdir / f).read_bytes())
    bare = Tokenizer.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match="has no chat template"):
        bare.apply_chat_template([{"role": "user", "content": "hi"}])
    (tmp_path / "chat_template.jinja").write_text("{% for m in messages %}[{{ m['content'] }}]{% endfor %}")
    assert Tokenizer.from_pretrained(tmp_path).apply_chat_template([{"role": "user", "content": "hi"}]) == "[hi]"


def test_missing_or_broken_tokenizer_file(tmp_path):
    with pytest.raises(CheckpointError, match="tokenizer.json is missing"):
        Tokenizer.from_pretrained(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{broken")
    with pytest.raises(CheckpointError, match="cannot read .*tokenizer.json"):
        Tokenizer.from_pretrained(tmp_path)
