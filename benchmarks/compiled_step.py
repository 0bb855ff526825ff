"""What one cached denoising step costs compiled, per forward, and what bounds it (issue 26).

A focused probe, on the embedded model: real dual-cache requests (kv_cache "dual", block 32) are stepped into
their first block's cached steps; then one cached step is captured twice, through engine/batch.py's own
`_cached_forward`:

- "bucketed": the inputs the compiled engine's graph gets (engine/compiled.py `StaticShapes`: batch, span
  and candidates rounded up, the key window the longest canvas as a symbolic dimension, the pool reserved as
  warm-up does);
- "real": the inputs of the eager engine's step (the key window cut to the longest live canvas).

Both read and write the same KV pool in place (a repeated forward rewrites the same columns, so every call
sees the same state). Variants, each timed on the same inputs, interleaved (every repetition runs each variant
once in turn, `--calls` calls each; medians of `--reps`), as ms per forward and as eager ÷ variant:

  eager                 model.forward on the real inputs: the eager engine's step (the baseline)
  eager, bucketed       model.forward on the bucketed inputs
  ahead of time         the engine's call (`StaticShapes`): its ahead-of-time graph (engine/aot_graphs.py)
  torch.compile, ...    torch.compile(_forward, dynamic=False) with the model as an argument: with inductor's
                        Python wrapper, its C++ one (the engine's configuration before ahead-of-time graphs),
                        and `freezing` (parameters constants, linear weights prepacked) with the C++ wrapper
  ... + skip guards     inside torch.compiler.set_stance(skip_guard_eval_unsafe=True)
  arithmetic ceiling    freezing on the real inputs, guards skipped: the step's own arithmetic, fused
  no-op call            a compiled function of the same inputs that does almost nothing: dynamo's fixed cost
  GEMMs alone           the step's matrix products only (every projection, the attention's two products per
                        layer over the real keys, the LM head at the candidates), back to back into
                        preallocated outputs: the floor no removal of overhead goes below
  attention kernel      the step's four attention calls alone (SDPA on the real shapes): the other library
                        call a graph calls as it is

Every variant's logits are compared with eager's on the same inputs (max |diff|, argmax identical).

Usage: python benchmarks/compiled_step.py [--batch 1 8] [--reps 7] [--calls 20] [--threads N]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import statistics
import sys
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from engine import DiffusionEngine, SamplingParams  # noqa: E402
from engine.batch import _cached_forward, _Row  # noqa: E402
from engine.compiled import COMPILED_SPAN, StaticShapes, _forward  # noqa: E402
from engine.kv_slots import kv_slots  # noqa: E402
from engine.model import KVFrame, LogitIndex  # noqa: E402
from engine.warm_up import MAX_RESERVED_LENGTH  # noqa: E402

BLOCK = 32


class Capture(StaticShapes):
    """The compiled engine's padding, recorded: `_cached_forward` pads the step for it; it runs eagerly."""

    def __init__(self, batch_sizes):
        self.batch_sizes, self.on_cuda, self.calls = tuple(batch_sizes), False, []
        self.max_span = COMPILED_SPAN

    def __call__(self, model, input_ids, attention_mask, logit_index, kv):
        self.calls.append((input_ids, logit_index, kv))
        logits = model.forward(input_ids, logit_index=LogitIndex(logit_index.columns), kv=kv)
        return logits if logit_index.real is None else logits[logit_index.real]


def capture_step(engine, batch: int, prompts: list[list[int]]):
    """(bucketed args, real args, wanted): the tensors `_forward` takes, for one cached dual step of `batch`
    requests; `wanted` picks the real candidates out of each one's logits."""
    model = engine.model
    params = SamplingParams(gen_length=256, block_length=BLOCK, num_denoising_steps=256, kv_cache="dual",
                            early_exit=False)  # fmt: skip
    requests = [engine.new_request(prompt_token_ids=prompts[i % len(prompts)], params=params) for i in range(batch)]
    while requests[0].block_step < 3:  # a few cached steps into the first block
        engine.step(requests)
    width = max(r.length for r in requests)
    rows = [_Row(r, r.candidate_offsets(), width - r.length, *r.forward_span()) for r in requests]
    pad = model.config.pad_token_id  # what engine.step passes
    capture = Capture((1, 2, 4, 8))
    object.__setattr__(model, "_static_shapes", capture)
    with torch.inference_mode():
        _cached_forward(model, rows, width, torch.device("cpu"), pad)
    object.__delattr__(model, "_static_shapes")
    real_args: list = []

    def record(_module, args, kwargs):
        real_args.append((args[0], kwargs["logit_index"], kwargs["kv"]))

    hook = model.register_forward_pre_hook(record, with_kwargs=True)
    with torch.inference_mode():
        _cached_forward(model, rows, width, torch.device("cpu"), pad)
    hook.remove()
    (b_ids, b_index, b_kv), (r_ids, r_index, r_kv) = capture.calls[0], real_args[0]
    # The key window: the engine's graph leaves its width symbolic (engine/compiled.py `key_window`).
    torch._dynamo.mark_dynamic(b_kv.key_mask, 1)
    bucketed = (b_ids, None, b_index.columns, b_kv.buffer, b_kv.columns, b_kv.positions, b_kv.key_mask)
    assert r_kv.key_mask is not None or batch == 1, "batch > 1 rows share one width: a mask is expected"
    # The real frame may pass no mask (one row, every key real): `_forward` then takes the width from the mask,
    # so give it an all-True one of the real key width; it is the same attention.
    r_mask = r_kv.key_mask
    if r_mask is None:
        r_mask = torch.ones(r_ids.shape[0], r_kv.key_width, dtype=torch.bool)
    real = (r_ids, None, r_index.columns, r_kv.buffer, r_kv.columns, r_kv.positions, r_mask)
    assert r_kv.first_row == 0 and b_kv.first_row == 0
    key_real = max(r.length for r in requests)
    assert b_kv.key_mask.shape[1] == key_real
    wanted = {"bucketed": b_index.real, "real": r_index.real}
    shapes = dict(pool_width=b_kv.buffer.shape[4], key_real=key_real, span=tuple(b_ids.shape),
                  real_span=tuple(r_ids.shape), candidates=tuple(b_index.columns.shape))  # fmt: skip
    return dict(bucketed=bucketed, real=real), wanted, shapes


def matrix_products(model, batch: int, span: int, keys: int, candidates: int):
    """A call that does the step's matrix products and nothing else, on random inputs of the step's shapes."""
    c = model.config
    d, hidden, heads, head_dim = c.d_model, c.mlp_hidden_size, c.n_heads, c.head_dim
    rows = batch * span
    x, h = torch.randn(rows, d), torch.randn(rows, hidden)
    square = [torch.randn(d, d) for _ in range(4)]  # q, k, v, attention output
    up = [torch.randn(d, hidden) for _ in range(2)]  # the gated branch and the up projection
    down, head = torch.randn(hidden, d), torch.randn(d, c.vocab_size)
    q, k, v = (
        torch.randn(batch * heads, span, head_dim),
        torch.randn(batch * heads, head_dim, keys),
        torch.randn(batch * heads, keys, head_dim),
    )
    out_d, out_h = torch.empty(rows, d), torch.empty(rows, hidden)
    scores, mixed = torch.empty(batch * heads, span, keys), torch.empty(batch * heads, span, head_dim)
    hx, logits = torch.randn(batch * candidates, d), torch.empty(batch * candidates, c.vocab_size)

    def products(*_):
        for _ in range(c.n_layers):
            for w in square:
                torch.mm(x, w, out=out_d)
            for w in up:
                torch.mm(x, w, out=out_h)
            torch.mm(h, down, out=out_d)
            torch.bmm(q, k, out=scores)
            torch.bmm(scores, v, out=mixed)
        torch.mm(hx, head, out=logits)

    return products


def attention_calls(model, batch: int, span: int, keys: int):
    """A call that runs the step's attention kernels (one per layer) and nothing else."""
    c = model.config
    q = torch.randn(batch, c.n_heads, span, c.head_dim)
    k, v = torch.randn(batch, c.n_kv_heads, keys, c.head_dim), torch.randn(batch, c.n_kv_heads, keys, c.head_dim)

    def attention(*_):
        for _ in range(c.n_layers):
            torch.nn.functional.scaled_dot_product_attention(q, k, v)

    return attention


def pick(logits, index):
    return logits if index is None else logits[index]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: leave torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from scripts.tiny_chat_corpus import heldout_examples

    engine = DiffusionEngine.from_pretrained(None, device="cpu", compile=False)
    model = engine.model
    model.eval()
    prompts = [engine.tokenizer.encode_chat(e.messages) for e in heldout_examples()[:8]]
    # The pool as the compiled engine's warm-up reserves it (its width is the bucketed key window).
    kv_slots(model).reserve(max(args.batch), min(engine.max_sequence_length, MAX_RESERVED_LENGTH) + 1)
    print(f"embedded model, torch {torch.__version__}, threads {torch.get_num_threads()}, "
          f"reps {args.reps} x {args.calls} calls, medians")  # fmt: skip

    serial = itertools.count()

    def closure(*tensors):
        return _forward(model, *tensors)

    def noop(model_, input_ids, attention_mask, grid, buffer, columns, positions, key_mask):
        return input_ids[:, :1] + 1

    def compiled(fn, **options):
        # A copy of the function with a code object of its own: dynamo keeps its compiled entries on the code
        # object, and a call tries the entries of every variant compiled from the same function (each failing
        # guard set costs time), which would charge one variant for the others.
        code = fn.__code__.replace(co_name=f"{fn.__name__}_{next(serial)}")
        own = types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)
        return torch.compile(own, dynamic=False, options=options or None)

    for batch in args.batch:
        torch._dynamo.reset()
        inputs, wanted, shapes = capture_step(engine, batch, prompts)
        print(f"\nbatch {batch}: {shapes}")
        span, keys, candidates = shapes["real_span"][1], shapes["key_real"], shapes["candidates"][1]
        python_wrapper = compiled(_forward)
        cpp = compiled(_forward, cpp_wrapper=True)
        freeze_cpp = compiled(closure, freezing=True, cpp_wrapper=True)
        freeze_real = compiled(closure, freezing=True)
        noop_arg = compiled(noop)
        engine_graph = StaticShapes(model, batch_sizes=(1, 2, 4, 8))  # the engine's call, ahead-of-time graph

        def through_engine(*t, graph=engine_graph):  # bound now: the loop rebinds engine_graph per batch
            return graph(model, t[0], None, LogitIndex(t[2]), KVFrame(*t[3:]))

        # name: (call, inputs key)
        variants = {
            "eager": (lambda *t: model.forward(t[0], logit_index=LogitIndex(t[2]), kv=KVFrame(*t[3:])), "real"),
            "eager, bucketed": (
                lambda *t: model.forward(t[0], logit_index=LogitIndex(t[2]), kv=KVFrame(*t[3:])),
                "bucketed",
            ),
            "ahead of time (the engine's)": (through_engine, "bucketed"),
            "torch.compile, Python wrapper": (functools.partial(python_wrapper, model), "bucketed"),
            "torch.compile, cpp_wrapper (the engine's before)": (functools.partial(cpp, model), "bucketed"),
            "torch.compile, freezing + cpp_wrapper": (freeze_cpp, "bucketed"),
            "torch.compile, freezing, real (arithmetic ceiling)": (freeze_real, "real"),
            "no-op torch.compile call": (functools.partial(noop_arg, model), "bucketed"),
            "GEMMs alone (real shapes)": (matrix_products(model, batch, span, keys, candidates), "real"),
            "attention kernel alone (real shapes)": (attention_calls(model, batch, span, keys), "real"),
        }
        skip = ["torch.compile, cpp_wrapper (the engine's before)", "torch.compile, freezing + cpp_wrapper",
                "torch.compile, freezing, real (arithmetic ceiling)", "no-op torch.compile call"]  # fmt: skip
        reference = {}
        with torch.inference_mode():
            for key in ("real", "bucketed"):
                reference[key] = variants["eager, bucketed"][0](*inputs[key]).clone()
            compile_s = {}
            pool = inputs["bucketed"][3]
            written = pool.clone()  # what eager wrote into the pool: every variant must write the same
            for name, (call, key) in variants.items():
                # Dynamo reads `freezing` while tracing (parameters become constants only if it is on then),
                # not only inductor: so the first call runs under the setting; later ones need it no more.
                freezing = torch._inductor.config.patch(freezing="freezing" in name)
                started = time.perf_counter()
                with freezing:
                    out = call(*inputs[key])
                out = call(*inputs[key])  # twice: a second call must not recompile either
                compile_s[name] = time.perf_counter() - started
                if "no-op" in name or "alone" in name:
                    continue
                pool_diff = (pool - written).abs().max().item()
                diff = (out - reference[key]).abs().max().item()
                at = wanted["bucketed" if key != "real" else "real"]
                same = torch.equal(pick(out, at).argmax(-1), pick(reference[key], at).argmax(-1))
                if key != "real":  # the bucketed logits against the eager engine's, at the real candidates
                    across = (pick(out, wanted["bucketed"]) - pick(reference["real"], wanted["real"])).abs().max()
                    diff = max(diff, across.item())
                print(f"  {name:<38} first 2 calls {compile_s[name]:6.1f} s   max |logit diff| vs eager "
                      f"{diff:.2e}  argmax identical {same}  pool |diff| {pool_diff:.1e}")  # fmt: skip
            timed = list(variants) + [f"{name} + skip guards" for name in skip]
            samples: dict[str, list[float]] = {name: [] for name in timed}
            for rep in range(args.reps):
                order = timed if rep % 2 == 0 else timed[::-1]
                for name in order:
                    base = name.removesuffix(" + skip guards")
                    call, key = variants[base]
                    tensors = inputs[key]
                    skipping = name != base
                    stance = (torch.compiler.set_stance(skip_guard_eval_unsafe=True) if skipping
                              else contextlib.nullcontext())  # fmt: skip
                    with stance:
                        started = time.perf_counter()
                        for _ in range(args.calls):
                            call(*tensors)
                        samples[name].append((time.perf_counter() - started) / args.calls)
        eager_ms = statistics.median(samples["eager"]) * 1e3
        print(f"  {'variant':<50} {'ms/forward':>10} {'eager ÷':>8}")
        for name in timed:
            ms = statistics.median(samples[name]) * 1e3
            print(f"  {name:<50} {ms:10.3f} {eager_ms / ms:7.2f}x")
        for request in list(kv_slots(model).owners):  # leave the pool for the next batch
            kv_slots(model).release(request)


if __name__ == "__main__":
    main()
