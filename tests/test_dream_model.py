"""The native Dream model against the official `modeling_dream.py` logits, family detection from config.json,
and loading the layout the real checkpoint ships (bf16 shards + index, slow-tokenizer files)."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine import DiffusionEngine
from engine.compiled import static_shapes_of
from engine.config import DreamConfig, LLaDAConfig, model_family, read_config
from engine.dream import DreamModelLM
from engine.loading import load_model
from engine.model import LogitIndex
from tests.fixture_paths import DREAM_FIXTURE_DIR, EMBEDDED_MODEL_DIR, FIXTURE_DIR, dream_reference


@pytest.fixture(scope="module")
def model():
    return load_model(DREAM_FIXTURE_DIR, "cpu")


def logits_case(name: str) -> dict:
    return next(c for c in dream_reference()["logits_cases"] if c["name"] == name)


def assert_matches_summary(logits: torch.Tensor, summary: dict, positions: list[int]) -> None:
    """`logits` [T, V] against a case's recorded argmax (at `positions`), top-5 and first-4 logits."""
    assert logits[positions].argmax(-1).tolist() == summary["argmax"]
    top5 = torch.tensor(summary["top5"])  # [len(positions), 5, (id, logit)]
    values, ids = logits[positions].topk(5, dim=-1)
    assert ids.tolist() == top5[..., 0].long().tolist()
    torch.testing.assert_close(values, top5[..., 1], atol=1e-4, rtol=0)
    first4 = logits[summary["positions_first4"], :4]
    torch.testing.assert_close(first4, torch.tensor(summary["first4"]), atol=1e-4, rtol=0)


# --- family detection ---------------------------------------------------------------------------------


def test_family_comes_from_config_json():
    dream = read_config(DREAM_FIXTURE_DIR)
    assert isinstance(dream, DreamConfig) and dream.family == "dream"
    # The fixture's GQA shape and special ids; the mask id is config.json's (generation_config has null).
    assert (dream.num_attention_heads, dream.num_key_value_heads, dream.head_dim) == (4, 2, 16)
    assert (dream.mask_token_id, dream.eos_token_id, dream.pad_token_id) == (679, 656, 656)
    assert dream.timestep_eps == 1e-3  # generation_config.json's eps
    assert dream.sampler_defaults.block_schedule == "dream"
    assert dream.sampler_defaults.confidence_metric == "entropy_inverse"
    for llada_dir in (FIXTURE_DIR, EMBEDDED_MODEL_DIR):
        llada = read_config(llada_dir)
        assert isinstance(llada, LLaDAConfig) and llada.family == "llada"
        assert (llada.sampler_defaults.block_schedule, llada.sampler_defaults.confidence_metric) == (
            "uniform",
            "top1_prob",
        )
    assert model_family({"architectures": ["DreamModel"]}) == "dream"  # either key is enough
    assert model_family({"architectures": ["LLaDAModelLM"]}) == "llada"


def dream_raw(**changes) -> dict:
    raw = json.loads((DREAM_FIXTURE_DIR / "config.json").read_text())
    return {**raw, **changes}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"]), "unsupported model: model_type='qwen2'"),
        (dict(use_sliding_window=True), "use_sliding_window=True"),
        (dict(rope_scaling={"type": "yarn", "factor": 4.0}), "rope_scaling"),
        (dict(tie_word_embeddings=True), "tie_word_embeddings=True"),
        (dict(hidden_act="gelu"), "hidden_act='gelu'"),
        (dict(head_dim=32), "head_dim=32"),
        (dict(mask_token_id=None), "no mask_token_id"),
    ],
)
def test_configs_this_implementation_does_not_compute_are_refused(changes, message):
    raw = dream_raw(**changes)
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(")):
        if model_family(raw) == "dream":
            DreamConfig.from_dict(raw)


@pytest.mark.parametrize("eps", [1.0, -0.1, 2])
def test_a_schedule_end_time_outside_0_1_is_refused(eps):
    with pytest.raises(ValueError, match=f"eps={eps}"):
        DreamConfig.from_dict(dream_raw(), {"eps": eps})


def test_an_unknown_family_is_refused_when_loading(tmp_path):
    shutil.copytree(DREAM_FIXTURE_DIR, tmp_path / "m")
    (tmp_path / "m" / "config.json").write_text(json.dumps(dream_raw(model_type="mistral", architectures=[])))
    with pytest.raises(ValueError, match="supported: LLaDA .*, Dream .* and LLaDA2"):
        DiffusionEngine.from_pretrained(tmp_path / "m", device="cpu")


# --- logits against the official code -------------------------------------------------------------------


def test_full_logits_match_official_code(model):
    case = logits_case("chat_prompt")
    logits = model(torch.tensor([case["input_ids"]]))[0]
    assert logits.shape == tuple(case["shape"])
    torch.testing.assert_close(logits, torch.tensor(case["logits"]), atol=1e-4, rtol=0)  # rounded to 1e-5


def test_logits_over_masks_match_official_code(model):
    case = logits_case("prompt_plus_masks")
    logits = model(torch.tensor([case["input_ids"]]))[0]
    assert logits.shape == tuple(case["shape"])
    assert_matches_summary(logits, case, list(range(logits.shape[0])))


def test_left_padded_batch_matches_official_rows_and_the_unpadded_rows(model):
    case = logits_case("left_padded_batch")
    ids, mask = torch.tensor(case["input_ids"]), torch.tensor(case["attention_mask"])
    batched = model(ids, mask)
    assert batched.shape == tuple(case["shape"])
    for row, recorded in enumerate(case["rows"]):
        real = recorded["valid_positions"]  # pad queries are meaningless in both implementations
        assert_matches_summary(batched[row], recorded, real)
        alone = model(ids[row, real][None])[0]
        torch.testing.assert_close(batched[row, real], alone, atol=1e-4, rtol=0)


def test_a_row_behind_long_padding_sees_the_positions_it_has_alone(model):
    """Positions restart at each row's first real token, as in Dream's own batches. Numbering the pads
    as well would be the same in exact arithmetic, but in float32 the rotary angles of large positions
    drift (measured: 2e-4 behind 1000 pads, 8e-4 behind 4000)."""
    prompt = dream_reference()["prompts"][0]["prompt_ids"]
    pad = 1000
    ids = torch.tensor([[656] * pad + prompt, [5] * (pad + len(prompt))])
    mask = torch.ones_like(ids)
    mask[0, :pad] = 0
    padded_row = model(ids, mask)[0, pad:]
    torch.testing.assert_close(padded_row, model(torch.tensor([prompt]))[0], atol=2e-5, rtol=0)


def test_logit_index_returns_the_predictions_for_its_columns(model):
    """Shifted logits: the prediction for column c is the model's output at c − 1."""
    case = logits_case("prompt_plus_masks")
    ids = torch.tensor([case["input_ids"]])
    masks = (ids == 679)[0].nonzero().squeeze(1)
    picked = model(ids, logit_index=LogitIndex(masks[None]))
    assert picked.argmax(-1).tolist() == case["shifted_argmax_at_masks"]  # what step 0 of generate proposes

    full = model(ids.repeat(2, 1))
    wanted = torch.zeros(2, ids.shape[1], dtype=torch.bool)
    wanted[0, 5] = wanted[1, 1] = wanted[1, 30] = True  # ragged: row 0 gets a filler entry in the grid
    picked = model(ids.repeat(2, 1), logit_index=LogitIndex.from_mask(wanted))
    torch.testing.assert_close(picked, full[:, :-1][wanted[:, 1:]], atol=1e-5, rtol=0)


def test_logit_index_on_a_left_padded_batch(model):
    case = logits_case("left_padded_batch")
    ids, mask = torch.tensor(case["input_ids"]), torch.tensor(case["attention_mask"])
    # Columns whose previous column is real, as the sampler's candidates always are.
    wanted = torch.zeros_like(mask, dtype=torch.bool)
    wanted[:, 1:] = mask[:, :-1].bool() & (torch.arange(1, ids.shape[1]) % 3 == 0)
    picked = model(ids, mask, logit_index=LogitIndex.from_mask(wanted))
    torch.testing.assert_close(picked, model(ids, mask)[:, :-1][wanted[:, 1:]], atol=1e-5, rtol=0)


# --- the layout of the real checkpoint ----------------------------------------------------------------


def real_layout_checkpoint(directory):
    """The fixture as Dream-org ships its model: bf16 shards with an index, no tokenizer.json, and a
    tokenizer_config.json naming the remote-code class `DreamTokenizer` (with auto_map)."""
    for name in ("config.json", "generation_config.json", "vocab.json", "merges.txt", "special_tokens_map.json"):
        shutil.copy(DREAM_FIXTURE_DIR / name, directory / name)
    tokenizer_config = json.loads((DREAM_FIXTURE_DIR / "tokenizer_config.json").read_text())
    tokenizer_config["tokenizer_class"] = "DreamTokenizer"
    tokenizer_config["auto_map"] = {"AutoTokenizer": ["tokenization_dream.DreamTokenizer", None]}
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    state = load_file(DREAM_FIXTURE_DIR / "model.safetensors")
    names = sorted(state)
    weight_map = {}
    for i, shard_names in enumerate((names[::3], names[1::3], names[2::3])):
        shard = f"model-0000{i + 1}-of-00003.safetensors"
        save_file({n: state[n].to(torch.bfloat16) for n in shard_names}, directory / shard, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard_names, shard))
    (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return state


def test_the_real_checkpoint_layout_loads_with_no_remote_code(tmp_path):
    state = real_layout_checkpoint(tmp_path)
    engine = DiffusionEngine.from_pretrained(tmp_path, device="cpu", dtype="bfloat16")
    assert isinstance(engine.model, DreamModelLM) and engine.family == "dream"
    for name, tensor in engine.model.state_dict().items():
        assert tensor.dtype == torch.bfloat16
        assert torch.equal(tensor, state[name].to(torch.bfloat16)), name
    # The slow-tokenizer files give the official ids (the fixture's prompts were encoded by DreamTokenizer).
    for prompt in dream_reference()["prompts"]:
        assert engine.tokenizer.encode_chat(prompt["messages"]) == prompt["prompt_ids"]
    assert (engine.tokenizer.mask_id, engine.tokenizer.stop_ids) == (679, frozenset({656, 658}))


def test_compile_covers_the_dream_model():
    compiled = load_model(DREAM_FIXTURE_DIR, "cpu", compile=True)  # compiles lazily: no forward run here
    assert static_shapes_of(compiled) is not None  # Dream's steps run the compiled static-shape forward too
    assert set(compiled.state_dict()) == set(load_file(DREAM_FIXTURE_DIR / "model.safetensors"))
