"""`arxivscout eval locomo`: how much of what was said reaches the agent's context.

LoCoMo (Maharana et al., 2024) holds long conversations between two people over many dated
sessions, and questions whose evidence is named turns. Each conversation is replayed into a
fresh thread of a temporary tenant through the bot's own memory writes (each turn a message by
its speaker, dated by its session, in a public thread; indexing and rolling summaries queued
as the bot queues them and awaited), then for every question of categories 1-4 the context is
assembled exactly as the agent would for it, under the budget. Evidence recall is the share of
a question's evidence turns whose text appears in the conversation-derived segments
(Conversation, Episodic, Summary).
"""

from __future__ import annotations

import json
import math
import re
import statistics
import time
import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from bot.errors import ConfigError
from bot.llm import LLMClient
from bot.prompt import AGENT_SYSTEM_PROMPT
from bot.upkeep import Upkeep
from memory.context import CONVERSATION_DERIVED, ContextLimits, assemble_context
from memory.manager import MemoryManager
from memory.scope import Scope

DEFAULT_DATA = (
    Path(__file__).resolve().parents[2] / "shared" / "benchmarks" / "locomo" / "locomo-dev.json"
)
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
_EVIDENCE = re.compile(r"D\d+:\d+")
_SESSION = re.compile(r"^session_(\d+)$")

JUDGE = """\
Label an answer to a question about a long conversation as CORRECT or WRONG, given the gold
answer. Be generous: an answer that names the same thing, date or period as the gold answer,
even in other words or with more detail, is CORRECT. Answer with one word: CORRECT or WRONG."""


@dataclass
class Turn:
    dia_id: str
    speaker: str
    text: str
    timestamp: float

    @property
    def content(self) -> str:
        """What is stored: the words, with a shared photo's caption (see `load`)."""
        return self.text


@dataclass
class Question:
    question: str
    answer: str
    evidence: list[str]
    category: int


@dataclass
class Conversation:
    sample_id: str
    turns: list[Turn]
    questions: list[Question]


@dataclass
class Outcome:
    """One question's result, as `--dump` writes it."""

    sample_id: str
    question: str
    category: int
    evidence: list[str]
    found: list[str]
    tokens: int
    milliseconds: float
    text: str = ""
    answer: str | None = None
    correct: bool | None = None

    @property
    def recall(self) -> float:
        return len(self.found) / len(self.evidence)


@dataclass
class Report:
    budget: int
    outcomes: list[Outcome] = field(default_factory=list)

    def recall(self, category: int | None = None) -> float:
        chosen = [o for o in self.outcomes if category in (None, o.category)]
        return statistics.fmean(o.recall for o in chosen) if chosen else 0.0

    def to_json(self) -> dict[str, Any]:
        tokens = [o.tokens for o in self.outcomes]
        ms = sorted(o.milliseconds for o in self.outcomes)
        judged = [o.correct for o in self.outcomes if o.correct is not None]
        return {
            "budget": self.budget,
            "questions": len(self.outcomes),
            "recall": round(self.recall(), 4),
            "recall_by_category": {
                f"{c} {name}": round(self.recall(c), 4)
                for c, name in CATEGORIES.items()
                if any(o.category == c for o in self.outcomes)
            },
            "context_tokens_p50": statistics.median(tokens) if tokens else 0,
            "context_tokens_max": max(tokens, default=0),
            "assembly_ms_p50": round(statistics.median(ms), 2) if ms else 0.0,
            "assembly_ms_p95": round(ms[math.ceil(0.95 * len(ms)) - 1], 2) if ms else 0.0,
            **({"judged_correct": round(sum(judged) / len(judged), 4)} if judged else {}),
        }


def session_time(text: str) -> float:
    """LoCoMo's "1:56 pm on 8 May, 2023" as a UTC timestamp."""
    return datetime.strptime(text.strip(), "%I:%M %p on %d %B, %Y").replace(tzinfo=UTC).timestamp()


def load(path: Path) -> list[Conversation]:
    """Conversations in LoCoMo's layout (any file in it works, not only the development split);
    a file in another is refused as a whole, before any replay starts."""
    try:
        samples = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(samples, list):
            raise TypeError(f"a list of conversations expected, not a {type(samples).__name__}")
        return [conversation_of(sample) for sample in samples]
    except KeyError as exc:
        raise ConfigError(f"{path} is not in LoCoMo's layout: no {exc} field") from None
    except (ValueError, TypeError, AttributeError) as exc:  # bad JSON, dates, shapes
        raise ConfigError(f"{path} is not in LoCoMo's layout: {exc}") from None


def conversation_of(sample: dict[str, Any]) -> Conversation:
    """One conversation of a LoCoMo file."""
    if not isinstance(sample, dict):
        raise TypeError(f"each conversation should be an object, not a {type(sample).__name__}")
    talk = sample["conversation"]
    turns = []
    sessions = sorted(int(m[1]) for key in talk if (m := _SESSION.match(key)))
    for number in sessions:
        start = session_time(talk[f"session_{number}_date_time"])
        for i, turn in enumerate(talk[f"session_{number}"]):
            text = turn["text"]
            if turn.get("blip_caption"):  # people refer to the photos they share
                text += f" [shares an image: {turn['blip_caption']}]"
            turns.append(Turn(turn["dia_id"], turn["speaker"], text, start + i))
    questions = [
        Question(q["question"], str(q.get("answer", "")), _EVIDENCE.findall(" ".join(
            q.get("evidence", []))), int(q["category"]))
        for q in sample.get("qa", [])
    ]  # fmt: skip
    return Conversation(str(sample.get("sample_id", "")), turns, questions)


class LocomoEval:
    """Replays conversations into a temporary tenant and measures what the context holds."""

    def __init__(
        self,
        memory: MemoryManager,
        upkeep: Upkeep,
        budget: int,
        llm: LLMClient | None = None,
    ) -> None:
        self.memory = memory
        self.upkeep = upkeep
        self.limits = ContextLimits(budget)
        self.llm = llm
        self.tenant = f"eval-locomo-{uuid.uuid4().hex[:8]}"

    def thread(self, conversation: Conversation, speaker: str = "") -> Scope:
        return Scope(
            self.tenant, f"locomo:{conversation.sample_id}", "locomo", user=speaker,
            user_name=speaker,
        )  # fmt: skip

    async def replay(self, conversation: Conversation) -> None:
        """Each turn a message by its speaker, with the upkeep the bot does after a turn.

        The indexing goes through the background work, as in the bot. The roll is done here,
        when the window passes its share: in the bot it runs when a worker gets to it, so where
        its summaries cut would depend on timing, and two runs of the same code would differ.
        """
        thread = self.thread(conversation)
        for turn in conversation.turns:
            scope = self.thread(conversation, turn.speaker)
            message = await self.memory.conversation.append(
                scope, "user", turn.content, timestamp=turn.timestamp
            )
            await self.upkeep.after_messages(scope, [message], window=0)  # indexing only
            window = await self.memory.conversation.unsummarized_tokens(thread, self.memory.model)
            if window > self.limits.window_target:
                await self.upkeep.roll_summaries([{"scope": thread.to_dict()}])
        await self.upkeep.background.drain()

    async def ask(self, conversation: Conversation, question: Question) -> Outcome:
        texts = {t.dia_id: t.content for t in conversation.turns}
        scope = self.thread(conversation, "evaluator")
        vector = (await self.memory.embedder.embed([question.question]))[0]
        started = time.perf_counter()
        context = await assemble_context(
            self.memory, scope, question.question, self.limits, vector=vector
        )
        elapsed = (time.perf_counter() - started) * 1000
        derived = [s for s in context.segments if s.name in CONVERSATION_DERIVED]
        text = "\n\n".join(s.text for s in derived)
        found = [e for e in question.evidence if e in texts and texts[e] in text]
        outcome = Outcome(
            conversation.sample_id, question.question, question.category, question.evidence,
            found, sum(s.tokens for s in derived), elapsed, text,
        )  # fmt: skip
        if self.llm is not None:
            outcome.answer, outcome.correct = await self.answer(context.render(), question)
        return outcome

    async def answer(self, rendered: str, question: Question) -> tuple[str, bool]:
        """The agent's answer from this context, and an LLM judge's verdict (mem0's protocol)."""
        reply = await self.llm.complete_text(
            [{"role": "system", "content": AGENT_SYSTEM_PROMPT},
             {"role": "user", "content": rendered}]
        )  # fmt: skip
        verdict = await self.llm.complete_text(
            [{"role": "system", "content": JUDGE},
             {"role": "user", "content": f"Question: {question.question}\nGold answer: "
              f"{question.answer}\nAnswer: {reply}"}]
        )  # fmt: skip
        return reply, verdict.strip().upper().startswith("CORRECT")

    async def run(self, conversations: list[Conversation], dump: TextIO | None = None) -> Report:
        report = Report(self.limits.memory_tokens)
        try:
            for conversation in conversations:
                await self.replay(conversation)
                for question in conversation.questions:
                    if question.category not in CATEGORIES or not question.evidence:
                        continue
                    outcome = await self.ask(conversation, question)
                    report.outcomes.append(outcome)
                    if dump is not None:
                        dump.write(json.dumps(asdict(outcome), ensure_ascii=False) + "\n")
        finally:
            await self.memory.drop_tenant(self.tenant)
        return report


def text_report(report: Report) -> str:
    data = report.to_json()
    lines = [f"LoCoMo evidence recall at {report.budget} tokens ({data['questions']} questions)"]
    lines += [
        f"  category {name}: {value:.3f}" for name, value in data["recall_by_category"].items()
    ]
    lines += [
        f"  context tokens (conversation-derived): p50 {data['context_tokens_p50']:.0f}, "
        f"max {data['context_tokens_max']}",
        f"  assembly latency (question embedded beforehand): p50 {data['assembly_ms_p50']} ms, "
        f"p95 {data['assembly_ms_p95']} ms",
    ]
    if "judged_correct" in data:
        lines.append(f"  answers judged correct: {data['judged_correct']:.3f}")
    lines.append(
        f"recall {data['recall']:.3f} over {data['questions']} questions at {report.budget} tokens"
    )
    return "\n".join(lines)
