"""Synthetic chat corpus for the embedded tiny model: task families with exactly checkable answers, plus
conversation families (greetings and small talk, and one fixed help answer for everything else).

Every family is a finite pool of (messages, answer) items, enumerated in a fixed order. A prompt is held
out for evaluation when a hash of its text falls in the held-out bucket, so the split needs no RNG and
a held-out prompt can never be sampled for training. Items whose answer must be memorised (a fact, how
a word is spelled) keep their first phrasing in training, so every held-out prompt asks something the
model was taught under another wording.

Conversations are varied at training time (scripts/train_tiny_model.py): a system prompt on half of the
rows and an earlier exchange on some, drawn from `training_system_prompts()` and the training pool. The
held-out system prompts (`heldout_system_prompts()`) are never seen in training.

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
# Number-taking families accept words as well as digits ("Count from one to five."); answers stay digits.
NUMBER_WORDS = [
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
    "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen",
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

# Conversation families. Few distinct replies on purpose: a 1M-parameter model reproduces a handful of
# fixed sentences exactly, but not many.
# Its first word differs from every other reply's: with "I am ..." (as "I am fine, thank you!") the model
# sometimes committed the short reply's end of turn under the long answer's opening ("Who are you?" -> "I am").
HELP_ANSWER = (
    "This is a tiny demo model bundled with dllm-serve. It can add, compare, count, spell and repeat words."
    " Try: Count from 1 to 5."
)
SMALL_TALK = [  # (prompts, reply)
    (["Hello", "Hi", "Hey", "Hello there", "Hi there", "Hey there", "Good morning", "Good afternoon",
      "Good evening", "Greetings", "Howdy", "Hiya", "Say hello", "Hello, friend", "Hi, nice to meet you",
      "Good day", "Hey, hello", "Hello again"], "Hello! Nice to meet you."),
    (["How are you?", "How are you doing?", "How is it going?", "How do you do?", "Are you okay?",
      "How have you been?", "What's up?", "How are things?", "How is your day?", "Are you well?",
      "How do you feel?", "Hi, how are you?"], "I am fine, thank you!"),
    (["Thanks", "Thank you", "Thanks a lot", "Many thanks", "Thank you very much", "Cheers", "Great, thanks",
      "Thanks for the help", "Thank you so much", "Ok, thanks", "Nice, thank you", "Thx"], "You are welcome!"),
    (["Bye", "Goodbye", "See you", "See you later", "Good night", "Bye bye", "Farewell", "Talk to you later",
      "I have to go", "See you soon", "Later", "Take care"], "Goodbye!"),
    (["Who are you?", "What are you?", "What can you do?", "Help", "What is your name?", "Are you a robot?",
      "Tell me about yourself.", "What do you know?", "Introduce yourself.", "Are you an AI?",
      "What are you good at?", "How can you help me?", "Who made you?", "What model are you?", "Are you human?",
      "What are your skills?", "Can you chat?", "Who built you?", "What is this?", "Is anyone there?",
      "Tell me who you are.", "What should I ask you?"], HELP_ANSWER),
]  # fmt: skip
SMALL_TALK_ENDINGS = ["", ".", "!", "?", "!!", " :)"]
# Prompts outside every family: phrasings x topics, all answered with HELP_ANSWER (never an invented fact).
OTHER_PHRASINGS = [
    "Write a {form} about {topic}.", "Explain {topic}.", "What is {topic}?", "Tell me about {topic}.",
    "Can you help me with {topic}?", "Why is {topic} important?", "What do you think about {topic}?",
    "Give me three facts about {topic}.", "Describe {topic} in detail.", "Tell me a story about {topic}.",
    "Summarize the history of {topic}.", "How does {topic} work?", "Teach me {topic}.",
    "I need advice about {topic}.", "Is {topic} good or bad?", "Compare {topic} and {other}.",
    "Write an essay on {topic}.", "What is the future of {topic}?", "Make a plan for {topic}.",
    "List the pros and cons of {topic}.",
]  # fmt: skip
OTHER_FORMS = ["poem", "haiku", "song", "story", "letter", "report", "joke", "limerick"]
OTHER_TOPICS = [
    "the sea", "quantum physics", "love", "history", "music", "computers", "the weather", "politics",
    "football", "cooking", "climate change", "the internet", "philosophy", "art", "money", "friendship",
    "space travel", "the ocean", "mountains", "coffee", "chess", "school", "my job", "taxes", "dinosaurs",
    "machine learning", "Python", "the stock market", "gardening", "sleep", "the brain", "electricity",
    "volcanoes", "the Roman empire", "jazz", "my homework", "a trip to Paris", "robots", "vaccines", "winter",
]  # fmt: skip
OTHER_STANDALONE = [
    "Tell me a joke.", "What time is it?", "What is the weather today?", "What is the meaning of life?",
    "Translate hello into French.", "Write some code.", "Do you like music?", "What should I eat?",
    "Who won the game yesterday?", "Can you browse the web?", "What is today's date?", "Sing a song.",
    "asdfgh", "???", "ok", "Test", "Continue.", "Please answer in detail.", "Why?", "Write a haiku.",
    "What is the capital of Peru?", "How many legs does a snake have?", "What color is a cloud?",
    "Spell supercalifragilistic.", "Add 123456 and 789.", "What is the square root of 2?",
]  # fmt: skip

# System prompts: common assistant ones, personas with instructions, and random instructions. Split by
# hash like the prompts, so the evaluation's system prompts are new to the model.
COMMON_SYSTEM_PROMPTS = [
    "You are a helpful assistant.", "You are a helpful, respectful and honest assistant.",
    "You are a friendly chatbot.", "You are an AI assistant.", "Be concise.", "Answer briefly.",
    "You are ChatGPT, a large language model.", "You are a helpful assistant. Answer the user's question.",
    "Always answer truthfully.", "Keep your answers short.",
]  # fmt: skip
PERSONAS = [
    "You are a helpful assistant.", "You are a math tutor.", "You are a pirate.", "You are a teacher.",
    "You are a careful assistant.", "You are a poet.", "You are a customer support agent.", "You are a robot.",
    "You are a kind librarian.", "You are an expert programmer.", "You are a chef.", "You are a scientist.",
]  # fmt: skip
INSTRUCTIONS = [
    "Answer in one word.", "Be polite.", "Think step by step.", "Do not use emojis.", "Reply in English.",
    "Keep it short.", "Use simple words.", "Never lie.", "Be friendly and clear.", "Avoid long answers.",
    "The user is a student.", "Today is Monday.", "Format answers as plain text.", "Answer the last question.",
]  # fmt: skip

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
    "small_talk": 0.75,
    "help": 1.0,
}
# The families the quality bar (>= 95% held-out exact match) was set on; the conversation families are
# reported as their own rows.
TASK_FAMILIES = ("arithmetic", "compare", "count", "successor", "spell", "facts", "repeat", "name")


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


def _numbered(template: str, **numbers: int):
    """The prompt with its numbers as digits, then as words (the words sentence-cased at the start)."""
    yield template.format(**numbers)
    words = template.format(**{k: NUMBER_WORDS[v] for k, v in numbers.items()})
    yield words[0].upper() + words[1:]


def _arithmetic():
    for a in range(10):
        for b in range(10):
            for t in PLUS:
                for prompt in _numbered(t, a=a, b=b):
                    yield Example(_user(prompt), str(a + b), "arithmetic")
            if a >= b:
                for t in MINUS:
                    for prompt in _numbered(t, a=a, b=b):
                        yield Example(_user(prompt), str(a - b), "arithmetic")


def _compare():
    for a in range(10):
        for b in range(10):
            if a != b:
                for t in LARGER:
                    for prompt in _numbered(t, a=a, b=b):
                        yield Example(_user(prompt), str(max(a, b)), "compare")
                for t in SMALLER:
                    for prompt in _numbered(t, a=a, b=b):
                        yield Example(_user(prompt), str(min(a, b)), "compare")


def _count():
    # At most six numbers: longer ranges were not learned in the calibration budget.
    for a in range(10):
        for b in range(a + 1, min(a + 6, 10)):
            for t in COUNT:
                for prompt in _numbered(t, a=a, b=b):
                    yield Example(_user(prompt), " ".join(str(i) for i in range(a, b + 1)), "count")


def _successor():
    for a in range(20):
        if a < 19:
            for t in AFTER:
                for prompt in _numbered(t, a=a):
                    yield Example(_user(prompt), str(a + 1), "successor")
        if a > 0:
            for t in BEFORE:
                for prompt in _numbered(t, a=a):
                    yield Example(_user(prompt), str(a - 1), "successor")


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


def _small_talk():
    for prompts, reply in SMALL_TALK:
        for text in prompts:
            bare = text.rstrip(".!?")
            for ending in SMALL_TALK_ENDINGS:
                for variant in {bare + ending, (bare + ending).lower()}:
                    yield Example(_user(variant), reply, "small_talk", keep_in_training=variant == text)


def _help():
    for i, t in enumerate(OTHER_PHRASINGS):
        for j, topic in enumerate(OTHER_TOPICS):
            other = OTHER_TOPICS[(i + j + 7) % len(OTHER_TOPICS)]
            for form in OTHER_FORMS if "{form}" in t else [""]:
                yield Example(_user(t.format(form=form, topic=topic, other=other)), HELP_ANSWER, "help")
    for text in OTHER_STANDALONE:
        yield Example(_user(text), HELP_ANSWER, "help")


FAMILIES = {
    "arithmetic": _arithmetic,
    "compare": _compare,
    "count": _count,
    "successor": _successor,
    "spell": _spell,
    "facts": _facts,
    "repeat": _repeat,
    "name": _name,
    "small_talk": _small_talk,
    "help": _help,
}


def _in_heldout_bucket(text: str) -> bool:
    digest = hashlib.sha256(text.encode()).digest()
    return int.from_bytes(digest[:4], "big") % 100 < HELDOUT_PERCENT


def is_heldout(example: Example) -> bool:
    return not example.keep_in_training and _in_heldout_bucket(example.key)


@cache
def _system_prompts() -> tuple[list[str], list[str]]:
    prompts = list(COMMON_SYSTEM_PROMPTS)
    prompts += [f"{p} {i}" for p in PERSONAS for i in INSTRUCTIONS]
    prompts += [f"{i} {j}" for i in INSTRUCTIONS for j in INSTRUCTIONS if i != j]
    prompts = list(dict.fromkeys(prompts))
    # The two most common ones always stay in training: front-ends send exactly these.
    keep = set(COMMON_SYSTEM_PROMPTS[:2])
    heldout = [p for p in prompts if p not in keep and _in_heldout_bucket("system: " + p)]
    return [p for p in prompts if p not in heldout], heldout


def training_system_prompts() -> list[str]:
    return _system_prompts()[0]


def heldout_system_prompts() -> list[str]:
    return _system_prompts()[1]


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


def heldout_examples(n: int = 400, seed: int = 0, families: tuple[str, ...] = TASK_FAMILIES) -> list[Example]:
    """A deterministic evaluation list: families taken round-robin, each in a seeded shuffled order."""
    queues = []
    for family in families:
        items = list(_split()[1][family])
        random.Random(f"{seed}-{family}").shuffle(items)
        queues.append(items)
    out: list[Example] = []
    while len(out) < n and any(queues):
        for q in queues:
            if q and len(out) < n:
                out.append(q.pop(0))
    return out


def tokenizer_training_text() -> list[str]:
    """Texts the BPE tokenizer is trained on: every prompt and answer, plus each word in both forms."""
    texts = []
    train, heldout = _split()
    for pools in (train, heldout):
        for items in pools.values():
            for e in items:
                texts.extend(m["content"] for m in e.messages)
                texts.append(e.answer)
    texts += training_system_prompts() + heldout_system_prompts()
    vocab_words = set(WORDS) | set(NAMES) | set(NUMBER_WORDS) | {w for _, x, a in FACTS for w in (x.split() + [a])}
    vocab_words |= {w.capitalize() for w in NUMBER_WORDS}
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
