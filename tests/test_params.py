"""SamplingParams: ADR defaults and one test per validation rule (the message names the field and rule)."""

import pytest
import torch

from engine import InvalidParameter, SamplingParams


def test_defaults_follow_the_adr():
    p = SamplingParams()
    assert (p.gen_length, p.block_length, p.num_denoising_steps) == (128, 128, 128)
    assert (p.block_schedule, p.confidence_metric, p.temperature) == (None, None, 0.0)  # the model's defaults
    assert p.use_local_leap is False and p.local_leap_anchor_threshold is None
    assert p.early_exit is True and p.force_single_batch is False


def test_steps_default_is_capped_to_the_canvas():
    assert SamplingParams(gen_length=32).num_denoising_steps == 32
    assert SamplingParams(gen_length=256).num_denoising_steps == 128
    assert SamplingParams(gen_length=32).block_length == 32


def test_local_leap_defaults_apply_when_enabled():
    p = SamplingParams(use_local_leap=True)
    assert (p.local_leap_anchor_threshold, p.local_leap_neighbor_threshold, p.local_leap_radius) == (0.9, 0.75, 4)


INVALID = [
    (dict(gen_length=0), "gen_length", "at least 1"),
    (dict(gen_length=32.0), "gen_length", "must be an integer"),
    (dict(gen_length=32, block_length=64), "block_length", "between 1 and gen_length"),
    (dict(gen_length=32, block_length=0), "block_length", "between 1 and gen_length"),
    (dict(gen_length=32, block_length=12), "block_length", "multiple of block_length"),
    (dict(gen_length=32, num_denoising_steps=0), "num_denoising_steps", "between 1 and 512"),
    (dict(gen_length=1024, num_denoising_steps=513), "num_denoising_steps", "between 1 and 512"),
    (
        dict(gen_length=32, block_length=8, num_denoising_steps=6),
        "num_denoising_steps",
        "multiple of the number of blocks",
    ),
    (dict(gen_length=32, block_length=8, num_denoising_steps=64), "num_denoising_steps", "more than block_length"),
    (dict(gen_length=32, num_denoising_steps=True), "num_denoising_steps", "must be an integer"),
    (dict(block_schedule="linear"), "block_schedule", "one of uniform, front_loaded, cosine, dream"),
    (dict(confidence_metric="top2_gap"), "confidence_metric", "one of top1_prob, entropy_inverse, margin"),
    (dict(temperature=-0.1), "temperature", "between 0 and 2"),
    (dict(temperature=2.5), "temperature", "between 0 and 2"),
    (dict(temperature="1"), "temperature", "must be a number"),
    (dict(seed=1.5), "seed", "must be an integer"),
    (dict(seed=2**64), "seed", "must be between -2**63 and 2**64 - 1"),
    (dict(seed=-(2**63) - 1), "seed", "must be between"),
    (dict(local_leap_anchor_threshold=0.8), "local_leap_anchor_threshold", "only allowed together with use_local_leap"),
    (dict(local_leap_neighbor_threshold=0.5), "local_leap_neighbor_threshold", "only allowed together"),
    (dict(local_leap_radius=2), "local_leap_radius", "only allowed together with use_local_leap"),
    (dict(use_local_leap=True, local_leap_anchor_threshold=1.5), "local_leap_anchor_threshold", "between 0 and 1"),
    (dict(use_local_leap=True, local_leap_neighbor_threshold=-0.5), "local_leap_neighbor_threshold", "between 0 and 1"),
    (dict(use_local_leap=True, local_leap_radius=0), "local_leap_radius", "between 1 and 16"),
    (dict(use_local_leap=True, local_leap_radius=17), "local_leap_radius", "between 1 and 16"),
    (dict(use_local_leap=True, local_leap_radius=2.0), "local_leap_radius", "must be an integer"),
    (dict(stop=["a", "b", "c", "d", "e"]), "stop", "at most 4 non-empty strings"),
    (dict(stop=[""]), "stop", "at most 4 non-empty strings"),
    (dict(stop=123), "stop", "a string or a list"),
    (dict(stop={"a": 1}), "stop", "a string or a list"),  # a dict is not a list of strings
    (dict(use_local_leap="false"), "use_local_leap", "must be true or false"),  # truthy: would turn it on
    (dict(early_exit="no"), "early_exit", "must be true or false"),
    (dict(force_single_batch=1), "force_single_batch", "must be true or false"),
    (
        dict(gen_length=200, block_length=8),
        "num_denoising_steps",
        "got 128 (not set: the default, min(128, gen_length))",
    ),
]


@pytest.mark.parametrize(("kwargs", "field", "rule"), INVALID, ids=[f"{f}-{i}" for i, (_, f, _) in enumerate(INVALID)])
def test_invalid_values_name_the_field_and_rule(kwargs, field, rule):
    with pytest.raises(InvalidParameter) as raised:
        SamplingParams(**kwargs)
    assert raised.value.field == field
    assert str(raised.value).startswith(f"{field}: ")
    assert rule in str(raised.value)
    assert isinstance(raised.value, ValueError)


def test_valid_edge_values_are_accepted():
    SamplingParams(gen_length=512, block_length=1, num_denoising_steps=512)
    SamplingParams(temperature=2, seed=0)
    assert SamplingParams(stop=None).stop == () and SamplingParams(stop="x").stop == ("x",)
    for seed in (-(2**63), 2**64 - 1):  # the ends of the range the request's torch.Generator accepts
        torch.Generator().manual_seed(SamplingParams(temperature=1, seed=seed).seed)
    SamplingParams(
        use_local_leap=True, local_leap_anchor_threshold=0, local_leap_neighbor_threshold=1, local_leap_radius=16
    )
    assert SamplingParams(stop="###").stop == ("###",)
    assert SamplingParams(confidence_threshold=1).confidence_threshold == 1  # only what is certain (plus the top-1)


def test_model_defaults_fill_only_what_the_request_left_out():
    left_out = SamplingParams(gen_length=32, seed=7)
    filled = left_out.with_model_defaults("dream", "entropy_inverse")
    assert (filled.block_schedule, filled.confidence_metric) == ("dream", "entropy_inverse")
    assert (filled.seed, filled.gen_length, filled.num_denoising_steps) == (7, 32, 32)  # nothing else changes
    chosen = SamplingParams(block_schedule="cosine", confidence_metric="margin")
    assert chosen.with_model_defaults("dream", "entropy_inverse") == chosen
    half = SamplingParams(confidence_metric="margin").with_model_defaults("uniform", "top1_prob")
    assert (half.block_schedule, half.confidence_metric) == ("uniform", "margin")


def test_block_diffusion_params_take_the_familys_defaults_and_any_canvas():
    from engine.config import LLaDA2Config, SamplerDefaults
    from engine.params import BlockDiffusionParams

    llada2 = LLaDA2Config.sampler_defaults
    llada = SamplerDefaults("uniform", "top1_prob")  # a LLaDA checkpoint that declares no block length
    params = SamplingParams.for_model(llada2, gen_length=100)
    assert isinstance(params, BlockDiffusionParams)
    assert (params.block_length, params.confidence_threshold, params.num_denoising_steps) == (32, 0.95, None)
    assert params.num_blocks == 4  # ceil(100 / 32): the canvas is rounded up to whole blocks
    assert SamplingParams.for_model(llada2, gen_length=5).block_length == 32  # a block longer than the answer
    assert SamplingParams.for_model(llada2, editing_threshold=0.5).confidence_threshold == 0.7
    assert SamplingParams.for_model(llada2, confidence_threshold=0.5, editing_threshold=0.0).confidence_threshold == 0.5
    steps = SamplingParams.for_model(llada2, gen_length=100, num_denoising_steps=8)
    assert steps.steps_per_block == 2 and steps.confidence_threshold == 0.95
    with pytest.raises(InvalidParameter) as error:
        SamplingParams.for_model(llada2, gen_length=100, num_denoising_steps=6)  # not a multiple of 4 blocks
    assert error.value.field == "num_denoising_steps"
    # The other families keep their rules: no defaults added, gen_length a multiple of block_length.
    plain = SamplingParams.for_model(llada, gen_length=64, seed=1)
    assert type(plain) is SamplingParams and plain == SamplingParams(gen_length=64, seed=1)
    with pytest.raises(InvalidParameter) as error:
        SamplingParams.for_model(llada, gen_length=100, block_length=32)
    assert error.value.field == "block_length"


def test_a_declared_block_length_is_the_default_wherever_it_fits_the_request():
    """A LLaDA checkpoint's generation_config.json `block_length`: the default block length of a request that
    sets none, where the canvas is several whole blocks and the steps share evenly; else the smallest multiple of
    it that does; else one block, never an error the request did not ask for; a block length the request sets
    always wins."""
    from engine.config import SamplerDefaults

    declared = SamplerDefaults("uniform", "top1_prob", block_length=32)

    def blocks(**knobs):
        params = SamplingParams.for_model(declared, **knobs)
        return params.block_length, params.num_denoising_steps

    assert blocks() == (32, 128)  # the default request: 128 positions in four blocks of 32
    assert blocks(gen_length=64) == (32, 64) and blocks(gen_length=256) == (32, 128)
    assert blocks(gen_length=32) == (32, 32) and blocks(gen_length=24) == (24, 24)  # one block: the canvas
    assert blocks(gen_length=48) == (48, 48)  # not a multiple of 32
    assert blocks(gen_length=160) == (160, 128)  # 128 default steps do not share between 5 blocks
    assert blocks(gen_length=128, num_denoising_steps=50) == (64, 50)  # nor 50 between 4: two blocks of 64
    assert blocks(gen_length=128, num_denoising_steps=51) == (128, 51)  # nor between any number of blocks
    assert blocks(gen_length=128, num_denoising_steps=64) == (32, 64)
    assert blocks(gen_length=128, block_length=128) == (128, 128)  # the request's own choice
    assert blocks(gen_length=128, confidence_threshold=0.9) == (32, None)  # no step count to share
    assert SamplingParams.for_model(SamplerDefaults("uniform", "top1_prob"), gen_length=64).block_length == 64
    eights = SamplerDefaults("uniform", "top1_prob", block_length=8)  # what the embedded model declares
    assert SamplingParams.for_model(eights).block_length == 8  # 128 steps over 16 blocks
    assert SamplingParams.for_model(eights, num_denoising_steps=24).block_length == 16  # 3 steps in each of 8
    assert SamplingParams.for_model(eights, num_denoising_steps=8).block_length == 16  # one step in each of 8
    assert SamplingParams.for_model(eights, gen_length=100).block_length == 100  # no multiple of 8 divides 100
    # 128 steps share between neither 20 blocks of 8 nor any doubling's count (10, 5), but do between 4 of 40
    assert SamplingParams.for_model(eights, gen_length=160).block_length == 40
    assert SamplingParams.for_model(eights, gen_length=96, num_denoising_steps=32).block_length == 24  # 12, 6, 3: no
    assert SamplingParams.for_model(eights, gen_length=160, confidence_threshold=0.9).block_length == 8  # no steps
    assert SamplingParams.for_model(eights, gen_length=2**40).block_length == 2**33  # 128 blocks: one per step
