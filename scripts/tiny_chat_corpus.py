"""Synthetic chat corpus for the embedded tiny model: eight task families with exactly checkable answers.

Every family is a finite pool of (messages, answer) items, enumerated in a fixed order. A prompt is held
out for evaluation when a hash of its text falls in the held-out bucket, so the split needs no RNG and
a held-out prompt can never be sampled for training. Items whose answer must be memorised (a fact, how
a word is spelled) keep their first phrasing in training, so every held-out prompt asks something the
model was taught under another wording.

The word lists are small on purpose: the tokenizer turns every task word into one token (with and
without a leading space), which is what lets a 1M-parameter model learn copy and spelling tasks in
minutes on a CPU.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from functools import cache

HELDOUT_PERCENT = 15

WORDS = [
    "apple", "banana", "cherry", "grape", "lemon", "mango", "peach", "plum",
    "cat", "dog", "bird", "fish", "horse", "mouse", "tiger", "lion",
    "red", "blue", "green", "yellow", "black", "white", "pink", "brown",
    "sun", "moon", "star", "rain", "snow", "tree", "river", "stone",
    "house", "book", "chair", "table", "bread", "milk", "water", "cake",
]  # fmt: skip
NAMES = [
    "Alice", "Bob", "Carol", "David", "Emma", "Frank", "Grace", "Henry", "Ivy", "Jack",
    "Kate", "Leo", "Mia", "Noah", "Olivia", "Paul", "Rose", "Sam", "Tom", "Zoe",
]  # fmt: skip
# (question phrasings, answer); the first phrasing of each fact always stays in training.
FACTS = [
    (["What is the capital of {x}?", "Name the capital of {x}.", "Which city is the capital of {x}?"], x, a)
    for x, a in [
        ("France", "Paris"), ("Italy", "Rome"), ("Japan", "Tokyo"), ("Spain", "Madrid"),
        ("Germany", "Berlin"), ("England", "London"), ("Egypt", "Cairo"), ("Russia", "Moscow"),
    ]
] + [
    (["What color is {x}?", "What is the color of {x}?", "Tell me the color of {x}."], x, a)
    for x, a in [
        ("the sky", "blue"), ("grass", "green"), ("snow", "white"), ("the sun", "yellow"), ("a lemon", "yellow"),
    ]
] + [
    (["How many legs does {x} have?", "How many legs has {x}?", "Count the legs of {x}."], x, a)
    for x, a in [("a dog", "4"), ("a spider", "8"), ("a bird", "2"), ("a fish", "0"), ("a cat", "4")]
]  # fmt: skip

# Eight phrasings per operation (five for the others): with only two or three, the model memorised each
# (phrasing, numbers) pair and answered a held-out rephrasing of a fact it knew with 53% accuracy.
PLUS = [
    "What is {a} plus {b}?", "Add {a} and {b}.", "What is {a} + {b}?", "{a} + {b} = ?",
    "Compute {a} plus {b}.", "What is the sum of {a} and {b}?", "Calculate {a} + {b}.", "How much is {a} plus {b}?",
]  # fmt: skip
MINUS = [
    "What is {a} minus {b}?", "Subtract {b} from {a}.", "What is {a} - {b}?", "{a} - {b} = ?",
    "Compute {a} minus {b}.", "What is {a} take away {b}?", "Calculate {a} - {b}.", "How much is {a} minus {b}?",
]  # fmt: skip
LARGER = [
    "Which is larger, {a} or {b}?", "Which number is bigger: {a} or {b}?", "What is the larger of {a} and {b}?",
    "Pick the bigger number: {a} or {b}.", "Which is greater, {a} or {b}?",
]  # fmt: skip
SMALLER = [
    "Which is smaller, {a} or {b}?", "Which number is less: {a} or {b}?", "What is the smaller of {a} and {b}?",
    "Pick the smaller number: {a} or {b}.", "Which is lower, {a} or {b}?",
]  # fmt: skip
COUNT = ["Count from {a} to {b}.", "List the numbers from {a} to {b}.", "Count up from {a} to {b}."]
AFTER = [
    "What number comes after {a}?", "What is the next number after {a}?", "Which number follows {a}?",
    "Name the number after {a}.", "What comes right after {a}?",
]  # fmt: skip
BEFORE = [
    "What number comes before {a}?", "What is the number just before {a}?", "Which number precedes {a}?",
    "Name the number before {a}.", "What comes right before {a}?",
]  # fmt: skip
SPELL = ["Spell {w}.", "How do you spell {w}?", "Spell the word {w}.", "Spell out {w}."]
REPEAT = ['Repeat after me: "{s}"', 'Say "{s}".', 'Please repeat "{s}".']
INTRO = ["My name is {n}.", "Hi, I am {n}.", "Hello, my name is {n}."]
REPLY = ["Nice to meet you, {n}.", "Hello, {n}!"]
ASK_NAME = ["What is my name?", "Do you remember my name?", "Who am I?"]

# Sampling weight of each family in training: the families that need arithmetic-like structure
# (plus/minus, counting, spelling) get more steps; they are the slowest to learn. Plus/minus stays the
# weakest family even at 3 (models/tiny-llada-chat/README.md).
FAMILY_WEIGHTS = {
    "arithmetic": 3.0,
    "compare": 1.0,
    "count": 2.0,
    "successor": 1.0,
    "spell": 1.5,
    "facts": 0.75,
    "repeat": 1.5,
    "name": 1.0,
}


@dataclass(frozen=True)
class Example:
    messages: list[dict] = field(hash=False)
    answer: str
    family: str
    keep_in_training: bool = field(default=False, compare=False)

    @property
    def key(self) -> str:
        """The prompt text the split is decided on (every message, so two-turn prompts are covered)."""
        return "\n".join(f"{m['role']}: {m['content']}" for m in self.messages)


def _user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def _arithmetic():
    for a in range(10):
        for b in range(10):
            for t in PLUS:
                yield Example(_user(t.format(a=a, b=b)), str(a + b), "arithmetic")
            if a >= b:
                for t in MINUS:
                    yield Example(_user(t.format(a=a, b=b)), str(a - b), "arithmetic")


def _compare():
    for a in range(10):
        for b in range(10):
            if a != b:
                for t in LARGER:
                    yield Example(_user(t.format(a=a, b=b)), str(max(a, b)), "compare")
                for t in SMALLER:
                    yield Example(_user(t.format(a=a, b=b)), str(min(a, b)), "compare")


def _count():
    # At most six numbers: longer ranges were not learned in the calibration budget.
    for a in range(10):
        for b in range(a + 1, min(a + 6, 10)):
            for t in COUNT:
                yield Example(_user(t.format(a=a, b=b)), " ".join(str(i) for i in range(a, b + 1)), "count")


def _successor():
    for a in range(20):
        if a < 19:
            for t in AFTER:
                yield Example(_user(t.format(a=a)), str(a + 1), "successor")
        if a > 0:
            for t in BEFORE:
                yield Example(_user(t.format(a=a)), str(a - 1), "successor")


def _spell():
    for w in WORDS:
        for i, t in enumerate(SPELL):
            yield Example(_user(t.format(w=w)), "-".join(w), "spell", keep_in_training=i == 0)


def _facts():
    for phrasings, x, answer in FACTS:
        for i, t in enumerate(phrasings):
            yield Example(_user(t.format(x=x)), answer, "facts", keep_in_training=i == 0)


def _repeat():
    # The answer is an exact token copy of the quoted span (its first word has no leading space in both).
    spans = list(WORDS) + [f"{u} {v}" for u in WORDS for v in WORDS if u != v]
    for s in spans:
        for t in REPEAT:
            yield Example(_user(t.format(s=s)), s, "repeat")


def _name():
    for n in NAMES:
        for intro in INTRO:
            for reply in REPLY:
                for ask in ASK_NAME:
                    messages = [
                        {"role": "user", "content": intro.format(n=n)},
                        {"role": "assistant", "content": reply.format(n=n)},
                        {"role": "user", "content": ask},
                    ]
                    yield Example(messages, n, "name")


FAMILIES = {
    "arithmetic": _arithmetic,
    "compare": _compare,
    "count": _count,
    "successor": _successor,
    "spell": _spell,
    "facts": _facts,
    "repeat": _repeat,
    "name": _name,
}


def is_heldout(example: Example) -> bool:
    if example.keep_in_training:
        return False
    digest = hashlib.sha256(example.key.encode()).digest()
    return int.from_bytes(digest[:4], "big") % 100 < HELDOUT_PERCENT


@cache
def _split() -> tuple[dict[str, list[Example]], dict[str, list[Example]]]:
    train: dict[str, list[Example]] = {}
    heldout: dict[str, list[Example]] = {}
    for family, make in FAMILIES.items():
        pool = list(make())
        train[family] = [e for e in pool if not is_heldout(e)]
        heldout[family] = [e for e in pool if is_heldout(e)]
    return train, heldout


def training_pool() -> dict[str, list[Example]]:
    """All training items per family (never a held-out prompt)."""
    return _split()[0]


def heldout_examples(n: int = 400, seed: int = 0) -> list[Example]:
    """A deterministic evaluation list: families taken round-robin, each in a seeded shuffled order."""
    queues = []
    for family in FAMILIES:
        items = list(_split()[1][family])
        random.Random(f"{seed}-{family}").shuffle(items)
        queues.append(items)
    out: list[Example] = []
    while len(out) < n and any(queues):
        for q in queues:
            if q and len(out) < n:
                out.append(q.pop(0))
    return out


def sample_training(rng: random.Random) -> Example:
    """One training example: a family by FAMILY_WEIGHTS, then an item uniformly."""
    pool = training_pool()
    family = rng.choices(list(FAMILY_WEIGHTS), weights=list(FAMILY_WEIGHTS.values()))[0]
    return rng.choice(pool[family])


def tokenizer_training_text() -> list[str]:
    """Texts the BPE tokenizer is trained on: every prompt and answer, plus each word in both forms."""
    texts = []
    train, heldout = _split()
    for pools in (train, heldout):
        for items in pools.values():
            for e in items:
                texts.extend(m["content"] for m in e.messages)
                texts.append(e.answer)
    vocab_words = set(WORDS) | set(NAMES) | {w for _, x, a in FACTS for w in (x.split() + [a])}
    for w in sorted(vocab_words):
        texts += [w, f" {w}", f'"{w}"'] * 50  # enough weight that every word becomes one token
    texts += ["user\n\n", "assistant\n\n", "system\n\n"] * 1000  # the chat template's role headers
    return texts


if __name__ == "__main__":
    train, heldout = _split()
    for family in FAMILIES:
        print(f"{family:12s} train {len(train[family]):5d}  held-out {len(heldout[family]):4d}")
    for e in heldout_examples(8):
        print(e.family, e.messages[-1]["content"], "->", e.answer)
