"""The native LLaDA model against the official code's logits, and checkpoint loading."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine import DiffusionEngine
from engine.loading import dtype_from_name, load_model, resolve_model_dir, weight_files
from engine.model import LogitIndex, RealTokens, RotaryCache
from tests.fixture_paths import FIXTURE_DIR, reference


@pytest.fixture(scope="module")
def model():
    return load_model(FIXTURE_DIR, "cpu")


@pytest.mark.parametrize("case", reference()["logits_cases"], ids=lambda c: c["name"])
def test_logits_match_official_code(model, case):
    ids = torch.tensor(case["input_ids"])
    mask = torch.tensor(case["attention_mask"])
    logits = model(ids, mask if case["attention_mask_passed_to_model"] else None)
    real = mask.bool()  # logits at pad queries are meaningless in both implementations
    assert logits.shape == tuple(case["shape"])
    torch.testing.assert_close(logits[real], torch.tensor(case["logits"])[real], atol=1e-4, rtol=0)


def test_left_padded_row_equals_unpadded_row(model):
    case = next(c for c in reference()["logits_cases"] if c["name"] == "left_padded_batch_of_2")
    ids, mask = torch.tensor(case["input_ids"]), torch.tensor(case["attention_mask"])
    batched = model(ids, mask)
    for row in range(ids.shape[0]):
        real = mask[row].bool()
        alone = model(ids[row][real][None])[0]
        torch.testing.assert_close(batched[row][real], alone, atol=1e-4, rtol=0)


def test_logit_index_computes_only_the_wanted_positions(model):
    ids = torch.tensor([reference()["logits_cases"][1]["input_ids"][0]] * 2)
    full = model(ids)
    wanted = torch.zeros(ids.shape, dtype=torch.bool)
    wanted[0, 3] = wanted[1, 0] = wanted[1, 7] = True  # ragged: row 0 gets a filler entry in the grid
    index = LogitIndex.from_mask(wanted)
    assert index.columns.tolist() == [[3, 0], [0, 7]] and index.real.tolist() == [0, 2, 3]
    picked = model(ids, logit_index=index)
    assert picked.shape == (3, full.shape[-1])
    torch.testing.assert_close(picked, full[wanted], atol=1e-5, rtol=0)


def test_logit_index_on_a_left_padded_batch(model):
    case = next(c for c in reference()["logits_cases"] if c["name"] == "left_padded_batch_of_2")
    ids, mask = torch.tensor(case["input_ids"]), torch.tensor(case["attention_mask"])
    wanted = mask.bool() & (torch.arange(ids.shape[1]) % 3 == 0)
    picked = model(ids, mask, logit_index=LogitIndex.from_mask(wanted))
    torch.testing.assert_close(picked, model(ids, mask)[wanted], atol=1e-5, rtol=0)


@pytest.mark.parametrize("ragged", [False, True], ids=["last four columns", "every third real position"])
def test_real_tokens_skip_the_pads_and_compute_what_the_padded_batch_does(model, ragged):
    """The trainer's forward (`real_tokens`): per-token work on the real positions only, laid out as the padded
    batch for attention, gives the padded forward's logits at every real position, with a logit index or not."""
    case = next(c for c in reference()["logits_cases"] if c["name"] == "left_padded_batch_of_2")
    ids, mask = torch.tensor(case["input_ids"]), torch.tensor(case["attention_mask"])
    real = RealTokens.from_mask(mask)
    assert real.index.numel() == int(mask.sum()) < mask.numel()  # the batch has pads to skip
    padded = model(ids, mask)
    torch.testing.assert_close(model(ids, mask, real_tokens=real), padded[mask.bool()], atol=1e-5, rtol=0)
    columns = torch.arange(ids.shape[1])
    wanted = mask.bool() & (columns % 3 == 0) if ragged else (columns >= ids.shape[1] - 4).expand(ids.shape)
    index = LogitIndex.from_mask(wanted)
    assert (index.real is not None) == ragged
    picked = model(ids, mask, logit_index=index, real_tokens=real)
    torch.testing.assert_close(picked, padded[wanted], atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="cannot be combined"):  # a KV frame's forward computes some positions only
        model(ids, mask, real_tokens=real, kv=object())


def test_sharded_checkpoint_loads_identically(model, tmp_path):
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(FIXTURE_DIR / name, tmp_path / name)
    state = load_file(FIXTURE_DIR / "model.safetensors")
    names = sorted(state)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    weight_map = {}
    for shard, shard_names in shards.items():
        save_file({n: state[n].to(torch.bfloat16) for n in shard_names}, tmp_path / shard, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard_names, shard))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))

    assert [f.name for f in weight_files(tmp_path)] == sorted(shards)
    sharded = load_model(tmp_path, "cpu", torch.bfloat16)
    assert next(sharded.parameters()).dtype == torch.bfloat16
    for name, tensor in sharded.state_dict().items():
        torch.testing.assert_close(tensor, model.state_dict()[name].to(torch.bfloat16), atol=0, rtol=0)


def test_default_dtype_is_float32_on_cpu_and_override_works():
    assert next(load_model(FIXTURE_DIR, "cpu").parameters()).dtype == torch.float32
    assert next(load_model(FIXTURE_DIR, "cpu", torch.bfloat16).parameters()).dtype == torch.bfloat16


def test_dtype_names_are_checked_before_loading():
    assert dtype_from_name("bfloat16") is torch.bfloat16
    assert dtype_from_name(" Float16") is torch.float16
    half = DiffusionEngine.from_pretrained(FIXTURE_DIR, device="cpu", dtype="float16")
    assert next(half.model.parameters()).dtype == torch.float16
    for name in ("nn", "int8", "float64", "bf16", ""):  # `getattr(torch, name)` would accept the first three
        with pytest.raises(ValueError, match="dtype must be one of bfloat16, float16, float32"):
            DiffusionEngine.from_pretrained(FIXTURE_DIR, device="cpu", dtype=name)


def test_missing_or_foreign_tensors_are_refused(tmp_path):
    shutil.copy(FIXTURE_DIR / "config.json", tmp_path / "config.json")
    state = load_file(FIXTURE_DIR / "model.safetensors")
    dropped = dict(list(state.items())[1:])
    save_file(dropped, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="lacks 1 tensors"):
        load_model(tmp_path, "cpu")
    save_file({**state, "model.transformer.extra.weight": torch.zeros(1)}, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="unexpected tensor"):
        load_model(tmp_path, "cpu")


def test_unsupported_architecture_flags_are_refused(tmp_path):
    config = json.loads((FIXTURE_DIR / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "weight_tying": True}))
    shutil.copy(FIXTURE_DIR / "model.safetensors", tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="weight_tying"):
        load_model(tmp_path, "cpu")


def test_model_location_resolution(tmp_path, monkeypatch):
    assert resolve_model_dir(FIXTURE_DIR) == FIXTURE_DIR
    assert resolve_model_dir(None).name == "tiny-llada-chat"
    with pytest.raises(FileNotFoundError):
        resolve_model_dir(tmp_path / "does-not-exist")
    # A hub id goes through huggingface_hub; here its local cache stands in for the network.
    calls = []

    def fake_snapshot_download(repo_id, allow_patterns):
        calls.append((repo_id, allow_patterns))
        return str(FIXTURE_DIR)

    monkeypatch.setattr("huggingface_hub.snapshot_download", fake_snapshot_download)
    assert resolve_model_dir("GSAI-ML/LLaDA-8B-Instruct") == FIXTURE_DIR
    assert calls[0][0] == "GSAI-ML/LLaDA-8B-Instruct" and "*.safetensors" in calls[0][1]


def test_a_block_length_declared_in_generation_config_is_the_default_requests(tmp_path):
    """generation_config.json `block_length` (what the embedded model's trainer writes): read at load, it is
    the block length of a request that sets none; a malformed one is refused at load."""
    shutil.copytree(FIXTURE_DIR, tmp_path / "m")
    generation_file = tmp_path / "m" / "generation_config.json"
    generation = json.loads(generation_file.read_text())
    generation_file.write_text(json.dumps({**generation, "block_length": 32}))
    engine = DiffusionEngine.from_pretrained(tmp_path / "m", device="cpu")
    assert engine.sampler_defaults.block_length == 32
    prompt = list(range(5, 13))
    default = engine.generate(prompt_token_ids=prompt)  # no parameters: the model's defaults
    params = default.params
    assert (params.gen_length, params.block_length, params.num_denoising_steps) == (128, 32, 128)
    engine.shutdown()
    plain = DiffusionEngine.from_pretrained(FIXTURE_DIR, device="cpu")
    assert plain.sampler_defaults.block_length is None
    assert plain.generate(prompt_token_ids=prompt).params.block_length == 128  # one block, as generate() does
    plain.shutdown()
    for bad in (0, "32", 32.0, True):
        generation_file.write_text(json.dumps({**generation, "block_length": bad}))
        with pytest.raises(ValueError, match="block_length"):
            DiffusionEngine.from_pretrained(tmp_path / "m", device="cpu")


def test_served_rotary_tables_are_sliced_never_grown():
    """An ahead-of-time graph hands the model its rotary tables as inputs (engine/aot_graphs.py): within
    `serving`, `get` slices them, asking for more than they hold is an error, and after it the model's own
    tables are back."""
    rotary = RotaryCache(head_dim=8, theta=10000.0, initial_length=16)
    own_cos, _ = rotary.current(16, torch.device("cpu"))
    served = torch.arange(40.0).view(5, 8), -torch.arange(40.0).view(5, 8)
    with rotary.serving(*served):
        cos, sin = rotary.get(3, torch.device("cpu"))
        assert torch.equal(cos, served[0][:3]) and torch.equal(sin, served[1][:3])
        with pytest.raises(RuntimeError, match="hold 5 positions; 6 were asked for"):
            rotary.get(6, torch.device("cpu"))
    assert torch.equal(rotary.get(16, torch.device("cpu"))[0], own_cos)
