"""Synthetic chat corpus for the embedded tiny model (v3): task families with exactly checkable answers,
open requests answered by a few template sentences, and conversation families (small talk, and one short
help answer for everything the model cannot do).

Every family is a finite pool of (messages, answer) items, enumerated in a fixed order. Each family has
training phrasings and held-out phrasings: a prompt written in a held-out phrasing is never trained on, so
the evaluation measures whether the model understood the task words rather than memorised the templates.
Within the training phrasings a prompt is also held out when a hash of its text falls in the held-out
bucket (no RNG needed, and a held-out prompt can never be sampled for training). Items whose answer must be
memorised (a fact, how a word is spelled) keep their first phrasing in training.

What the model cannot do gets the help answer, never an invented one, and the corpus teaches that
explicitly: numbers outside each family's range, words and names it does not know, and requests outside
every family are the "out_of_range" and "help" families.

Open requests ("Write one short sentence about a cat.") are the "sentence" family: the answer is one of
`SENTENCE_TEMPLATES` with the topic filled in, drawn uniformly per training row, so the model learns
several equally likely answers and temperature > 0 varies them. The templates differ in one token only
(the adjective) so that a decoder committing several tokens per step cannot mix two of them.

Conversations are varied at training time (scripts/train_tiny_model.py): a system prompt on half of the
rows, an earlier exchange (with the model's own answer as the assistant turn) on some, and some rows as a
raw prompt without the chat template, as /v1/completions sends it.

The word lists are small on purpose: the tokenizer turns every task word into one token (with and
without a leading space), which is what lets a 1M-parameter model learn copy and spelling tasks in
minutes on a CPU.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import string
from dataclasses import dataclass, field
from functools import cache

# The shipped weights were trained in three stages (models/tiny-llada-chat/README.md): stage 1 on this corpus
# without the rows marked "stage 2" below, stages 2 and 3 on all of it. `TINY_CHAT_CORPUS_STAGE=1` in the environment
# of the process that imports this module (the trainer's) gives stage 1's corpus, the same rows, split and
# tokenizer as at commit 3312607 where stage 1 ran (tests/test_embedded_model.py checks the tokenizer).
STAGE = int(os.environ.get("TINY_CHAT_CORPUS_STAGE", "2"))
if STAGE not in (1, 2):
    raise ValueError(f"TINY_CHAT_CORPUS_STAGE must be 1 or 2, not {STAGE}")

HELDOUT_PERCENT = 15

WORDS = [
    "apple", "banana", "cherry", "grape", "lemon", "mango", "peach", "plum",
    "cat", "dog", "bird", "fish", "horse", "mouse", "tiger", "lion",
    "red", "blue", "green", "yellow", "black", "white", "pink", "brown",
    "sun", "moon", "star", "rain", "snow", "tree", "river", "stone",
    "house", "book", "chair", "table", "bread", "milk", "water", "cake",
]  # fmt: skip
COLORS = {"red", "blue", "green", "yellow", "black", "white", "pink", "brown"}
TOPICS = [w for w in WORDS if w not in COLORS]  # what an open request can be about
NAMES = [
    "Alice", "Bob", "Carol", "David", "Emma", "Frank", "Grace", "Henry", "Ivy", "Jack",
    "Kate", "Leo", "Mia", "Noah", "Olivia", "Paul", "Rose", "Sam", "Tom", "Zoe",
]  # fmt: skip
# Words and names the model does not know: spelling, repeating or greeting them gets the help answer.
# The evaluation's out-of-range set uses other words (random letters drawn at run time).
UNKNOWN_WORDS = [
    "elephant", "window", "computer", "garden", "pencil", "rocket", "guitar", "island", "kitchen", "planet",
    "bottle", "candle", "doctor", "forest", "jacket", "ladder", "monkey", "orange", "pillow", "silver",
    "tomato", "violin", "wallet", "zebra", "bridge", "castle", "dragon", "flower", "hammer", "honey",
    "mirror", "needle", "ocean", "parrot", "rabbit", "sugar", "turtle", "wizard", "yogurt", "basket",
]  # fmt: skip
UNKNOWN_NAMES = [
    "Xavier", "Beatrice", "Ingrid", "Mohammed", "Priya", "Yuki", "Dmitri", "Fatima", "Oscar", "Quentin",
    "Ursula", "Wendy", "Hiroshi", "Lucia", "Nikolai", "Sven", "Aisha", "Carlos", "Elena", "Gustav",
]  # fmt: skip
# Number-taking families accept words as well as digits ("Count from one to five."); answers stay digits.
NUMBER_WORDS = [
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
    "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen",
]  # fmt: skip
ADJECTIVES = ["nice", "big", "small", "here", "good"]
# The open-request answers: one template, five equally likely adjectives (see the module docstring).
SENTENCE_TEMPLATES = [f"The {{w}} is {adj}." for adj in ADJECTIVES]

# (training phrasings, held-out phrasings, subject, answer); the first phrasing of each fact stays in training.
FACTS = [
    (["What is the capital of {x}?", "Name the capital of {x}.", "capital of {x}", "Which is the capital of {x}?",
      "Do you know the capital of {x}?", "Name the capital city of {x}."],
     ["Which city is the capital of {x}?"], x, a)
    for x, a in [
        ("France", "Paris"), ("Italy", "Rome"), ("Japan", "Tokyo"), ("Spain", "Madrid"),
        ("Germany", "Berlin"), ("England", "London"), ("Egypt", "Cairo"), ("Russia", "Moscow"),
    ]
] + [
    (["What color is {x}?", "What is the color of {x}?", "color of {x}"], ["Tell me the color of {x}."], x, a)
    for x, a in [
        ("the sky", "blue"), ("grass", "green"), ("snow", "white"), ("the sun", "yellow"), ("a lemon", "yellow"),
    ]
] + [
    (["How many legs does {x} have?", "How many legs has {x}?", "legs of {x}"], ["Count the legs of {x}."], x, a)
    for x, a in [("a dog", "4"), ("a spider", "8"), ("a bird", "2"), ("a fish", "0"), ("a cat", "4")]
]  # fmt: skip
UNKNOWN_FACTS = [
    "What is the capital of Peru?", "Name the capital of Canada.", "What is the capital of Brazil?",
    "What color is a cloud?", "What is the color of the sea?", "How many legs does a snake have?",
    "How many legs has an ant?", "What is the capital of Mars?", "What color is a frog?", "capital of Chile",
]  # fmt: skip

# Each family: (training phrasings, held-out phrasings). The held-out ones reuse the task words of the
# training ones ("add", "largest", "after", "spell") in new sentences.
PLUS = (
    ["What is {a} plus {b}?", "Add {a} and {b}.", "What is {a} + {b}?", "{a} + {b} = ?", "Compute {a} plus {b}.",
     "What is the sum of {a} and {b}?", "Calculate {a} + {b}.", "How much is {a} plus {b}?", "what's {a} plus {b}",
     "{a} plus {b}", "Please add {a} to {b}.", "Sum {a} and {b}.", "{a}+{b}",
     "What do you get if you add {a} and {b}?"],
    ["What's {a} + {b}?", "Can you add {a} and {b}?", "Tell me {a} plus {b}."],
)  # fmt: skip
MINUS = (
    ["What is {a} minus {b}?", "Subtract {b} from {a}.", "What is {a} - {b}?", "{a} - {b} = ?",
     "Compute {a} minus {b}.", "What is {a} take away {b}?", "Calculate {a} - {b}.", "How much is {a} minus {b}?",
     "what's {a} minus {b}", "{a} minus {b}", "{a}-{b}", "What is the difference of {a} and {b}?",
     "What do you get if you subtract {b} from {a}?", "Take {b} away from {a}."],
    ["What's {a} - {b}?", "Can you subtract {b} from {a}?", "Tell me {a} minus {b}."],
)  # fmt: skip
LARGER = (
    ["Which is larger, {a} or {b}?", "Which number is bigger: {a} or {b}?", "What is the larger of {a} and {b}?",
     "Pick the bigger number: {a} or {b}.", "Which is greater, {a} or {b}?", "which is bigger {a} or {b}",
     "What is the largest of {a}, {b}, {c}?", "Which is the biggest: {a}, {b} or {c}?",
     "Find the greatest of {a}, {b} and {c}.", "What is the biggest number in {a}, {b}, {c}?",
     "largest of {a}, {b}, {c}"],
    ["Which of {a} and {b} is larger?", "What is the greatest of {a}, {b}, {c}?",
     "Tell me the bigger of {a} and {b}."],
)  # fmt: skip
SMALLER = (
    ["Which is smaller, {a} or {b}?", "Which number is less: {a} or {b}?", "What is the smaller of {a} and {b}?",
     "Pick the smaller number: {a} or {b}.", "Which is lower, {a} or {b}?", "which is smaller {a} or {b}",
     "What is the smallest of {a}, {b}, {c}?", "Which is the least: {a}, {b} or {c}?",
     "Find the lowest of {a}, {b} and {c}.", "What is the smallest number in {a}, {b}, {c}?",
     "smallest of {a}, {b}, {c}"],
    ["Which of {a} and {b} is smaller?", "What is the least of {a}, {b}, {c}?", "Tell me the smaller of {a} and {b}."],
)  # fmt: skip
COUNT = (
    ["Count from {a} to {b}.", "List the numbers from {a} to {b}.", "Count up from {a} to {b}.", "count {a} to {b}",
     "Please count from {a} to {b}", "Count from {a} to {b}, please."],
    ["Can you count from {a} to {b}?", "Say the numbers from {a} to {b}."],
)  # fmt: skip
COUNT_TO = (["Count to {b}.", "count to {b}", "Please count to {b}."], ["Can you count to {b}?"])
AFTER = (
    ["What number comes after {a}?", "What is the next number after {a}?", "Which number follows {a}?",
     "Name the number after {a}.", "What comes right after {a}?", "What comes after {a}?",
     "What number is next after {a}?", "next after {a}"],
    ["What's the number after {a}?", "Tell me what comes after {a}."],
)  # fmt: skip
BEFORE = (
    ["What number comes before {a}?", "What is the number just before {a}?", "Which number precedes {a}?",
     "Name the number before {a}.", "What comes right before {a}?", "What comes before {a}?",
     "What number is just before {a}?", "before {a}"],
    ["What's the number before {a}?", "Tell me what comes before {a}."],
)  # fmt: skip
# The word also stands inside the sentence ("Spell {w} for me."): with it always last, the model learned to
# spell the prompt's last word, and "How is {w} spelled?" got garbled letters ("t-i-l-." for table) or the
# help answer (held-out spell 46-77% in the runs of 4 December; docs/embedded-model-runs.md). The last three
# put the word before the verb, as the held-out `How is {w} spelled?` does: with the word always after it,
# run Z0 spelled 3 of that phrasing's 5 test words right (runs A to C in the model card).
SPELL = (
    ["Spell {w}.", "How do you spell {w}?", "Spell the word {w}.", "Spell out {w}.", "spell {w}", "Can you spell {w}?",
     "Spell {w} for me.", "Spell {w}, please.", "Write {w} letter by letter.", "Take {w} and spell it.",
     "The word is {w}. Spell it.", "{w}, how do you spell it?"],
    ["How is {w} spelled?", "Please spell {w}."],
)  # fmt: skip
# Quoted spans are exact token copies; unquoted ones ("Repeat after me: green") start with the word's
# leading-space token, which the answer writes without the space.
REPEAT = (
    ['Repeat after me: "{s}"', 'Say "{s}".', 'Please repeat "{s}".', 'Echo "{s}".', 'Repeat "{s}"',
     "Repeat after me: {s}", "Say {s}", "Echo {s}", "repeat {s}"],
    ['Can you say "{s}"?', "Please repeat after me: {s}"],
)  # fmt: skip
INTRO = (["My name is {n}.", "Hi, I am {n}.", "Hello, my name is {n}.", "I am {n}.", "Call me {n}.", "my name is {n}"],
         ["Hi! My name is {n}.", "Hello, I am {n}!"])  # fmt: skip
# What the model replies to an introduction: a chat client feeds this back as the assistant turn.
INTRO_REPLY = "Nice to meet you, {n}."
REPLY = [INTRO_REPLY, "Hello, {n}!", "Hi {n}!"]  # assistant turns seen in history (the first is its own)
ASK_NAME = (["What is my name?", "Do you remember my name?", "Who am I?", "what's my name", "Tell me my name.",
             "Say my name.", "What am I called?", "Do you recall my name?", "What did I say my name was?",
             "Do you know who I am?"],
            ["Can you tell me my name?", "Do you know my name?"])  # fmt: skip
SENTENCE = (
    ["Write one short sentence about {t}.", "Write a sentence about {t}.", "Write a story about {t}.",
     "Write a poem about {t}.", "Tell me a story about {t}.", "Write a haiku about {t}.",
     "Say something about {t}.", "Write something about {t}", "Make a sentence about {t}.",
     "write a short sentence about {t}"],
    ["Can you write a short sentence about {t}?", "Write me a poem about {t}."],
)  # fmt: skip

PHRASINGS = [PLUS, MINUS, LARGER, SMALLER, COUNT, COUNT_TO, AFTER, BEFORE, SPELL, REPEAT, INTRO, ASK_NAME, SENTENCE]
# The same with each fact's (training, held-out) phrasings: every template a prompt of the corpus comes from.
ALL_PHRASINGS = PHRASINGS + [(trained, heldout) for trained, heldout, *_ in FACTS]

# The help answer: at most 20 tokens (it must fit max_tokens 32 with room), naming what works. Its first
# word differs from every other reply's: with "I am ..." (as "I am fine, thank you!") the model once
# committed the short reply's end of turn under the long answer's opening.
HELP_ANSWER = "This is a tiny demo model. It can add, compare, count, spell and repeat words."

# Conversation families. Few distinct replies on purpose: a 1M-parameter model reproduces a handful of
# fixed sentences exactly, but not many. The help group holds several `Who ...?` prompts (stage 2) so that `Who
# are you?` is not its only one: it differs from `How are you?` by one token, and runs answered it `I am fine,
# thank you!`.
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
      "Tell me who you are.", "What should I ask you?"]
     + (["Who is this?", "Who is there?", "Who is speaking?", "Who are you, bot?", "Who are you again?",
         "Who do I talk to?"] if STAGE == 2 else []), HELP_ANSWER),
]  # fmt: skip
SMALL_TALK_ENDINGS = ["", ".", "!", "?", "!!", " :)"]
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
# (plus/minus, compare over three numbers, spelling) and the copy tasks (repeat, name) get more steps; they are
# the slowest to learn. Moving weight from compare, count and sentence (>= 94% at batch 32) to repeat, name
# and successor (38-79%) took a 29-minute run from 78.0% to 82.0% of new phrasings (4 December). Arithmetic
# went from 3 to 3.5 when differences below zero moved into it from a family of their own (runs V and W in
# docs/embedded-model-runs.md).
FAMILY_WEIGHTS = {
    "arithmetic": 3.5,
    "compare": 1.25,
    "count": 1.0,
    "successor": 1.5,
    "spell": 2.0,
    "facts": 0.5,
    "repeat": 3.0,
    "name": 2.0,
    "sentence": 0.75,
    "small_talk": 1.0,
    "out_of_range": 2.5,
    "help": 0.75,
}
# The families the quality bar (>= 90% on held-out phrasings) is set on; the conversation families are
# reported as their own rows.
TASK_FAMILIES = ("arithmetic", "compare", "count", "successor", "spell", "facts", "repeat", "name", "sentence")


@dataclass(frozen=True)
class Example:
    messages: list[dict] = field(hash=False)
    answer: str
    family: str
    keep_in_training: bool = field(default=False, compare=False)
    heldout_phrasing: bool = field(default=False, compare=False)
    # Every right answer when there are several (the open requests); `answer` is the first.
    answers: tuple[str, ...] = field(default=(), compare=False)

    @property
    def key(self) -> str:
        """The prompt text the split is decided on (every message, so two-turn prompts are covered)."""
        return "\n".join(f"{m['role']}: {m['content']}" for m in self.messages)

    @property
    def right_answers(self) -> tuple[str, ...]:
        return self.answers or (self.answer,)

    def is_right(self, text: str) -> bool:
        return text.strip() in self.right_answers

    @property
    def single_turn(self) -> bool:
        return len(self.messages) == 1


def _user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def _phrasings(pair: tuple[list[str], list[str]]):
    """(template, is held out) for every phrasing of a family."""
    train, heldout = pair
    return [(t, False) for t in train] + [(t, True) for t in heldout]


def _numbered(template: str, **numbers: int):
    """The prompt with its numbers as digits, then as words (the words sentence-cased at the start)."""
    yield template.format(**numbers)
    if all(v < len(NUMBER_WORDS) for v in numbers.values()):
        words = template.format(**{k: NUMBER_WORDS[v] for k, v in numbers.items()})
        yield words[0].upper() + words[1:] if template[0].isupper() else words


def _arithmetic():
    for a in range(10):
        for b in range(10):
            for t, held in _phrasings(PLUS):
                for prompt in _numbered(t, a=a, b=b):
                    yield Example(_user(prompt), str(a + b), "arithmetic", heldout_phrasing=held)
            # Differences below zero are answered too (`2 - 8` -> `-6`): trained as out of range instead, they
            # made subtraction itself look like the help answer's task, and runs answered new phrasings of
            # `9 minus 2` with it (docs/embedded-model-runs.md).
            for t, held in _phrasings(MINUS):
                for prompt in _numbered(t, a=a, b=b):
                    yield Example(_user(prompt), str(a - b), "arithmetic", heldout_phrasing=held)


def _compare_numbers(template: str, rng: random.Random):
    """Number tuples for a comparison phrasing: every pair, or 60 triples of distinct digits."""
    if "{c}" not in template:
        return [dict(a=a, b=b, c=0) for a in range(10) for b in range(10) if a != b]
    triples = [(a, b, c) for a in range(10) for b in range(10) for c in range(10) if len({a, b, c}) == 3]
    return [dict(a=a, b=b, c=c) for a, b, c in rng.sample(triples, 60)]


def _compare():
    rng = random.Random("compare")
    for pair, pick in ((LARGER, max), (SMALLER, min)):
        for t, held in _phrasings(pair):
            for nums in _compare_numbers(t, rng):
                values = [nums["a"], nums["b"]] + ([nums["c"]] if "{c}" in t else [])
                for prompt in _numbered(t, **nums):
                    yield Example(_user(prompt), str(pick(values)), "compare", heldout_phrasing=held)


def _count():
    # At most six numbers: longer ranges were not learned in the calibration budget (they get the help answer).
    for a in range(10):
        for b in range(a + 1, min(a + 6, 10)):
            for t, held in _phrasings(COUNT):
                for prompt in _numbered(t, a=a, b=b):
                    yield Example(
                        _user(prompt), " ".join(str(i) for i in range(a, b + 1)), "count", heldout_phrasing=held
                    )
    for b in range(2, 7):
        for t, held in _phrasings(COUNT_TO):
            for prompt in _numbered(t, b=b):
                yield Example(_user(prompt), " ".join(str(i) for i in range(1, b + 1)), "count", heldout_phrasing=held)


def _successor():
    for a in range(20):
        for t, held in _phrasings(AFTER):
            for prompt in _numbered(t, a=a):
                yield Example(_user(prompt), str(a + 1), "successor", heldout_phrasing=held)
        if a > 0:
            for t, held in _phrasings(BEFORE):
                for prompt in _numbered(t, a=a):
                    yield Example(_user(prompt), str(a - 1), "successor", heldout_phrasing=held)


def _spell():
    for w in WORDS:
        for i, (t, held) in enumerate(_phrasings(SPELL)):
            yield Example(_user(t.format(w=w)), "-".join(w), "spell", keep_in_training=i == 0, heldout_phrasing=held)


def _facts():
    for train, heldout, x, answer in FACTS:
        for i, (t, held) in enumerate(_phrasings((train, heldout))):
            yield Example(_user(t.format(x=x)), answer, "facts", keep_in_training=i == 0, heldout_phrasing=held)


def _repeat():
    # One or two known words; a pair's words differ. 400 of the 1,560 pairs, so single words are not drowned.
    pairs = [f"{u} {v}" for u in WORDS for v in WORDS if u != v]
    spans = list(WORDS) + random.Random("repeat").sample(pairs, 400)
    for s in spans:
        for t, held in _phrasings(REPEAT):
            yield Example(_user(t.format(s=s)), s, "repeat", heldout_phrasing=held)


# Two-turn conversations drawn per introduction. All 21 (reply, question) pairs made the single-turn
# introduction 1 row in 22 of the family, and the model then answered "My name is Rose." with a number.
NAME_PAIRS_PER_INTRO = 3


def _name():
    for n in NAMES:
        for intro, held_intro in _phrasings(INTRO):
            yield Example(_user(intro.format(n=n)), INTRO_REPLY.format(n=n), "name", heldout_phrasing=held_intro)
            pairs = [(reply, ask) for reply in REPLY for ask in _phrasings(ASK_NAME)]
            for reply, (ask, held_ask) in random.Random(f"{n} {intro}").sample(pairs, NAME_PAIRS_PER_INTRO):
                messages = [
                    {"role": "user", "content": intro.format(n=n)},
                    {"role": "assistant", "content": reply.format(n=n)},
                    {"role": "user", "content": ask},
                ]
                yield Example(messages, n, "name", heldout_phrasing=held_intro or held_ask)


def _article(w: str) -> str:
    return ("an " if w[0] in "aeiou" else "a ") + w


def _sentence():
    for w in TOPICS:
        answers = tuple(s.format(w=w) for s in SENTENCE_TEMPLATES)
        for t, held in _phrasings(SENTENCE):
            for topic in (_article(w), "the " + w, w):
                yield Example(_user(t.format(t=topic)), answers[0], "sentence", heldout_phrasing=held, answers=answers)


def _small_talk():
    for prompts, reply in SMALL_TALK:
        for text in prompts:
            bare = text.rstrip(".!?")
            for ending in SMALL_TALK_ENDINGS:
                for variant in dict.fromkeys((bare + ending, (bare + ending).lower())):  # in a fixed order
                    yield Example(_user(variant), reply, "small_talk", keep_in_training=variant == text)


def _out_of_range():
    """The families' own phrasings (training ones only) with what the model cannot do: numbers past its
    range, long or backward counts, words and names it does not know."""
    rng = random.Random("out of range")

    def trained(pair):
        return pair[0]

    def big() -> int:
        return rng.randint(10, 99) if rng.random() < 0.8 else rng.randint(100, 999)

    for _ in range(500):  # sums and differences with a number past 9
        a, b = (big(), rng.randint(0, 99)) if rng.random() < 0.5 else (rng.randint(0, 99), big())
        t = rng.choice(trained(PLUS) + trained(MINUS))
        yield Example(_user(t.format(a=a, b=b)), HELP_ANSWER, "out_of_range")
    for _ in range(300):  # comparisons of two-digit numbers
        t = rng.choice(trained(LARGER) + trained(SMALLER))
        nums = dict(a=big(), b=rng.randint(0, 99), c=rng.randint(0, 99))
        if rng.random() < 0.5:
            nums["a"], nums["b"] = nums["b"], nums["a"]
        yield Example(_user(t.format(**nums)), HELP_ANSWER, "out_of_range")
    for a in range(10):  # counts of 7 or more numbers, past 9, or backwards
        for b in range(10):
            if b < a or b - a >= 6:
                t = rng.choice(trained(COUNT))
                for prompt in _numbered(t, a=a, b=b):
                    yield Example(_user(prompt), HELP_ANSWER, "out_of_range")
    for _ in range(150):
        t = rng.choice(trained(COUNT))
        a = rng.randint(0, 15)
        yield Example(_user(t.format(a=a, b=rng.randint(max(a + 1, 10), 100))), HELP_ANSWER, "out_of_range")
    for b in list(range(7, 20)) + [20, 50, 100]:
        for t in trained(COUNT_TO):
            for prompt in _numbered(t, b=b):
                yield Example(_user(prompt), HELP_ANSWER, "out_of_range")
    for _ in range(400):  # successors past 20, two-digit ones as often as longer ones
        t = rng.choice(trained(AFTER) + trained(BEFORE))
        a = rng.randint(21, 99) if rng.random() < 0.5 else rng.randint(100, 999)
        yield Example(_user(t.format(a=a)), HELP_ANSWER, "out_of_range")
    # Unknown words: real ones, syllable words and random letters (which split into rare tokens: a run trained
    # on the first two only answered "Spell ufcjl" with letters and "Say altqfqdsl" with "Goodbye!").
    unknown = UNKNOWN_WORDS + [_pseudo_word(rng) for _ in range(60)] + [_random_letters(rng) for _ in range(60)]
    for w in unknown:
        for t in rng.sample(trained(SPELL), 3):
            yield Example(_user(t.format(w=w)), HELP_ANSWER, "out_of_range")
        for t in rng.sample(trained(REPEAT), 3):
            s = w if rng.random() < 0.6 else " ".join(rng.sample([w, rng.choice(WORDS)], 2))
            yield Example(_user(t.format(s=s)), HELP_ANSWER, "out_of_range")
    made_up = [(_pseudo_word(rng) if i % 2 else _random_letters(rng)).capitalize() for i in range(60)]
    for n in UNKNOWN_NAMES + made_up[:40]:
        for t in rng.sample(trained(INTRO), 3):
            yield Example(_user(t.format(n=n)), HELP_ANSWER, "out_of_range")
    for text in UNKNOWN_FACTS:
        yield Example(_user(text), HELP_ANSWER, "out_of_range")
    capital_phrasings = FACTS[0][0]  # the capitals' training phrasings (FACTS starts with them)
    for place in made_up[40:]:  # countries it does not know
        yield Example(_user(rng.choice(capital_phrasings).format(x=place)), HELP_ANSWER, "out_of_range")
    # More successors of three-digit numbers (a run answered `What is the next number after 172?` with `13`),
    # drawn last and from their own generator so that the draws above stay as they were.
    rng = random.Random("three-digit successors")
    for _ in range(300):
        t = rng.choice(trained(AFTER) + trained(BEFORE))
        yield Example(_user(t.format(a=rng.randint(100, 999))), HELP_ANSWER, "out_of_range")
    # Sums and differences of a number past 9 with a single digit, either way round: the draws above pair two
    # numbers from 0-99, so one past 9 beside one digit was rare, and runs V and W answered most of their
    # out-of-range inventions there (`Tell me 42 minus 6.` -> `-3`).
    rng = random.Random("past 9 beside a digit")
    for _ in range(400):
        big, digit = (rng.randint(10, 99) if rng.random() < 0.8 else rng.randint(100, 999)), rng.randint(0, 9)
        a, b = (big, digit) if rng.random() < 0.6 else (digit, big)
        yield Example(_user(rng.choice(trained(PLUS) + trained(MINUS)).format(a=a, b=b)), HELP_ANSWER, "out_of_range")
    # Every training phrasing of spelling and repeating for each real word it does not know (three of each
    # above): runs still repeated or spelled `window` and other real words of this list.
    for w in UNKNOWN_WORDS:
        for t in trained(SPELL):
            yield Example(_user(t.format(w=w)), HELP_ANSWER, "out_of_range")
        for t in trained(REPEAT):
            yield Example(_user(t.format(s=w)), HELP_ANSWER, "out_of_range")
    # Stage 2: a two-digit number minus a digit, in every training phrasing of subtraction: with only the 400 rows
    # above, half of them sums, run C0 still answered `How much is 86 minus 9?` with `-2` and `95-9` with a number.
    if STAGE == 1:
        return
    rng = random.Random("past 9 minus a digit")
    for _ in range(600):
        t = rng.choice(trained(MINUS))
        yield Example(_user(t.format(a=rng.randint(10, 99), b=rng.randint(0, 9))), HELP_ANSWER, "out_of_range")


def _random_letters(rng: random.Random) -> str:
    """A made-up word of 4 to 9 random letters (the evaluation draws its own with another seed)."""
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(4, 9)))


def _pseudo_word(rng: random.Random) -> str:
    """A made-up lowercase word (consonant-vowel syllables): never a word the model knows."""
    syllables = rng.randint(2, 4)
    return "".join(rng.choice("bdfgklmnprstvz") + rng.choice("aeiou") for _ in range(syllables))


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
    "sentence": _sentence,
    "small_talk": _small_talk,
    "out_of_range": _out_of_range,
    "help": _help,
}


def _in_heldout_bucket(text: str) -> bool:
    digest = hashlib.sha256(text.encode()).digest()
    return int.from_bytes(digest[:4], "big") % 100 < HELDOUT_PERCENT


def is_heldout(example: Example) -> bool:
    if example.heldout_phrasing:
        return True
    return not example.keep_in_training and _in_heldout_bucket(example.key)


# ---- phrasing variation at training time ----------------------------------------------------------------
# A 1M-parameter model given each family's dozen templates memorises every template on its own and fails on
# a new one (the first v3 run: 86% on trained phrasings, 47% on held-out ones). Varying the surface of each
# training prompt as it is drawn (a polite or neutral opening, a contraction, other final punctuation, a
# question turned into "Tell me ...") makes the templates too many to memorise, so the model has to key on
# the task words and operands. A variation that would produce a held-out prompt is not used (`_held_out_texts`).
IMPERATIVE_VERBS = {
    "add", "subtract", "compute", "calculate", "sum", "pick", "find", "count", "list", "name", "spell",
    "repeat", "say", "echo", "write", "make", "tell",
}  # fmt: skip
POLITE_OPENINGS = ["Please ", "Can you ", "Could you ", "Would you "]  # before an imperative only
# No greetings ("Hi! ", "Hey, "): after "Hi! what is 2 plus 5" the model answered a bare "Hello" with a number.
NEUTRAL_OPENINGS = ["OK, ", "So, ", "Question: ", "Quick question: ", "Now ", "Hmm, "]
ENDINGS = ["", ".", "?", "!", " please", " :)"]
VARY_SHARE = 0.6  # training prompts drawn with a varied surface; the rest as the template wrote them
# Words that ask for the same comparison. Swapped for one another in training prompts (`vary_phrasing`'s
# `synonyms`), each word meets every frame of its family, so that the word decides between max and min, not
# the frame around it: with "greatest" in one training frame only (`Find the greatest of ...`), CF1 answered
# the held-out `What is the greatest of 7, 9, 6?` with the least or a difference (`-3`, as for `What is the
# difference of ...?`).
COMPARISON_SYNONYMS = (
    ("largest", "biggest", "greatest", "highest"),
    ("smallest", "least", "lowest"),
    ("larger", "bigger", "greater", "higher"),
    ("smaller", "lower"),
)
_COMPARISON_WORD = re.compile(r"\b(" + "|".join(w for group in COMPARISON_SYNONYMS for w in group) + r")\b")


def normalized_prompt(text: str) -> str:
    """A prompt without case, punctuation or "please": what decides whether two prompts are the same one."""
    words = re.sub(r"[.,!?:;)(]", " ", text.lower()).split()
    return " ".join(w for w in words if w != "please")


def lower_first(text: str) -> str:
    # Names and countries keep their capital; only the sentence's first letter changes.
    return text[0].lower() + text[1:] if text[:1].isupper() and text[1:2].islower() else text


def swap_comparison_word(text: str, rng: random.Random) -> str:
    """`text` with one of its comparison words replaced by another of the same meaning (`COMPARISON_SYNONYMS`)."""
    matches = list(_COMPARISON_WORD.finditer(text))
    if not matches:
        return text
    match = rng.choice(matches)
    group = next(g for g in COMPARISON_SYNONYMS if match.group(0) in g)
    other = rng.choice([w for w in group if w != match.group(0)])
    return text[: match.start()] + other + text[match.end() :]


def _variations(text: str, rng: random.Random, synonyms: float = 0.0):
    """Successive variations of `text`, each one change further from it. `synonyms`: the chance of swapping a
    comparison word first (checked only when non-zero, so that runs without it draw as before)."""
    first = text.split(" ", 1)[0].strip(",.?!:").lower()
    if synonyms and rng.random() < synonyms:
        text = swap_comparison_word(text, rng)
        yield text
    if rng.random() < 0.3 and re.match(r"(?i)what is ", text):
        text = re.sub(r"(?i)^what is", lambda m: m.group(0)[0] + "hat's", text)
        yield text
    if rng.random() < 0.2 and re.match(r"What(?:'s| is) (.*)\?$", text):
        text = "Tell me " + re.sub(r"^What(?:'s| is) ", "", text)[:-1] + "."
        yield text
    if rng.random() < 0.4 and first in IMPERATIVE_VERBS:
        opening = rng.choice(POLITE_OPENINGS)
        text = opening + lower_first(text)
        if opening != "Please ":
            text = text.rstrip(".!") + "?"
        yield text
    if rng.random() < 0.5:
        text = text.rstrip(".?!") + rng.choice(ENDINGS)
        yield text
    if rng.random() < 0.3:
        text = rng.choice(NEUTRAL_OPENINGS) + lower_first(text)
        yield text
    if rng.random() < 0.15:
        text = lower_first(text)
        yield text


def vary_phrasing(text: str, rng: random.Random, synonyms: float = 0.0) -> str:
    """`text` with a varied surface (most of the time), never turned into a held-out prompt or phrasing.
    `synonyms`: the chance that a variation starts by swapping a comparison word (`swap_comparison_word`)."""
    if rng.random() >= VARY_SHARE:
        return text
    held_out, held_out_shape = _held_out_texts(), heldout_phrasing_shapes()
    varied = text
    for candidate in _variations(text, rng, synonyms):
        normalized = normalized_prompt(candidate)
        if normalized in held_out or held_out_shape.fullmatch(normalized):
            break
        varied = candidate
    return varied


def _normalized_template(template: str) -> str:
    return normalized_prompt(re.sub(r"\{\w\}", "SLOT", template))


def phrasing_shape(template: str) -> str:
    """The pattern of the normalized prompts `template` gives, each slot filled by anything."""
    return re.escape(_normalized_template(template)).replace("slot", ".+")


@cache
def heldout_phrasing_shapes() -> re.Pattern:
    """The held-out phrasings with any slot filled by anything, normalized. A variation may not take one of these
    shapes even with other numbers or words: out-of-range rows once turned into `Can you subtract 8 from 2?` and
    `Tell me 1 minus 9.`, the only rows in that shape, so the model learned the phrasing itself as the help
    answer's and answered every held-out `Can you subtract ...` with it."""
    trained = {_normalized_template(t) for templates, _ in ALL_PHRASINGS for t in templates}
    shapes = {phrasing_shape(t) for _, heldout in ALL_PHRASINGS for t in heldout}
    # Held-out phrasings that normalize to a trained one (`Please spell {w}.`) are not new shapes.
    shapes = {shape for shape in shapes if not any(re.fullmatch(shape, t) for t in trained)}
    return re.compile("|".join(sorted(shapes)))


@cache
def _held_out_texts() -> frozenset[str]:
    """Every user message of a held-out prompt, normalized."""
    heldout = _split()[1]
    return frozenset(
        normalized_prompt(m["content"])
        for items in heldout.values()
        for e in items
        for m in e.messages
        if m["role"] == "user"
    )


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
        pool = list(dict.fromkeys(make()))  # a prompt generated twice (random draws) counts once
        train[family] = [e for e in pool if not is_heldout(e)]
        heldout[family] = [e for e in pool if is_heldout(e)]
    train_keys = {e.key for items in train.values() for e in items}
    heldout = {f: [e for e in items if e.key not in train_keys] for f, items in heldout.items()}
    return train, heldout


def training_pool() -> dict[str, list[Example]]:
    """All training items per family (never a held-out prompt)."""
    return _split()[0]


def heldout_examples(
    n: int = 400,
    seed: int = 0,
    families: tuple[str, ...] = TASK_FAMILIES,
    phrasing: str = "any",
) -> list[Example]:
    """A deterministic evaluation list: families taken round-robin, each in a seeded shuffled order.
    `phrasing`: "heldout" (only prompts in a held-out phrasing), "trained" (held-out prompts in a training
    phrasing) or "any"."""
    queues = []
    for family in families:
        items = [e for e in _split()[1][family] if phrasing == "any" or e.heldout_phrasing == (phrasing == "heldout")]
        random.Random(f"{seed}-{family}").shuffle(items)
        queues.append(items)
    out: list[Example] = []
    while len(out) < n and any(queues):
        for q in queues:
            if q and len(out) < n:
                out.append(q.pop(0))
    return out


def training_texts() -> list[str]:
    """Every message and answer of the training rows, and the training system prompts."""
    rows = [e for items in training_pool().values() for e in items]
    return (
        [m["content"] for e in rows for m in e.messages]
        + [a for e in rows for a in e.right_answers]
        + training_system_prompts()
    )


def tokenizer_training_text() -> list[str]:
    """Texts the BPE tokenizer is trained on: every training prompt and answer, plus each word in both forms.

    Never a held-out prompt: a word only they hold could become a token of its own that no training row shows,
    whose embedding stays as initialised. `spelled` did when the vocabulary grew, and the held-out
    `How is brown spelled?` was answered `brown brown` (docs/embedded-model-runs.md); `My` and `"?`
    already were such tokens. Held out, a word the training text lacks is split in pieces the model has seen."""
    texts = training_texts()
    vocab_words = set(WORDS) | set(NAMES) | set(NUMBER_WORDS) | set(ADJECTIVES)
    vocab_words |= {w for _, _, x, a in FACTS for w in (x.split() + [a])}
    vocab_words |= {w.capitalize() for w in NUMBER_WORDS}
    for w in sorted(vocab_words):
        # Enough weight that every word becomes one token; 50 stopped being enough when the corpus grew (run X).
        texts += [w, f" {w}", f'"{w}"'] * 80
    texts += ["user\n\n", "assistant\n\n", "system\n\n"] * 1000  # the chat template's role headers
    return texts


if __name__ == "__main__":
    train, heldout = _split()
    for family in FAMILIES:
        held_phr = sum(e.heldout_phrasing for e in heldout[family])
        print(
            f"{family:12s} train {len(train[family]):5d}  held-out {len(heldout[family]):4d} ({held_phr} new phrasing)"
        )
    for e in heldout_examples(12, phrasing="heldout"):
        print(e.family, e.messages[-1]["content"], "->", e.answer)
