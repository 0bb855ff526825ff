"""The native LLaDA2 (`llada2_moe`) model against the official forward (tests/fixtures/llada2-tiny, section 7)."""

import json

import pytest
import torch

from engine.config import LLaDA2Config, model_family, read_config
from engine.llada2 import BlockKVFrame, LLaDA2MoeModelLM, block_causal_mask
from engine.loading import load_model
from tests.fixture_paths import LLADA2_FIXTURE_DIR

# forward_logits.json holds values rounded to 1e-4: a float32 re-implementation lands within half of that
# plus float noise.
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def model() -> LLaDA2MoeModelLM:
    return load_model(LLADA2_FIXTURE_DIR, "cpu", torch.float32)


@pytest.fixture(scope="module")
def reference() -> dict:
    return json.loads((LLADA2_FIXTURE_DIR / "forward_logits.json").read_text())["forwards"][0]


def raw_config() -> dict:
    return json.loads((LLADA2_FIXTURE_DIR / "config.json").read_text())


def test_family_is_read_from_model_type_or_architectures():
    raw = raw_config()
    assert model_family(raw) == "llada2"
    assert model_family({"architectures": ["LLaDA2MoeModelLM"]}) == "llada2"
    assert model_family({"model_type": "llada2_moe"}) == "llada2"
    config = read_config(LLADA2_FIXTURE_DIR)
    assert isinstance(config, LLaDA2Config)
    assert (config.rotary_dim, config.mask_token_id, config.eos_token_id) == (8, 511, 508)


@pytest.mark.parametrize(
    "key, value",
    [
        ("use_qkv_bias", True),
        ("tie_word_embeddings", True),
        ("use_qk_norm", False),
        ("rope_scaling", {"type": "linear", "factor": 2.0}),
        ("moe_router_enable_expert_bias", False),
        ("score_function", "softmax"),
        ("hidden_act", "gelu"),
        ("mask_token_id", None),
    ],
)
def test_config_flags_the_model_does_not_compute_are_refused(key, value):
    with pytest.raises(ValueError, match=key):
        LLaDA2Config.from_dict({**raw_config(), key: value})


def test_state_dict_names_are_the_official_ones(model):
    meta = json.loads((LLADA2_FIXTURE_DIR / "cases.json").read_text())["meta"]
    shapes = {name: list(t.shape) for name, t in model.state_dict().items()}
    assert shapes == meta["tensor_shapes"]


def test_block_causal_forward_matches_the_official_logits(model, reference):
    ids = torch.tensor([reference["input_ids"]])
    mask = block_causal_mask(ids.shape[1], reference["block_length"])
    assert mask.int().tolist() == reference["attention_mask_01"]
    with torch.inference_mode():
        logits, hidden = model(ids, attention_mask=mask[None, None], output_hidden_states=True)
    assert logits.dtype == torch.float32
    assert logits[0].argmax(-1).tolist() == reference["argmax"]
    assert torch.allclose(logits[0], torch.tensor(reference["logits_rounded_1e4"]), atol=TOLERANCE, rtol=0)
    probs = logits[0].softmax(-1).topk(2, dim=-1).values
    assert torch.allclose(probs[:, 0], torch.tensor(reference["top1_prob"]), atol=TOLERANCE, rtol=0)
    assert torch.allclose(probs[:, 1], torch.tensor(reference["top2_prob"]), atol=TOLERANCE, rtol=0)
    assert len(hidden) == len(reference["hidden_states_rounded_1e4"])
    for ours, theirs in zip(hidden, reference["hidden_states_rounded_1e4"]):
        assert torch.allclose(ours[0], torch.tensor(theirs), atol=TOLERANCE, rtol=0)


def test_expert_dispatch_equals_routing_each_token_on_its_own(model):
    """The grouped dispatch (tokens sorted by expert, one matmul per expert) against the plain definition."""
    moe = model.model.layers[1].mlp
    x = torch.randn(2, 9, model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        batched = moe(x)
        experts, weights = moe.gate(x.reshape(-1, x.shape[-1]))
        expected = []
        for token, chosen, mix in zip(x.reshape(-1, x.shape[-1]), experts, weights):
            out = sum(w * moe.experts[int(e)](token) for e, w in zip(chosen, mix))
            expected.append(out + moe.shared_experts(token))
    assert torch.allclose(batched.reshape(-1, x.shape[-1]), torch.stack(expected), atol=1e-5, rtol=0)
    assert len(set(experts.flatten().tolist())) > 2  # several experts really ran


def test_cached_forward_equals_the_full_forward(model, reference):
    """Keys and values of the prompt and finished blocks from a frame give the same logits as recomputing them."""
    ids = torch.tensor([reference["input_ids"]])
    block, length = reference["block_length"], ids.shape[1]
    with torch.inference_mode():
        full = model(ids, attention_mask=block_causal_mask(length, block)[None, None])
        c = model.config  # the frame's buffer: [layers, keys/values, rows, kv heads, columns, head dim]
        buffer = torch.zeros(c.num_hidden_layers, 2, 1, c.num_key_value_heads, length, c.head_dim)
        # First: the prompt's two blocks into the buffer; then the last block alone against it.
        first = torch.arange(0, 2 * block)[None]
        visible = block_causal_mask(length, block)[None, None, : 2 * block]  # the later block's columns are hidden
        model(ids[:, : 2 * block], kv=BlockKVFrame(buffer, first, first, visible))
        last = torch.arange(2 * block, length)[None]
        cached = model(ids[:, 2 * block :], kv=BlockKVFrame(buffer, last, last, None))
    assert torch.allclose(cached[0], full[0, 2 * block :], atol=1e-5, rtol=0)


def test_the_shipped_21_mask_added_as_0_1_is_reproduced_as_an_additive_mask(model):
    """forwards[1]: the 0/1 mask the shipped 2.1 code adds to the scores (hiding nothing). Our forward takes any
    additive mask, so it reproduces those logits too; the sampler never uses this mask."""
    shipped = json.loads((LLADA2_FIXTURE_DIR / "forward_logits.json").read_text())["forwards"][1]
    assert shipped["mask_kind"] == "zero_one_as_shipped"
    ids = torch.tensor([shipped["input_ids"]])
    additive = torch.tensor(shipped["attention_mask_01"], dtype=torch.float32)[None, None]
    with torch.inference_mode():
        logits = model(ids, attention_mask=additive)
    assert logits[0].argmax(-1).tolist() == shipped["argmax"]
    assert torch.allclose(logits[0], torch.tensor(shipped["logits_rounded_1e4"]), atol=TOLERANCE, rtol=0)
