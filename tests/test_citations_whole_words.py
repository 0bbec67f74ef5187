"""An answer names a paper (and so lists it under Sources without a citation number) only by
whole words: "RAG" is not named by "average" or "storage", "LoRA" not by "exploration", "BERT"
not by "Robert"; "RAG's", "(RAG)", "_RAG_", "使用RAG的" and "GPT-4" still name theirs."""

from __future__ import annotations

import pytest

from bot.citations import SourceRegistry, cite
from memory.stores.knowledge_base import Passage

RAG = Passage(
    "2005.11401", "RAG: Retrieval-Augmented Generation for Knowledge-Intensive NLP Tasks",
    "Method", 3,
    "We combine parametric memory with a dense vector index of Wikipedia; retrieval of documents "
    "improves generation on knowledge intensive benchmarks.",
    "https://arxiv.org/abs/2005.11401", 2020, 0.9,
)  # fmt: skip
LORA = Passage(
    "2106.09685", "LoRA: Low-Rank Adaptation of Large Language Models", "Method", 1,
    "We freeze the pretrained weights and inject trainable rank decomposition matrices into "
    "each layer, reducing trainable parameters for downstream tasks.",
    "https://arxiv.org/abs/2106.09685", 2021, 0.9,
)  # fmt: skip
BERT = Passage(
    "1810.04805", "BERT: Pre-training of Deep Bidirectional Transformers", "Method", 2,
    "We pretrain deep bidirectional representations from unlabeled text by jointly conditioning "
    "on both left and right context in all layers.",
    "https://arxiv.org/abs/1810.04805", 2018, 0.9,
)  # fmt: skip
GPT4 = Passage(
    "2303.08774", "GPT-4: A Large Multimodal Model", "Results", 5,
    "The model exhibits human-level performance on various professional and academic "
    "benchmarks, including passing a simulated bar exam.",
    "https://arxiv.org/abs/2303.08774", 2023, 0.9,
)  # fmt: skip
ATTENTION = Passage(
    "1706.03762", "Attention Is All You Need", "Model", 4,
    "The Transformer dispenses with recurrence and convolutions entirely, relying on "
    "multi-head self-attention over encoder and decoder stacks.",
    "https://arxiv.org/abs/1706.03762", 2017, 0.9,
)  # fmt: skip
RAG_V2 = Passage(
    "2005.11401v2", RAG.title, RAG.section, RAG.chunk_index, RAG.content,
    "https://arxiv.org/abs/2005.11401v2", 2020, 0.9,
)  # fmt: skip
OLD_STYLE = Passage(
    "hep-th/9901001v2", "Notes on Dualities", RAG.section, 0, RAG.content,
    "https://arxiv.org/abs/hep-th/9901001v2", 1999, 0.9,
)  # fmt: skip
LOCAL_PDF = Passage(
    "local-3f2a1b0c9d8e", "Team notes", "", 0, RAG.content, "", None, 0.9, page=2
)  # fmt: skip
# Titles stored with a stray space at an edge: the space is no boundary of the name
RAG_SPACED = Passage(
    "2005.11401", "RAG ", RAG.section, RAG.chunk_index, RAG.content, RAG.url, 2020, 0.9
)  # fmt: skip
BERT_SPACED = Passage(
    "1810.04805", " BERT", BERT.section, BERT.chunk_index, BERT.content, BERT.url, 2018, 0.9
)  # fmt: skip

# Each answer shares enough content words with its paper's passage to rest on it: only the
# naming decides whether the paper is listed.
RAG_CLAIM = "a dense vector index of documents improves generation on knowledge benchmarks."
LORA_CLAIM = "freezing pretrained weights and trainable rank decomposition matrices per layer."
BERT_CLAIM = "deep bidirectional representations conditioned on left and right context."
GPT4_CLAIM = "human-level performance on professional and academic benchmarks, a bar exam."
ATTENTION_CLAIM = "the Transformer drops recurrence and convolutions for multi-head decoder stacks."


def listed(answer: str, passage: Passage) -> list[str]:
    return [s.arxiv_id for s in cite(answer, SourceRegistry([passage])).sources]


@pytest.mark.parametrize(
    ("answer", "passage"),
    [
        (f"On average, {RAG_CLAIM}", RAG),
        (f"The storage grows, yet {RAG_CLAIM}", RAG),
        (f"In our exploration, {LORA_CLAIM}", LORA),
        (f"Robert notes {BERT_CLAIM}", BERT),
        (f"GPT-4o reaches {GPT4_CLAIM}", GPT4),
        (f"GPT-4.5 reaches {GPT4_CLAIM}", GPT4),
        (f"Per 2005.114012, {RAG_CLAIM}", RAG),  # the id inside a longer number
        (f"The ragged results: {RAG_CLAIM}", RAG_SPACED),
        (f"Robert notes {BERT_CLAIM}", BERT_SPACED),
    ],
)
def test_a_name_inside_another_word_does_not_name_the_paper(answer, passage):
    assert listed(answer, passage) == []
    assert "Sources:" not in cite(answer, SourceRegistry([passage])).text


@pytest.mark.parametrize(
    ("answer", "passage"),
    [
        (f"RAG (Lewis et al.) shows {RAG_CLAIM}", RAG),
        (f"RAG's finding: {RAG_CLAIM}", RAG),
        (f"Retrieval-augmented generation (RAG): {RAG_CLAIM}", RAG),
        (f"rag-based systems: {RAG_CLAIM}", RAG),
        (f"LoRA, by {LORA_CLAIM}", LORA),
        (f"As BERT showed, {BERT_CLAIM}", BERT),
        (f"GPT-4 reaches {GPT4_CLAIM}", GPT4),
        (f"GPT-4. It reaches {GPT4_CLAIM}", GPT4),
        (f"Per arXiv:2005.11401v2, {RAG_CLAIM}", RAG),
        (f"Attention Is All\nYou Need (a title across a line break): {ATTENTION_CLAIM}", ATTENTION),
        # Markdown italics and bold: "_" is no letter
        (f"_RAG_ shows {RAG_CLAIM}", RAG),
        (f"__RAG__ improves: {RAG_CLAIM}", RAG),
        (f"_Attention Is All You Need_ showed {ATTENTION_CLAIM}", ATTENTION),
        # Chinese, Japanese and Korean attach a Latin name with no space
        (f"我们使用RAG的方法: {RAG_CLAIM}", RAG),
        (f"基于BERT模型, {BERT_CLAIM}", BERT),
        (f"BERTは {BERT_CLAIM}", BERT),
        (f"BERT는 양방향: {BERT_CLAIM}", BERT),
        # ids: a stored version named by the base id, an old-style id, a local PDF's id
        (f"Per arXiv:2005.11401, {RAG_CLAIM}", RAG_V2),
        (f"See hep-th/9901001: {RAG_CLAIM}", OLD_STYLE),
        (f"The notes (local-3f2a1b0c9d8e) say {RAG_CLAIM}", LOCAL_PDF),
    ],
)
def test_a_name_standing_as_whole_words_names_the_paper(answer, passage):
    assert listed(answer, passage) == [passage.arxiv_id]
