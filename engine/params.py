"""Per-request sampling parameters: every sampler knob, defined once, and the rules between them.

`SamplingParams` is the table of knobs: each field's declaration carries its spec (`Knob`: type, range,
default, one-line help, the switch it needs, the model families it applies to), and validation runs from
those specs. Everything else that shows a knob is derived from `KNOBS`: the HTTP request fields and their
/docs text, the resolved `diffusion` object, BentoML's native API arguments, the playground's ranges and
the tables in README.md and docs/api.md (schemas/knobs.py). The names and defaults are ADR 005's
(docs/adr/005-openai-compatible-api.md). This module imports no torch, so the HTTP schemas may use it.

A violated rule raises `InvalidParameter` (a ValueError) that names the field, so the HTTP layer can
report it as `error.param`.
"""

from __future__ import annotations

import functools
import math
import secrets
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal, get_args

from engine.errors import InvalidParameter

BlockSchedule = Literal["uniform", "front_loaded", "cosine", "dream"]
ConfidenceMetric = Literal["top1_prob", "entropy_inverse", "margin"]
KVCacheMode = Literal["none", "prefix", "dual"]

BLOCK_SCHEDULES: tuple[str, ...] = get_args(BlockSchedule)
CONFIDENCE_METRICS: tuple[str, ...] = get_args(ConfidenceMetric)
KV_CACHE_MODES: tuple[str, ...] = get_args(KVCacheMode)
DEFAULT_GEN_LENGTH = 128
DEFAULT_STEPS = 128
MAX_STEPS = 512
MAX_TEMPERATURE = 2.0
MAX_STOP_STRINGS = 4
MAX_LOCAL_LEAP_RADIUS = 16
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1  # what torch.Generator.manual_seed accepts

Kind = Literal["integer", "number", "switch", "choice", "strings"]
# Where a knob appears on the HTTP API: an extension field of its own name, an OpenAI field of its own name
# (its row in schemas/fields.py says how it differs from OpenAI's), or the canvas fields (max_tokens, ...).
# None: the Python API only.
Exposure = Literal["extension", "openai", "canvas"]


@dataclass(frozen=True)
class Knob:
    """The spec of one sampler knob. `name` is the `SamplingParams` field it is declared on."""

    kind: Kind
    default: Any
    help: str  # one line: what it does (README, the native API, the playground)
    doc: str = ""  # the whole effect, when one line is not enough (docs/api.md, /docs)
    minimum: int | float | str | None = None  # a number, or the name of the knob whose value bounds it
    maximum: int | float | str | None = None
    exclusive_minimum: bool = False
    choices: tuple[str, ...] = ()
    max_items: int = 0  # strings: how many at most
    default_doc: str = ""  # how an omitted value resolves, when that is not simply `default`
    bounds_doc: tuple[str, str] | None = None  # the bounds as written, when the numbers read badly (the seed's)
    requires: str | None = None  # a knob that must be on (a switch) or set (any other kind) for this one to be set
    when_on: Any = None  # this knob's default once `requires` is on
    default_from: str | None = None  # an omitted value takes this (earlier) knob's value
    families: tuple[str, ...] | None = None  # the model families it applies to; None: every family
    resolved: bool = False  # an omitted value always resolves to a concrete one (never reported as null)
    http: Exposure | None = "extension"
    name: str = ""

    # --- what the docs show ------------------------------------------------------------------------

    @property
    def type_doc(self) -> str:
        """e.g. "integer 1–512", "number in (0, 1]", "boolean", `"none", "prefix", "dual"`."""
        if self.kind == "switch":
            return "boolean"
        if self.kind == "choice":
            return ", ".join(f'"{c}"' for c in self.choices)
        if self.kind == "strings":
            return f"string or up to {self.max_items} strings"
        low, high = self.bounds_doc or (_shown_bound(b) for b in (self.minimum, self.maximum))
        if self.bounds_doc:
            span = f"{low} … {high}"
        elif self.maximum is None:
            span = f"≥ {low}"
        elif self.exclusive_minimum:
            span = f"in ({low}, {high}]"
        else:
            span = f"{low}–{high}"
        return f"{self.kind} {span}"

    @property
    def default_shown(self) -> str:
        """The default as the docs write it."""
        if self.default_doc:
            return self.default_doc
        value = self.when_on if self.requires else self.default
        return _shown(value) if value is not None else "—"

    def effect(self) -> str:
        """What the knob does, with the conditions it needs (docs/api.md's "Effect")."""
        text = self.doc or _sentence(self.help)
        if self.requires:
            text += f" Only with `{self._requirement}` (400 otherwise)."
        if self.families:
            text += f" Only for {' and '.join(self.families)} models: others refuse any other value (400)."
        return text

    def description(self) -> str:
        """The knob's whole text for /docs: its effect, then its range and its default."""
        return f"{self.effect()} Accepts {self.type_doc}; default {self.default_shown}."

    def summary(self) -> str:
        """One line for a form or an argument list: what it does, its range, its default."""
        return f"{_sentence(self.help)} Accepts {self.type_doc}; default {self.default_shown}."

    # --- validation ---------------------------------------------------------------------------------

    def checked(self, params: SamplingParams) -> Any:
        """This knob's value in `params` checked against its own spec (type, range, switch), with the default
        its switch implies filled in. A None left for the cross-field rules to resolve stays None."""
        value = getattr(params, self.name)
        if self.requires is not None:
            if not is_on(getattr(params, self.requires)):
                if value is not None:
                    raise InvalidParameter(self.name, f"is only allowed together with {self._requirement}")
                return None
            if value is None:
                value = self.when_on
        if value is None and self.default_from is not None:
            value = getattr(params, self.default_from)
        if self.kind == "strings":
            return self._checked_strings(value)
        if value is None and self.default is None:
            return None
        if self.kind == "switch":
            if not isinstance(value, bool):  # "false" is truthy: a string here would silently flip the switch
                raise InvalidParameter(self.name, f"must be true or false, got {value!r}")
        elif self.kind == "choice":
            if value not in self.choices:
                raise InvalidParameter(self.name, f"must be one of {', '.join(self.choices)}")
        else:
            self._check_number(value, params)
        return value

    def _check_number(self, value: Any, params: SamplingParams) -> None:
        allowed, what = (int, "an integer") if self.kind == "integer" else ((int, float), "a number")
        if isinstance(value, bool) or not isinstance(value, allowed):
            raise InvalidParameter(self.name, f"must be {what}, got {value!r}")
        low, high = (params.bound_of(self.name, b) for b in (self.minimum, self.maximum))
        # Written as what is inside the range, so that NaN (never inside) is refused too.
        above_low = low is None or value > low or (value == low and not self.exclusive_minimum)
        below_high = high is None or value <= high
        if above_low and below_high:
            return
        if self.bounds_doc:
            raise InvalidParameter(self.name, f"must be between {' and '.join(self.bounds_doc)}, got {value}")
        shown_high = f"{self.maximum} ({high})" if isinstance(self.maximum, str) else f"{high}"
        if high is None:
            rule = f"must be at least {low}"
        elif self.exclusive_minimum:
            rule = f"must be greater than {low} and at most {shown_high}"
        else:
            rule = f"must be between {low} and {shown_high}"
        raise InvalidParameter(self.name, f"{rule}, got {value}")

    @property
    def _requirement(self) -> str:
        """How the docs and errors name what this knob needs: "use_local_leap: true", "editing_threshold set"."""
        return f"{self.requires}: true" if KNOB[self.requires].kind == "switch" else f"{self.requires} set"

    def _checked_strings(self, value: Any) -> tuple[str, ...]:
        strings = () if value is None else (value,) if isinstance(value, str) else value
        if (
            not isinstance(strings, (list, tuple))
            or len(strings) > self.max_items
            or not all(isinstance(s, str) and s for s in strings)
        ):
            raise InvalidParameter(
                self.name, f"must be a string or a list of at most {self.max_items} non-empty strings"
            )
        return tuple(strings)


def is_on(value: Any) -> bool:
    """Whether a knob that others require is on: a switch that is true, or any other knob that is set (an
    `editing_threshold` of 0 is on)."""
    return value is not None and value is not False


def _sentence(text: str) -> str:
    return f"{text[0].upper() if text[0].isascii() else text[0]}{text[1:]}."  # "κ: ..." keeps its κ


def _shown_bound(bound: Any) -> str:
    return bound if isinstance(bound, str) else _shown(bound)  # a knob's name: as it is


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def knob(kind: Kind, default: Any = None, **spec: Any) -> Any:
    """A `SamplingParams` field declared with its spec (read back by `KNOBS`)."""
    return field(default=default, metadata={"knob": Knob(kind, default, **spec)})


def _smallest_fitting_multiple(declared: int, canvas: int, steps: int | None) -> int | None:
    """The smallest multiple of a checkpoint's declared block length that fits a canvas: whole blocks of it, and
    the step count (None: threshold decoding, which has none) shared evenly between them; None where no multiple
    divides the canvas. Blocks of a multiple of `declared` number a divisor of the canvas's count of declared
    blocks, and must divide the steps too: the most of them (the smallest blocks) is the gcd of the two.
    160 tokens in the default 128 steps with 8 declared: four blocks of 40, where trying only doublings of 8 found
    none and fell back to one block, the setting small models answer worst in (docs/embedded-model-runs.md)."""
    if canvas % declared:
        return None
    blocks = canvas // declared
    return canvas // (blocks if steps is None else math.gcd(blocks, steps))


@dataclass(frozen=True)
class SamplingParams:
    """How one request is denoised: one field per knob, in the order the docs and the `diffusion` object list them.

    Omitted values resolve as each knob's spec says: block_length → gen_length (one bidirectional block);
    num_denoising_steps → min(128, gen_length); block_schedule and confidence_metric → the loaded model
    family's own, filled in by the engine (`with_model_defaults`); LocalLeap's settings → κ 0.9, τ 0.75,
    W 4 once `use_local_leap` is on (setting them while it is off is an error, never silently ignored);
    seed → a fresh random one (recorded in `seed`). With a confidence_threshold there is no step count:
    `num_denoising_steps` must be left unset and stays None (docs/sampler.md).
    """

    gen_length: int = knob("integer", DEFAULT_GEN_LENGTH, minimum=1, http="canvas", help="the canvas size in tokens")
    block_length: int | None = knob(
        "integer",
        minimum=1,
        maximum="gen_length",
        default_doc="gen_length, or the model's declared block length (llada2: 32)",
        default_from="gen_length",
        resolved=True,
        help="tokens per block; gen_length must be a multiple of it (llada2: any gen_length)",
        doc="Tokens per block; gen_length must be a multiple of it. Blocks are denoised left to right "
        "(semi-autoregressive); the default is one fully bidirectional block, or, when the checkpoint declares a "
        "block length (generation_config.json `block_length`), that one wherever it fits the request (gen_length "
        "a multiple of it, and the step count shared evenly between the blocks), else the smallest of its "
        "multiples that fits (the embedded model declares 8: 24 steps on 128 tokens run as eight blocks of 16, "
        "160 tokens in the default 128 steps as four blocks of 40), else one "
        "block. On llada2 (block diffusion) the "
        "default is 32, the block length it was trained with, blocks are aligned to position 0 of the prompt "
        "and the canvas is rounded up to whole blocks: any gen_length works, and the positions past it are "
        "denoised but not returned.",
    )
    num_denoising_steps: int | None = knob(
        "integer",
        minimum=1,
        maximum=MAX_STEPS,
        default_doc=f"min({DEFAULT_STEPS}, gen_length); llada2: unset",
        help="forward passes over the canvas",
        doc="Forward passes over the canvas (before early exit). Must be a multiple of the number of blocks "
        "(gen_length / block_length, rounded up on llada2) and give at most block_length steps per block. Fewer "
        "steps commit more tokens per step: faster, usually less accurate. Not with `confidence_threshold` "
        "(reported as null then: the threshold decides the number of forward passes), except on llada2, where "
        "the steps per block set each forward's minimum quota beside the threshold (the official `steps`; unset, "
        "one token per forward). Not with `editing_threshold`.",
    )
    block_schedule: BlockSchedule | None = knob(
        "choice",
        choices=BLOCK_SCHEDULES,
        default_doc='the model\'s: "uniform" (LLaDA), "dream" (Dream, DiffuCoder)',
        resolved=True,
        help="how many tokens each step of a block commits",
        doc="How many tokens each step of a block commits: evenly (LLaDA's reference), more early and linearly "
        "fewer later, few early and more later, or Dream's linear-timestep schedule (a share 1 − s/t of the masks "
        "still left, none at first, the rest at the last step).",
    )
    confidence_metric: ConfidenceMetric | None = knob(
        "choice",
        choices=CONFIDENCE_METRICS,
        default_doc='the model\'s: "top1_prob" (LLaDA), "entropy_inverse" (Dream, DiffuCoder)',
        resolved=True,
        help="which masked positions are committed first",
        doc="Which masked positions are committed first: the highest probability of the predicted token, the "
        "lowest entropy (exp(−H)) of the position's distribution, or the largest lead of the top token over the "
        "runner-up (p₁ − p₂, Dream's `topk_margin`).",
    )
    temperature: float = knob(
        "number",
        0.0,
        minimum=0,
        maximum=MAX_TEMPERATURE,
        http="openai",
        help="how random the sampling is: 0 is the deterministic argmax (the reference path)",
        doc="0 is the deterministic argmax, the reference path. Above 0, each position's token is drawn by "
        "Gumbel-max sampling from softmax(logits / temperature).",
    )
    seed: int | None = knob(
        "integer",
        minimum=SEED_MIN,
        maximum=SEED_MAX,
        bounds_doc=("-2**63", "2**64 - 1"),
        default_doc="random (reported in `diffusion.seed`)",
        resolved=True,
        http="openai",
        help="seeds the request's own random generator (used when temperature > 0)",
        doc="Seeds the request's own random generator (used when temperature > 0; no global state): the same "
        "seed and parameters give the same output.",
    )
    force_single_batch: bool = knob(
        "switch",
        False,
        help="run alone, never sharing a forward pass with other requests (reproducible output)",
        doc="Run the request alone, never sharing a forward pass with other requests: bit-reproducible output "
        "whatever the load.",
    )
    use_local_leap: bool = knob(
        "switch",
        False,
        help="LocalLeap acceleration (arXiv:2510.07081)",
        doc="LocalLeap (arXiv:2510.07081), training-free: besides each step's quota, commit every position whose "
        "confidence ≥ κ (an anchor) and every position within W of an anchor whose confidence ≥ τ. Fewer "
        "forward passes.",
    )
    local_leap_anchor_threshold: float | None = knob(
        "number", minimum=0, maximum=1, requires="use_local_leap", when_on=0.9, help="κ: an anchor's confidence"
    )
    local_leap_neighbor_threshold: float | None = knob(
        "number", minimum=0, maximum=1, requires="use_local_leap", when_on=0.75, help="τ: a neighbour's confidence"
    )
    local_leap_radius: int | None = knob(
        "integer",
        minimum=1,
        maximum=MAX_LOCAL_LEAP_RADIUS,
        requires="use_local_leap",
        when_on=4,
        help="W: how far from an anchor, in positions",
    )
    early_exit: bool = knob(
        "switch", True, http=None, help="stop denoising once the answer has ended (an end-of-text token is final)"
    )
    kv_cache: KVCacheMode = knob(
        "choice",
        "none",
        choices=KV_CACHE_MODES,
        families=("llada", "dream"),
        help="Fast-dLLM's approximate KV cache; pays off with several blocks",
        doc="Fast-dLLM's approximate KV cache (arXiv:2505.22618): after a block's first step, recompute only the "
        'block and what follows it ("prefix") or the block alone ("dual"), reusing the other positions\' keys '
        'and values from that first step. "none" is the exact reference path. Much cheaper steps on long '
        "canvases with several blocks; an approximation (the output can differ). A request whose cache cannot "
        "fit the server's KV-cache budget is refused (400 on `kv_cache`); one that fits waits for memory.",
    )
    confidence_threshold: float | None = knob(
        "number",
        minimum=0,
        maximum=1,
        exclusive_minimum=True,
        default_doc="off (llada2: 0.95; 0.7 with editing_threshold)",
        help="commit every position with confidence ≥ τ (plus the surest) per step, instead of a step count",
        doc="Fast-dLLM's threshold decoding: a step commits every masked position of the block whose confidence "
        "(per `confidence_metric`) is ≥ τ, plus always the most confident one; a block takes the steps it needs. "
        'Not with `num_denoising_steps`, a `block_schedule` other than "uniform", or `use_local_leap`. Works '
        "with every `kv_cache`; Fast-dLLM's setting is 0.9 with `block_length` 32 and a cache. On llada2 it is "
        "the official sampler's `threshold` and on by default (0.95, LLaDA2.0's; 0.7 once `editing_threshold` "
        "selects LLaDA2.1's, its quality mode): a forward commits every masked position strictly above τ if "
        "there are at least the step's quota of them, else the quota's most confident; 1 commits by the quota "
        "alone.",
    )
    stop: tuple[str, ...] | str | None = knob(
        "strings",
        (),
        max_items=MAX_STOP_STRINGS,
        default_doc="none",
        http="openai",
        help="the text is cut before the first stop string, and the request ends once one is final",
        doc="Non-empty strings; `[]` means none. The text is cut before the occurrence that starts first "
        "(whichever stop string it is, and in whatever order the tokens were committed), the finish reason is "
        '"stop", and the request ends as soon as a stop string is final.',
    )  # stored as a tuple
    editing_threshold: float | None = knob(
        "number",
        minimum=0,
        maximum=1,
        families=("llada2",),
        default_doc="off (LLaDA2.0's sampler)",
        help="LLaDA2.1's token editing: overwrite a written token when another is surer than this",
        doc="Selects LLaDA2.1's sampler: besides filling masks, each forward overwrites every already written "
        "(non-prompt) token of the block whose best candidate is another token with confidence strictly above "
        "this; 1 never edits. A block ends after a forward that finds no mask and edits nothing. Not with "
        "`num_denoising_steps` (this sampler has no schedule). LLaDA2.1's quality mode is 0.5 with "
        "`confidence_threshold` 0.7 (its default here once this is set), its speed mode 0 with 0.5. A stream "
        "sends a block's text once the block is closed, since until then an edit could change it.",
    )
    max_post_steps: int | None = knob(
        "integer",
        minimum=0,
        maximum=MAX_STEPS,
        requires="editing_threshold",
        when_on=16,
        families=("llada2",),
        help="forwards a block may take after its last mask is filled, editing only",
    )
    min_tokens_per_step: int | None = knob(
        "integer",
        minimum=1,
        maximum="block_length",
        requires="editing_threshold",
        when_on=1,
        families=("llada2",),
        help="masks each forward fills at least (the official num_to_transfer)",
    )

    def __post_init__(self) -> None:
        for spec in knobs_of(type(self)):  # each knob against its own spec, in declaration order
            object.__setattr__(self, spec.name, spec.checked(self))
        self._apply_rules()

    def _apply_rules(self) -> None:
        """The rules between knobs, and the defaults that depend on other knobs."""
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731 (frozen dataclass)
        self._check_blocks()
        if self.seed is None:
            set_("seed", secrets.randbits(63))
        if self.editing_threshold is not None:
            self._check_editing()
        elif self.confidence_threshold is None or self.num_denoising_steps is not None:
            # With a threshold, a step count is each forward's minimum quota on block-diffusion models; the
            # engine refuses the pair on the others (engine/family_rules.py).
            self._resolve_steps(set_)
        if self.confidence_threshold is not None:
            self._check_threshold()

    def bound_of(self, knob_name: str, bound: int | float | str | None) -> int | float | None:
        """A knob's bound as it applies to these parameters: a number, or the value of the knob it names."""
        return getattr(self, bound) if isinstance(bound, str) else bound

    def _check_blocks(self) -> None:
        if self.gen_length % self.block_length:
            raise InvalidParameter(
                "block_length",
                f"gen_length ({self.gen_length}) must be a multiple of block_length ({self.block_length})",
            )

    def _check_editing(self) -> None:
        if self.num_denoising_steps is not None:
            raise InvalidParameter(
                "num_denoising_steps",
                "does not apply with editing_threshold: LLaDA2.1's sampler has no step schedule (each forward "
                "commits at least min_tokens_per_step tokens); leave it unset",
            )

    def _check_threshold(self) -> None:
        # LocalLeap and the block schedule also decide how many tokens a step commits: the threshold replaces both.
        if self.use_local_leap:
            raise InvalidParameter(
                "confidence_threshold",
                "does not combine with use_local_leap: both decide which positions a step commits; use one",
            )
        if self.block_schedule not in (None, "uniform"):
            raise InvalidParameter(
                "block_schedule",
                "has no effect with confidence_threshold (the threshold, not a schedule, decides how many tokens a "
                "step commits); leave it unset",
            )

    def _resolve_steps(self, set_) -> None:
        defaulted = self.num_denoising_steps is None
        if defaulted:
            set_("num_denoising_steps", min(DEFAULT_STEPS, self.gen_length))
        steps = self.num_denoising_steps
        if steps % self.num_blocks:
            origin = f" (not set: the default, min({DEFAULT_STEPS}, gen_length))" if defaulted else ""
            raise InvalidParameter(
                "num_denoising_steps",
                f"must be a multiple of the number of blocks (gen_length / block_length = {self.num_blocks}), "
                f"got {steps}{origin}",
            )
        if self.steps_per_block > self.block_length:
            raise InvalidParameter(
                "num_denoising_steps",
                f"gives {self.steps_per_block} steps per block, more than block_length ({self.block_length}): "
                "every step must commit at least one token",
            )

    @classmethod
    def for_model(cls, defaults: Any = None, **knobs: Any) -> SamplingParams:
        """The parameters a request for a model family runs with: `knobs` as given, and what they leave out
        taken from the family's `defaults` (engine/config.py `SamplerDefaults`; None: the engine's own).

        Block diffusion (LLaDA2) has defaults here, its authors' settings: a block length, and a
        confidence threshold (LLaDA2.0's, or LLaDA2.1's once `editing_threshold` is given). Its blocks are
        aligned to position 0 on a canvas rounded up to whole blocks, so its parameters are
        `BlockDiffusionParams`: gen_length need not be a multiple of block_length. A LLaDA checkpoint may
        declare a block length (generation_config.json `block_length`): a request that sets none gets it where
        it fits what the request does set (a canvas of whole blocks, a step count shared evenly between them,
        as the parameters' own checks decide), else the smallest of its multiples that fits, else one block, so a
        default never turns a valid request into an error. The schedule and the metric are filled in later, by
        `with_model_defaults`.
        """
        if defaults is None:
            return cls(**knobs)
        if not defaults.aligned_blocks:
            if defaults.block_length is None or knobs.get("block_length") is not None:
                return cls(**knobs)
            one_block = cls(**knobs)  # as if the model declared none; its checks raise the request's own errors
            # One block resolved the canvas and the step count (none with a threshold alone), and fits whatever
            # smaller blocks fit: the declared length or its smallest fitting multiple, where one exists.
            length = _smallest_fitting_multiple(
                defaults.block_length, one_block.gen_length, one_block.num_denoising_steps
            )
            if length is None:
                return one_block
            try:
                return cls(**{**knobs, "block_length": length})
            except InvalidParameter:
                return one_block  # a rule of another knob that smaller blocks break
        knobs = {name: value for name, value in knobs.items() if value is not None}
        knobs.setdefault("block_length", defaults.block_length)
        editing = knobs.get("editing_threshold") is not None
        threshold = defaults.editing_confidence_threshold if editing else defaults.confidence_threshold
        # Not beside the knobs a threshold excludes: the family refuses those itself, naming them
        # (engine/family_rules.py), where a default threshold would have the error blame it instead.
        if not knobs.get("use_local_leap") and knobs.get("block_schedule", "uniform") == "uniform":
            knobs.setdefault("confidence_threshold", threshold)
        return BlockDiffusionParams(**knobs)

    def with_model_defaults(self, block_schedule: str, confidence_metric: str) -> SamplingParams:
        """These parameters with the fields left to the model (None) set to the model family's defaults.

        The defaults belong to the model, not to the request: a client that names no schedule gets the
        sampler the model's authors use, whichever model the server loaded.
        """
        if self.block_schedule is not None and self.confidence_metric is not None:
            return self
        if self.confidence_threshold is not None:
            # No schedule applies with a threshold (it decides each step's commits): "uniform" is what such a
            # request has always reported, whatever the family.
            block_schedule = "uniform"
        return replace(
            self,
            block_schedule=self.block_schedule or block_schedule,
            confidence_metric=self.confidence_metric or confidence_metric,
        )

    def check_family(self, family: str) -> None:
        """Refuse a knob set for a model family it does not apply to (its spec's `families`)."""
        for spec in knobs_of(type(self)):
            unset = spec.when_on if spec.requires and is_on(getattr(self, spec.requires)) else spec.default
            if spec.families is not None and family not in spec.families and getattr(self, spec.name) != unset:
                instead = f"use {_shown(spec.default)}" if spec.default is not None else "leave it unset"
                raise InvalidParameter(spec.name, f"is not supported for {family} models yet; {instead}")

    @property
    def uses_editing(self) -> bool:
        """LLaDA2.1's sampler may overwrite written tokens (an editing_threshold of 1 never does)."""
        return self.editing_threshold is not None and self.editing_threshold < 1.0

    @property
    def num_blocks(self) -> int:
        return self.gen_length // self.block_length

    @property
    def steps_per_block(self) -> int:
        if self.num_denoising_steps is None:
            # Threshold decoding: at most one forward per token of the block. Making the last of those commit
            # "everything left" changes nothing, since each earlier forward committed at least one token.
            return self.block_length
        return self.num_denoising_steps // self.num_blocks


@dataclass(frozen=True)
class BlockDiffusionParams(SamplingParams):
    """Parameters for a block-diffusion model (LLaDA2), whose blocks are aligned to absolute position 0.

    The canvas is the prompt plus gen_length rounded up to whole blocks (engine/block_sampler.py), as the
    official generate() builds it, and the positions past gen_length are denoised but never returned. So
    gen_length need not be a multiple of block_length, nor at least as long: `max_tokens: 100` with blocks
    of 32 runs four blocks (or five, when the prompt ends inside one) and returns 100 tokens at most. A step
    count is counted over ceil(gen_length / block_length) blocks.
    """

    def bound_of(self, knob_name: str, bound: int | float | str | None) -> int | float | None:
        if knob_name == "block_length" and bound == "gen_length":
            return None  # a block may run past the answer: the canvas is rounded up to whole blocks
        return super().bound_of(knob_name, bound)

    def _check_blocks(self) -> None:
        pass  # any gen_length: the canvas is rounded up to whole blocks

    @property
    def num_blocks(self) -> int:
        return -(-self.gen_length // self.block_length)


@functools.cache
def knobs_of(params_class: type[SamplingParams]) -> tuple[Knob, ...]:
    """The specs of a parameters class's fields, named after them, in declaration order."""
    return tuple(replace(f.metadata["knob"], name=f.name) for f in fields(params_class))


KNOBS: tuple[Knob, ...] = knobs_of(SamplingParams)
KNOB = {spec.name: spec for spec in KNOBS}
LOCAL_LEAP_DEFAULTS = {spec.name: spec.when_on for spec in KNOBS if spec.requires == "use_local_leap"}
