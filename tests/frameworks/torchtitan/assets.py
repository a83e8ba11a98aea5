"""Stand-ins for the files TorchTitan's repository ships next to its debug config and the pip
wheel does not: `tests/assets/tokenizer/` (a Hugging Face tokenizer directory),
`tests/assets/c4_test/` (a small slice of C4 as JSON lines) and `tests/assets/sft_test/data.json`
(question/answer pairs for `sft_debugmodel`). The configs read them by those relative paths from
the working directory, as `run_train.sh` runs it from a checkout.

Nothing may be downloaded at run time, so both are generated here, deterministically:
- the corpus is synthetic English-like text (words drawn from a fixed word list with a seeded
  generator), one `{"text": ...}` object per line as in C4's JSON files;
- the tokenizer is a byte-level BPE trained on that corpus with the `tokenizers` library, with
  Llama 3's special tokens `<|begin_of_text|>` / `<|end_of_text|>` and a `tokenizer_config.json`
  naming them, the layout TorchTitan's HuggingFaceTokenizer loads. Its vocabulary (2,000) fits
  the debug model's 2,048 embeddings, as the repository's test tokenizer does, and the
  repository's chat template (`CHAT_TEMPLATE`), which `sft_debugmodel`'s ChatDataset applies;
- the SFT data (write_sft_assets) is what the repository's file holds, in its format (a JSON list
  of {"question", "answer"}, the answer ending "#### n"): seeded arithmetic word problems whose
  answers are right.

The values of tokens do not matter to phantora (virtual GPUs hold no data); what matters is that
TorchTitan's own data path (HF `datasets`, tokenization, packing into seq_len samples) runs
unchanged and feeds batches of the configured shape.

    python tests/frameworks/torchtitan/assets.py DIR    # writes DIR/tests/assets/{tokenizer,c4_test,sft_test}
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

VOCAB_SIZE = 2000
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
# tests/assets/tokenizer/tokenizer_config.json's chat_template in pytorch/torchtitan at commit
# 1fdf90d3f9b756ef709ce262bc839f1dab679b5e (BSD licence; Copyright (c) Meta Platforms, Inc. and affiliates)
CHAT_TEMPLATE = ("{{ bos_token }}{% for msg in messages %}{{ msg.role }}\n{{ msg.content }}{{ eos_token }}{% endfor %}"
                 "{% if add_generation_prompt %}assistant\n{% endif %}")
_WORDS = (
    "the of and to in a is that for it as was with be by on not he this are or his from at which "
    "but have an they you were her she there been one all we their has would when if so no what "
    "up out about who them time into only could new some these two may first then do any like my "
    "now over such our man me even most made after also did many before must through back years "
    "where much your way well down should because each just those people how too little state "
    "good very make world still own see men work long get here between both life being under "
    "never day same another know while last might us great old year off come since against go "
    "came right used take three train model data token layer weight gradient memory network graph "
    "kernel stream device tensor batch sequence parallel shard pipeline stage step loss rate"
).split()


def _document(rng: random.Random) -> str:
    sentences = []
    for _ in range(rng.randint(4, 12)):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(6, 24))]
        sentences.append(" ".join(words).capitalize() + ".")
    return " ".join(sentences)


def write_assets(root: Path, documents: int = 2000, seed: int = 0) -> tuple[Path, Path]:
    """Write root/tests/assets/c4_test/data.json and root/tests/assets/tokenizer/; returns
    (tokenizer dir, dataset dir)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    rng = random.Random(seed)
    data_dir = root / "tests" / "assets" / "c4_test"
    tok_dir = root / "tests" / "assets" / "tokenizer"
    data_dir.mkdir(parents=True, exist_ok=True)
    tok_dir.mkdir(parents=True, exist_ok=True)
    texts = [_document(rng) for _ in range(documents)]
    with open(data_dir / "data.json", "w") as f:
        for i, text in enumerate(texts):
            f.write(json.dumps({"text": text, "timestamp": "2019-04-25T12:57:54Z",
                                "url": f"https://example.invalid/synthetic/{i}"}) + "\n")

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=[BOS, EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    tok.save(str(tok_dir / "tokenizer.json"))
    special = {str(tok.token_to_id(t)): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                         "single_word": False, "special": True} for t in (BOS, EOS)}
    (tok_dir / "tokenizer_config.json").write_text(json.dumps({
        "added_tokens_decoder": special, "bos_token": BOS, "eos_token": EOS, "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": True, "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": 131072, "tokenizer_class": "PreTrainedTokenizerFast"}, indent=2))
    return tok_dir, data_dir


_ITEMS = ("apples", "books", "pencils", "marbles", "cookies", "stamps", "shells", "cards")


def _problem(rng: random.Random) -> dict[str, str]:
    """One question and its worked answer, the last line `#### n` as GSM8K-style data has it."""
    a, b, item = rng.randint(2, 99), rng.randint(2, 30), rng.choice(_ITEMS)
    kind = rng.randrange(4)
    if kind == 0:
        return {"question": f"What is {a} + {b}?", "answer": f"{a} + {b} = {a + b}. #### {a + b}"}
    if kind == 1:
        a = max(a, b + 1)
        return {"question": f"If you have {a} {item} and give away {b}, how many do you have left?",
                "answer": f"{a} - {b} = {a - b}. #### {a - b}"}
    if kind == 2:
        a = a % 12 + 2
        return {"question": f"Sam has {a} boxes with {b} {item} each. How many {item} in total?",
                "answer": f"{a} * {b} = {a * b}. #### {a * b}"}
    q = a % 12 + 2
    return {"question": f"What is {q * b} / {b}?", "answer": f"{q * b} / {b} = {q}. #### {q}"}


def write_sft_assets(root: Path, samples: int = 64, seed: int = 0) -> Path:
    """Write root/tests/assets/sft_test/data.json: a JSON list of {"question", "answer"} pairs, the
    layout of the repository's file (sft_debugmodel loads it with load_dataset("json", ...))."""
    rng = random.Random(seed)
    path = root / "tests" / "assets" / "sft_test" / "data.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([_problem(rng) for _ in range(samples)], indent=2) + "\n")
    return path


if __name__ == "__main__":
    print(*write_assets(Path(sys.argv[1])), write_sft_assets(Path(sys.argv[1])), sep="\n")
