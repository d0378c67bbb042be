"""The embedded model's word-level tokenizer, built from the task templates.

Words are split on whitespace and punctuation (BERT pre-tokenizer); every word the
synthetic task generators can emit is one token. Numbers are cut into chunks of up to
:data:`NUMBER_CHUNK` = 2 digits: "4821" is ``48`` ``##21``, so a 7-digit needle value
is four tokens and a 4-digit code two. Two rather than the three digits of the Llama-3
and GPT-4 tokenizers: a model of this size copies a token it attends to only as well as
it can tell that token from the rest of the vocabulary, and 3-digit chunks (2,220
number tokens) were its main source of needle errors (attention on the right piece,
the wrong piece written out); 2-digit chunks leave 220. The chat template is a minimal
one with role tokens; ``<|end|>`` closes a turn and is the EOS token.
"""

from __future__ import annotations

from typing import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from kvcert.tasks import lookalike, multikey, multiturn, needle

#: the chat specials, defined here once (the test tokenizers take theirs from here too): ``<|end|>``
#: closes a turn and is the EOS token; a role's token is ``<|role|>``
PAD, UNK, BOS, EOS = "<pad>", "<unk>", "<s>", "<|end|>"
ROLES = ("system", "user", "assistant")
ROLE_TOKENS = tuple(f"<|{role}|>" for role in ROLES)
SYSTEM, USER, ASSISTANT = ROLE_TOKENS
SPECIAL_TOKENS = (PAD, UNK, BOS, EOS, *ROLE_TOKENS)

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}" + EOS + "\n"
    "{% endfor %}{% if add_generation_prompt %}" + ASSISTANT + "\n{% endif %}"
)


NUMBER_CHUNK = 2  # digits per number token, at most


def number_tokens() -> list[str]:
    """Digit chunks of 1..NUMBER_CHUNK digits, word-initial and continuation (``##``) forms."""
    chunks = [f"{i:0{width}d}" for width in range(1, NUMBER_CHUNK + 1) for i in range(10**width)]
    # word-initial chunks never start with a redundant zero except "0" itself, but a
    # number such as "07" may still appear; keep every form so nothing maps to UNK.
    return chunks + [f"##{c}" for c in chunks]


def task_words(texts: Iterable[str]) -> list[str]:
    """Distinct non-numeric words of ``texts`` under the BERT pre-tokenizer, sorted."""
    splitter = pre_tokenizers.BertPreTokenizer()
    words: set[str] = set()
    for text in texts:
        for word, _ in splitter.pre_tokenize_str(text):
            if not word.isdigit():
                words.add(word)
    return sorted(words)


def vocabulary() -> list[str]:
    """The full vocabulary: special tokens, task words, number chunks (stable order)."""
    texts = [*needle.vocabulary_texts(), *lookalike.vocabulary_texts(), *multikey.vocabulary_texts(),
             *multiturn.vocabulary_texts()]
    # role names written in transcripts and templates
    texts += ["User Assistant system user assistant"]
    return [*SPECIAL_TOKENS, *task_words(texts), *number_tokens()]


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A fresh tokenizer (deterministic: same vocabulary, same ids, every time)."""
    vocab = {token: index for index, token in enumerate(vocabulary())}
    backend = Tokenizer(models.WordPiece(vocab=vocab, unk_token=UNK, max_input_chars_per_word=64))
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece(prefix="##", cleanup=True)
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        pad_token=PAD,
        additional_special_tokens=list(ROLE_TOKENS),
        clean_up_tokenization_spaces=False,
        model_max_length=4096,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer
