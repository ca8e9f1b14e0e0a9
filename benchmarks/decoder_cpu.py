"""Smoke benchmark: the bundled decoder beside Hugging Face LlamaForCausalLM on the CPU.

Both models are llama3.2-1b-shaped (hidden 2048, 32 heads / 8 KV heads of 64, FFN 8192, vocab 128256, Llama 3
rope scaling, tied embeddings) cut to 2 layers, hold the SAME random weights (copied from ours into HF, so the
script also checks that both generate the same greedy tokens) and run the same way: torch.inference_mode,
a static KV cache of prompt + gen slots (ours: ``setup_caches``; HF: ``StaticCache``), SDPA attention,
prefill computing the last position's logits only (HF ``logits_to_keep=1``), then ``gen`` greedy decode steps
of one token. Rounds alternate between the two models; the first round of each is a warm-up and excluded; times
are medians over ``--repeats`` rounds.

    .venv/bin/python benchmarks/decoder_cpu.py [--dtype fp32|bf16] [--batch 1] [--prompt 128] [--gen 16]

The last line reads ``decode tokens/s: tfcalc X, transformers Y, ratio Z`` with Z = X / Y.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import transformers

from tfcalc.model import Transformer, build_model
from tfcalc.spec.presets import load_model

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def hf_twin(ours: Transformer) -> transformers.LlamaForCausalLM:
    """LlamaForCausalLM with our config and a copy of our weights."""
    spec, s = ours.spec, ours.spec.rope_scaling
    assert s is not None
    config = transformers.LlamaConfig(
        vocab_size=spec.vocab_size, hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_kv_heads, head_dim=spec.head_dim, rms_norm_eps=1e-5,
        max_position_embeddings=spec.max_context, tie_word_embeddings=spec.tie_word_embeddings,
        rope_parameters={"rope_type": s.rope_type, "rope_theta": spec.rope_theta, "factor": s.factor,
                         "low_freq_factor": s.low_freq_factor, "high_freq_factor": s.high_freq_factor,
                         "original_max_position_embeddings": s.original_max_position_embeddings},
        attn_implementation="sdpa")
    dtype = ours.tok_embeddings.weight.dtype
    hf = transformers.LlamaForCausalLM(config).to(dtype).eval()
    q, kv = spec.num_attention_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    with torch.no_grad():
        hf.model.embed_tokens.weight.copy_(ours.tok_embeddings.weight)
        hf.model.norm.weight.copy_(ours.norm.weight)
        for block, layer in zip(ours.layers, hf.model.layers, strict=True):
            wq, wk, wv = block.attention.wqkv.weight.split([q, kv, kv])
            for proj, w in ((layer.self_attn.q_proj, wq), (layer.self_attn.k_proj, wk),
                            (layer.self_attn.v_proj, wv), (layer.self_attn.o_proj, block.attention.wo.weight)):
                proj.weight.copy_(w)
            gate, up = block.ffn.w_in.weight.chunk(2)
            layer.mlp.gate_proj.weight.copy_(gate)
            layer.mlp.up_proj.weight.copy_(up)
            layer.mlp.down_proj.weight.copy_(block.ffn.w_out.weight)
            layer.input_layernorm.weight.copy_(block.attention_norm.weight)
            layer.post_attention_layernorm.weight.copy_(block.ffn_norm.weight)
    return hf


def ours_runner(model: Transformer, batch: int, max_len: int) -> tuple[Callable, Callable]:
    model.setup_caches(batch, max_len)

    def prefill(tokens: torch.Tensor) -> torch.Tensor:
        model.reset()
        return model.prefill(tokens, last_only=True)

    return prefill, model.decode_step


def hf_runner(model: transformers.LlamaForCausalLM, batch: int, max_len: int) -> tuple[Callable, Callable]:
    cache = transformers.StaticCache(config=model.config, max_cache_len=max_len)

    def prefill(tokens: torch.Tensor) -> torch.Tensor:
        cache.reset()
        return model(tokens, cache=cache, use_cache=True, logits_to_keep=1).logits

    def decode(token: torch.Tensor) -> torch.Tensor:
        return model(token, cache=cache, use_cache=True).logits

    return prefill, decode


def one_round(runner: tuple[Callable, Callable], prompt: torch.Tensor, gen: int) -> tuple[float, float, torch.Tensor]:
    """Seconds for the prefill and for ``gen`` greedy decode steps, and the tokens generated [B, gen + 1]."""
    prefill, decode = runner
    t0 = time.perf_counter()
    token = prefill(prompt)[:, -1:].argmax(-1)  # [B, 1]
    t1 = time.perf_counter()
    generated = [token]
    for _ in range(gen):
        token = decode(token)[:, -1:].argmax(-1)
        generated.append(token)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, torch.cat(generated, dim=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--gen", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--layers", type=int, default=2)
    args = parser.parse_args()

    torch.manual_seed(0)
    ours = build_model(load_model("llama3.2-1b"), layers=args.layers, dtype=DTYPES[args.dtype])
    hf = hf_twin(ours)
    max_len = args.prompt + args.gen + 1
    prompt = torch.randint(0, ours.spec.vocab_size, (args.batch, args.prompt))
    print(f"llama3.2-1b shape, {args.layers} layers, {args.dtype}, batch {args.batch}, prompt {args.prompt}, "
          f"gen {args.gen}, median of {args.repeats} after 1 warm-up, torch {torch.__version__}, "
          f"transformers {transformers.__version__}, {torch.get_num_threads()} threads")
    runners = {"tfcalc": ours_runner(ours, args.batch, max_len), "transformers": hf_runner(hf, args.batch, max_len)}
    rounds: dict[str, list[tuple[float, float, torch.Tensor]]] = {name: [] for name in runners}
    with torch.inference_mode():
        for _ in range(args.repeats + 1):  # the two models alternate, so drifting machine load hits both
            for name, runner in runners.items():
                rounds[name].append(one_round(runner, prompt, args.gen))
    results = {}
    for name, timed in rounds.items():
        timed = timed[1:]  # round 0 is the warm-up
        p, d = statistics.median(r[0] for r in timed), statistics.median(r[1] for r in timed)
        results[name] = (args.batch * args.prompt / p, args.batch * args.gen / d, timed[-1][2])
        print(f"{name:>12}: prefill {results[name][0]:9.1f} tokens/s, decode {results[name][1]:7.2f} tokens/s")
    agree = torch.equal(results["tfcalc"][2], results["transformers"][2])
    print(f"backend: tfcalc SDPA {ours.attention_backend}; greedy tokens identical: {agree}")
    prefill_ratio = results["tfcalc"][0] / results["transformers"][0]
    print(f"prefill tokens/s: tfcalc {results['tfcalc'][0]:.1f}, transformers {results['transformers'][0]:.1f}, "
          f"ratio {prefill_ratio:.2f}")
    x, y = results["tfcalc"][1], results["transformers"][1]
    print(f"decode tokens/s: tfcalc {x:.2f}, transformers {y:.2f}, ratio {x / y:.2f}")


if __name__ == "__main__":
    main()
