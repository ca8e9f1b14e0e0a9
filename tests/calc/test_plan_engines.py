"""Engine memory models (vLLM, SGLang, TensorRT-LLM): hand-derived figures, real startup logs, properties."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfcalc.calc import engine as eng
from tfcalc.calc.plan import PlanConfig, min_gpus, plan_fit
from tfcalc.calc.shard import shard, stage_weight_bytes
from tfcalc.dtypes import get_dtype, parse_weight_precision
from tfcalc.errors import SpecError, UsageError
from tfcalc.spec import engine as eng_spec
from tfcalc.spec.presets import load_engine, load_gpu, load_model, preset_names

GIB = 1 << 30
MIB = 1 << 20
BF16 = parse_weight_precision("bf16")
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "engine_logs"


def llama31_8b():
    """Llama-3.1-8B: the llama3-8b shape with the 3.1 context (131072 positions, so a 32 MiB rotary cache)."""
    return load_model("llama3-8b").with_overrides(max_context=131072)


def test_every_engine_preset_loads_and_cites_its_source() -> None:
    names = preset_names("engine")
    assert {"vllm-0.8", "vllm-0.11", "vllm-0.17", "vllm-0.21", "sglang-0.5", "trtllm-1.0"} <= set(names)
    for name in names:
        e = load_engine(name)
        assert e.sources and all(text.strip() for text in e.sources.values())
    assert load_engine("vllm").releases == "0.20-0.21"  # the default: the newest line run on aiconfigurator's tables
    assert load_engine("vllm@0.19.1").releases == "0.17-0.19"
    assert load_engine("vllm@0.20.1").releases == "0.20-0.21"
    assert load_engine("vllm@0.29").releases == load_engine("vllm@0.31.2").releases == "0.29-0.31"
    assert load_engine("vllm@0.34").releases == load_engine("vllm@0.35.1").releases == "0.34+"
    assert load_engine("vllm@0.32.1").releases == "0.32" and load_engine("vllm@0.33").releases == "0.33"
    for version in ("0.22", "0.23", "0.24", "0.25", "0.26", "0.27", "0.28"):  # one release line each, two runners
        e = load_engine(f"vllm@{version}.1")
        assert e.releases == version and e.runner == "V1" and e.second_runner is not None
        assert e.second_runner.runner == "V2" and e.second_runner.releases == version
    assert load_engine("vllm@0.9").releases == "0.8-0.10"
    with pytest.raises(UsageError, match="no vllm engine preset covers version 0.7"):
        load_engine("vllm@0.7")
    with pytest.raises(UsageError, match="unknown engine"):
        load_engine("vlm")
    with pytest.raises(UsageError, match="name a version after the @"):  # not silently the default version
        load_engine("vllm@")


def test_engine_yaml_is_validated(tmp_path: Path) -> None:
    text = (Path(__file__).resolve().parent.parent.parent / "presets" / "engines" / "vllm-0.21.yaml").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("hidden_copies: 2", "hidden_copy: 2"))
    with pytest.raises(SpecError, match="unknown field 'activation.hidden_copy'"):
        load_engine(str(bad))
    bad.write_text(text.replace("budget: utilization", "budget: generous"))
    with pytest.raises(SpecError, match="field 'budget' must be"):
        load_engine(str(bad))
    bad.write_text(text.replace("float32_as: bf16", "float32_as: fp8"))
    with pytest.raises(SpecError, match="field 'weights.float32_as' must be bf16 or fp16, got 'fp8'"):
        load_engine(str(bad))
    for entry in ("nf5", "int4-g32-sym"):  # a family is named by its group as N
        bad.write_text(text.replace("float32_as: bf16", f"float32_as: bf16\n  unsupported: [{entry}]"))
        with pytest.raises(SpecError, match=r"field 'weights.unsupported' must be a list of weight formats \(fp32, "
                                            r".*int4-gN-sym"):
            load_engine(str(bad))


def test_an_engine_refuses_weights_it_cannot_serve() -> None:
    """TensorRT-LLM serves no bitsandbytes (nf4) checkpoint: a plan of one is a one-line error, vLLM's is not."""
    spec, gpu = load_model("llama3-8b"), load_gpu("l40s")
    nf4 = parse_weight_precision("nf4")
    def cfg(engine: str) -> PlanConfig:
        return PlanConfig(num_gpus=1, engine=load_engine(engine), context=4096)

    with pytest.raises(UsageError, match="^trtllm does not serve nf4 weights$"):
        plan_fit(spec, gpu, nf4, get_dtype("bf16"), cfg("trtllm"))
    assert plan_fit(spec, gpu, nf4, get_dtype("bf16"), cfg("vllm")).fits
    assert eng.unserved_format(load_engine("trtllm"), parse_weight_precision("experts=nf4,default=fp8")) == \
        "trtllm does not serve nf4 weights"
    # a family listed by its group as N (int4-gN-sym: compressed-tensors' int4 groups, Kimi K2.5's experts): every
    # group size of it, and no other family
    assert eng.unserved_format(load_engine("trtllm"), parse_weight_precision("experts=int4-g32-sym,default=bf16")) \
        == "trtllm does not serve int4-g32-sym weights"
    assert eng.unserved_format(load_engine("trtllm"), parse_weight_precision("int4-g128")) is None  # AWQ / GPTQ
    assert eng.unserved_format(load_engine("vllm"), parse_weight_precision("int4-g32-sym")) is None


def test_a_float32_checkpoint_is_served_in_16_bits(tmp_path: Path) -> None:
    """vLLM's "Downcast for float32 models" (bf16 from 0.10.1, fp16 before) and SGLang's float16: a float32
    checkpoint's weights and cache take 2 bytes an element on those engines, the plain arithmetic (and an engine that
    says nothing) keeps its 4. Llama 3.1 8B saved in float32: half the weights of the plain arithmetic's."""
    from tfcalc.calc.engine import served_precision
    from tfcalc.calc.kv_cache import default_kv_dtype
    from tfcalc.spec.hf_config import load_hf_config

    data = json.loads((FIXTURES.parent / "hf_configs" / "llama3.1-8b.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**data, "torch_dtype": "float32"}))
    spec = load_hf_config(path)
    assert spec.native_dtype == "fp32"
    expected = {"vllm": "bf16", "vllm@0.8": "fp16", "sglang": "fp16", "trtllm": "fp32", None: "fp32"}
    for name, dtype in expected.items():
        engine = load_engine(name) if name else None
        assert served_precision(spec, engine).label == dtype, name
        assert default_kv_dtype(spec, engine).name == dtype, name
    bf16 = load_hf_config(FIXTURES.parent / "hf_configs" / "llama3.1-8b.json")
    assert served_precision(bf16, load_engine("vllm")).label == "bf16"   # a 16-bit checkpoint is as it is
    vllm = PlanConfig(num_gpus=1, context=8192, engine=load_engine("vllm"))
    ideal = PlanConfig(num_gpus=1, context=8192)
    gpu = load_gpu("h100-sxm")
    served = plan_fit(spec, gpu, served_precision(spec, vllm.engine), default_kv_dtype(spec, vllm.engine), vllm)
    plain = plan_fit(spec, gpu, served_precision(spec, None), default_kv_dtype(spec, None), ideal)
    assert plain.weights_bytes_per_gpu == 2 * served.weights_bytes_per_gpu_ideal   # the engine's padding aside


def test_a_float32_hybrids_states_follow_the_16_bit_format_it_is_served_in() -> None:
    """Qwen3-Next saved in float32 (no mamba_ssm_dtype): vLLM serves it in bf16 and keeps its Gated DeltaNet conv and
    recurrent states in the model dtype (--mamba-cache-dtype auto), 2 bytes an element; the plain arithmetic keeps
    the checkpoint's 4, and so does a state the checkpoint names float32 (Qwen3.5's mamba_ssm_dtype)."""
    from tfcalc.calc.kv_cache import state_dtypes
    from tfcalc.calc.plan import state_page
    from tfcalc.calc.shard import Parallelism, shard
    from tfcalc.spec.hf_config import spec_from_hf_config

    data = json.loads((FIXTURES.parent / "hf_configs" / "qwen3-next-80b-a3b.json").read_text())
    spec = spec_from_hf_config({**data, "torch_dtype": "float32"}, origin="x", name="x")
    sh = shard(spec, Parallelism())
    vllm_state, _ = state_page(spec, load_engine("vllm"), sh, get_dtype("bf16"), 16)
    plain_state, _ = state_page(spec, None, sh, get_dtype("fp32"), 16)
    assert plain_state == 2 * vllm_state == 4 * (sh.state_conv_elements + sh.state_recurrent_elements)
    named = replace(spec, linear_attention=replace(spec.linear_attention, recurrent_state_dtype="fp32"))
    assert [d.name for d in state_dtypes(named, "bf16")] == ["bf16", "fp32"]
    from tfcalc.calc.latency import deployment  # the latency model reads and writes them in that format too

    served = deployment(spec, load_gpu("h100-sxm"), parse_weight_precision("bf16"), get_dtype("bf16"))
    assert served.dims.linear_conv_state_bytes == 2 * sh.state_conv_elements


def test_vllm_019_llama31_8b_by_hand() -> None:
    """Every term derived by hand from vLLM's source, then against the logged figures (shared/realworld)."""
    e, gpu = load_engine("vllm@0.19"), load_gpu("h100-sxm")
    r = plan_fit(llama31_8b(), gpu, BF16, get_dtype("bf16"),
                 PlanConfig(num_gpus=1, context=8192, engine=e, gpu_memory_utilization=0.95))
    capacity = round(79.19 * GIB)
    assert r.capacity_bytes == capacity and r.capacity_is_runtime
    # weights: 8,030,261,248 params x 2 B + rotary cos/sin cache 131072 positions x 128 x 2 B
    assert r.weights_bytes_per_gpu == 2 * 8_030_261_248 + 131072 * 128 * 2
    # profiling run (max_num_seqs 1024, max_num_batched_tokens 8192 on an H100): sampler over 1024 rows of
    # 128,256 logits x 14 B + the Triton top-k/top-p buffer (132 rows x 4 B) + hidden and residual [8192, 4096]
    sampler = 1024 * 128256 * 14 + 132 * 128256 * 4 + 2 * 8192 * 4096 * 2
    forward = 8192 * 2 * (2 * 4096 + 3 * 14336)  # hidden + residual + gate_up + activation output
    assert (r.max_num_seqs, r.max_num_batched_tokens) == (1024, 8192)
    assert r.activation_forward_bytes == forward and r.activation_sampler_bytes == sampler
    assert r.activation_peak_bytes == max(forward, sampler)
    assert r.non_torch_bytes == round(0.25 * GIB) and not r.cuda_graphs_in_budget
    budget = math.floor(capacity * 0.95) - r.weights_bytes_per_gpu - sampler - round(0.25 * GIB)
    assert r.kv_budget_bytes_per_gpu == budget
    page = 16 * 2 * 8 * 128 * 2  # one block of one layer
    assert r.kv_pool_blocks_per_gpu == budget // (page * 32)
    assert r.kv_tokens_per_gpu == r.kv_pool_blocks_per_gpu * 16
    assert r.max_concurrent_sequences == r.kv_pool_blocks_per_gpu // 512  # 8192 / 16 blocks per request
    # the log: 'Model loading took 14.99 GiB', 'torch peak memory increase: 1.89GiB', 'Available KV cache
    # memory: 58.11 GiB', 'GPU KV cache size: 476,016 tokens', 'Maximum concurrency ... 58.11x'
    assert round(r.weights_bytes_per_gpu / GIB, 2) == 14.99
    assert abs(r.activation_peak_bytes / GIB - 1.89) < 0.02
    assert abs(r.kv_tokens_per_gpu - 476_016) / 476_016 < 0.001
    assert r.max_concurrent_sequences == 58


def test_cuda_graph_memory_is_subtracted_from_021() -> None:
    spec, gpu = llama31_8b(), load_gpu("h100-sxm")
    cfg = PlanConfig(num_gpus=1, context=8192, gpu_memory_utilization=0.95)
    old = plan_fit(spec, gpu, BF16, get_dtype("bf16"), replace(cfg, engine=load_engine("vllm@0.19")))
    new = plan_fit(spec, gpu, BF16, get_dtype("bf16"), replace(cfg, engine=load_engine("vllm")))
    # 51 capture sizes ([1, 2, 4] + 8..248 + 256..512): 256 MiB first capture + 50 x 12 MiB
    assert len(eng.capture_sizes("vllm", 1024)) == 51 and len(eng.capture_sizes("vllm", 64)) == 19
    assert new.cuda_graph_bytes == old.cuda_graph_bytes == 256 * MIB + 50 * 12 * MIB
    assert new.cuda_graphs_in_budget and not old.cuda_graphs_in_budget
    assert old.kv_budget_bytes_per_gpu - new.kv_budget_bytes_per_gpu == new.cuda_graph_bytes
    opted_in = plan_fit(spec, gpu, BF16, get_dtype("bf16"), replace(cfg, engine=load_engine("vllm@0.19"),
                                                                    cuda_graphs_in_budget=True))
    assert opted_in.kv_budget_bytes_per_gpu == new.kv_budget_bytes_per_gpu


def test_vllm_08_counts_context_and_nccl_and_sorts_256_rows() -> None:
    e = load_engine("vllm@0.8")
    spec, gpu = llama31_8b(), load_gpu("h100-sxm")
    r1 = plan_fit(spec, gpu, BF16, get_dtype("bf16"), PlanConfig(num_gpus=1, context=8192, engine=e))
    r2 = plan_fit(spec, gpu, BF16, get_dtype("bf16"), PlanConfig(num_gpus=2, tp=2, context=8192, engine=e))
    assert r1.max_num_seqs == 256 and r1.activation_sampler_bytes == 256 * 128256 * 38 + 2 * 8192 * 4096 * 2
    held_1 = r1.capacity_bytes * 9 // 10 - r1.weights_bytes_per_gpu - r1.kv_budget_bytes_per_gpu
    held_2 = r2.capacity_bytes * 9 // 10 - r2.weights_bytes_per_gpu - r2.kv_budget_bytes_per_gpu
    # startup (context 0.51 GiB; + NCCL 1.51 at tp 2) and non-torch (0.25; 2.1) both counted
    assert held_1 - r1.activation_peak_bytes == pytest.approx(0.76 * GIB, abs=2)
    assert held_2 - r2.activation_peak_bytes == pytest.approx(3.61 * GIB, abs=2)
    assert r1.kv_groups == 1  # 0.8 caches sliding-window layers as full attention: no groups


def test_kv_groups_follow_vllm_hybrid_allocator() -> None:
    e = load_engine("vllm")
    gemma3 = eng.kv_groups(e, full_layers=10, sliding_layers=52)  # Gemma-3-27B: 5 local : 1 global
    assert (gemma3.group_size, gemma3.full_groups, gemma3.sliding_groups, gemma3.padding_layers) == (10, 1, 6, 8)
    assert eng.kv_groups(e, 23, 23) == eng.KVGroups(group_size=23, full_groups=1, sliding_groups=1,
                                                    padding_layers=0)
    assert eng.kv_groups(e, 9, 11).group_size == 11  # within 1.5 x: the larger count, one group each
    assert eng.kv_groups(None, 10, 52).num_groups == 1
    # one request of 8192 tokens: full groups 512 blocks; a sliding group min(window - 1 + 8192, 8192) / 16 + 1
    assert eng.blocks_per_request(e, gemma3, 1024, 8192, 8192, 16) == 512 + 6 * 513
    assert eng.blocks_per_request(e, gemma3, 1024, 131072, 2048, 16) == 8192 + 6 * (-(-3071 // 16) + 1)


def test_gemma3_27b_matches_vllm_019_layout() -> None:
    from tfcalc.spec.hf_config import load_hf_config

    spec = load_hf_config(FIXTURES / "gemma-3-27b-it-text.json")
    r = plan_fit(spec, load_gpu("h100-sxm"), BF16, get_dtype("bf16"),
                 PlanConfig(num_gpus=1, context=8192, engine=load_engine("vllm@0.19"), gpu_memory_utilization=0.95))
    assert (r.kv_groups, r.kv_group_size, r.kv_padding_layers) == (7, 10, 8)  # 'Add 8 padding layers'
    assert r.kv_tokens_per_gpu == r.kv_pool_blocks_per_gpu // 7 * 16
    assert r.max_concurrent_sequences == r.kv_pool_blocks_per_gpu // 3590


def test_sglang_default_fraction_and_pool() -> None:
    e, gpu = load_engine("sglang"), load_gpu("h100-sxm")
    # H100 (79.19 GiB = 81,090.56 MiB) at tp 4: chunked prefill 8192, cuda_graph_max_bs 512:
    # reserved = 512 + 8192 x 1.5 + 512 x 2 + 4 / 8 x 1024 = 14,336 MiB
    assert eng.static_fraction(e, gpu, tp=4, pp=1, chunked_prefill=8192) == round((81090.56 - 14336) / 81090.56, 3)
    # tp 1: 512 + 12288 + 512 + 128 = 13,440 MiB
    assert eng.static_fraction(e, gpu, tp=1, pp=1, chunked_prefill=8192) == round((81090.56 - 13440) / 81090.56, 3)
    # 0.5.10+ also reserves its prefill CUDA graphs: 8 MiB x 58 capture sizes up to 8192 tokens (MHA), 1.5 GiB (MLA),
    # none at pp > 1 or for DeepSeek-V4 (graphs off); 0.5-0.5.9 none
    dense, mla, v4 = load_model("llama3-8b"), load_model("deepseek-v3"), load_model("deepseek-v4-flash")
    assert [len(eng.prefill_graph_sizes(n)) for n in (2048, 4096, 8192, 16384)] == [42, 50, 58, 74]
    assert eng.static_fraction(e, gpu, 1, 1, 8192, dense) == round((81090.56 - 13440 - 58 * 8) / 81090.56, 3) == 0.829
    assert eng.static_fraction(e, gpu, 1, 1, 8192, mla) == round((81090.56 - 13440 - 1536) / 81090.56, 3)
    for spec_, pp in ((v4, 1), (dense, 2)):
        assert eng.static_fraction(e, gpu, 1, pp, 8192, spec_) == round((81090.56 - 13440 - (pp - 1) * 128) / 81090.56,
                                                                        3)
    assert eng.static_fraction(load_engine("sglang@0.5.4"), gpu, 1, 1, 8192, dense) == 0.834
    # data-parallel attention (tfcalc's ep > tp): SGLang's --tp spans the 8 ranks, so cuda_graph_max_bs is the tp >= 4
    # tier's 512 and the tp x pp / 8 term 1,024 MiB, and the ranks add 512 x 8 x (3 + 1.5) MiB
    h200 = load_gpu("h200")
    g = eng.capacity_bytes(h200) / 2**20
    reserved = 512 + 8192 * 1.5 + 512 * 2 + 1024 + 512 * 8 * 4.5 + 1536
    assert eng.static_fraction(e, h200, 1, 1, 8192, mla, attention_dp=8) == round((g - reserved) / g, 3) == 0.757
    # 0.5.22+: a --max-running-requests of 128 lowers cuda_graph_max_bs to it (0.5-0.5.9 keep the tier's 512)
    clamped = 512 + 8192 * 1.5 + 128 * 2 + 1024 + 128 * 8 * 3 + 1536
    assert eng.static_fraction(e, h200, 1, 1, 8192, mla, attention_dp=8, max_running=128) == round((g - clamped) / g,
                                                                                                    3)
    old = load_engine("sglang@0.5.4")
    assert eng.static_fraction(old, h200, 1, 1, 8192, mla, 8, 128) == eng.static_fraction(old, h200, 1, 1, 8192, mla,
                                                                                          8)
    spec = load_model("qwen2.5-7b")
    r = plan_fit(spec, gpu, BF16, get_dtype("bf16"), PlanConfig(num_gpus=1, context=32768, engine=e,
                                                                 gpu_memory_utilization=0.88))
    pool = math.floor((r.capacity_bytes - round(0.51 * GIB)) * 0.88) - r.weights_bytes_per_gpu
    cell = 28 * 2 * 4 * 128 * 2  # all layers' K and V per token
    assert r.kv_budget_bytes_per_gpu == pool and r.kv_tokens_per_gpu == pool // cell
    assert r.max_concurrent_sequences == r.kv_tokens_per_gpu // 32768 and r.activation_peak_bytes == 0


def test_trtllm_free_fraction() -> None:
    e, gpu = load_engine("trtllm"), load_gpu("h100-sxm")
    r = plan_fit(llama31_8b(), gpu, BF16, get_dtype("bf16"), PlanConfig(num_gpus=1, context=8192, engine=e))
    used = r.weights_bytes_per_gpu + round(0.51 * GIB) + round(0.25 * GIB) + r.activation_peak_bytes
    assert r.kv_budget_bytes_per_gpu == math.floor((r.capacity_bytes - used) * 0.9)
    assert r.block_size == 32 and r.vocab_rows == 128256  # no vocabulary padding
    per_token = 32 * 2 * 8 * 128 * 2
    assert r.kv_tokens_per_gpu == r.kv_budget_bytes_per_gpu // (32 * per_token) * 32


CASES = json.loads((FIXTURES / "cases.json").read_text())["cases"]


def _run(args: list[str]) -> dict:
    from typer.testing import CliRunner

    from tfcalc.cli import app

    args = [str(FIXTURES / a) if a.endswith(".json") else a for a in args]
    result = CliRunner().invoke(app, ["plan", *args, "-f", "json"])
    assert result.exit_code in (0, 1), result.output
    return json.loads(result.stdout)[0]


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_held_out_engine_logs(case: dict) -> None:
    """Logs that are not in shared/realworld: weights within 2 %, KV budget and tokens within 5 %, concurrency
    equal to vLLM's floored figure or within 5 %."""
    if "versions" in case:
        for version, logged in case["versions"].items():
            row = _run([*case["args"], "--engine", version])
            assert abs(row["kv_budget_bytes_per_gpu"] / GIB / logged["kv_budget_gib"] - 1) < 0.05, version
        return
    row, logged = _run(case["args"]), case["logged"]
    if "weights_gib" in logged:
        assert abs(row["weights_bytes_per_gpu"] / GIB / logged["weights_gib"] - 1) < 0.02
    assert abs(row["kv_budget_bytes_per_gpu"] / GIB / logged["kv_budget_gib"] - 1) < 0.05
    assert abs(row["kv_tokens_per_gpu"] / logged["kv_tokens"] - 1) < 0.05
    if "max_concurrency" in logged:
        real = math.floor(logged["max_concurrency"])
        assert row["max_concurrent_sequences"] == real or abs(row["max_concurrent_sequences"] / real - 1) < 0.05


def test_version_changes_are_the_sampler_path() -> None:
    """Qwen3-14B: the 3.4 GiB vLLM 0.17 gave back is the sort-based dummy sampler (38 vs 14 B per logit)."""
    old, new = (_run([*CASES[2]["args"], "--engine", v]) for v in ("vllm@0.16", "vllm@0.17"))
    gained = (new["kv_budget_bytes_per_gpu"] - old["kv_budget_bytes_per_gpu"]) / GIB
    assert abs(gained - (45.34 - 41.94)) < 0.15


# --- checkpoint formats -------------------------------------------------------------------------------------


def test_fp8_keeps_embedding_lm_head_router_in_bf16_unless_asked() -> None:
    spec, gpu = load_model("mixtral-8x7b"), load_gpu("h100-sxm")
    cfg = PlanConfig(num_gpus=1, context=4096)
    kept = plan_fit(spec, gpu, parse_weight_precision("fp8"), get_dtype("bf16"), cfg).weights_bytes_per_gpu
    asked = plan_fit(spec, gpu, parse_weight_precision("default=fp8,lm_head=fp8,embedding=fp8,router=fp8"),
                     get_dtype("bf16"), cfg).weights_bytes_per_gpu
    # embedding + lm_head 2 x 32000 x 4096 and 32 routers of 4096 x 8: one byte each more when kept in bf16
    assert kept - asked == 2 * 32000 * 4096 + 32 * 4096 * 8
    assert parse_weight_precision("fp8").kept_16_bit == ("embedding", "lm_head", "router", "encoder")
    assert parse_weight_precision("bf16").kept_16_bit == ()


def test_llama31_405b_fp8_checkpoint_exceptions() -> None:
    """Meta's FP8 405B: every attention and the first and last layers' MLP stay bf16 (modules_to_not_convert)."""
    spec = load_model("llama3.1-405b")
    sh = shard(spec, replace_par(8))
    fp8 = parse_weight_precision("fp8")
    weights = stage_weight_bytes(spec, sh, fp8, range(126), True, True)
    h, f = 16384, 53248
    attention = (2 * h * h + 2 * h * 8 * 128) // 8  # q, o split; one KV head of k, v per GPU at tp 8
    mlp = 3 * h * f // 8
    expected = (126 * attention * 2 + 124 * mlp + 2 * mlp * 2 + 2 * 128256 * h // 8 * 2
                + (126 * 2 * h + h) * 2)
    assert weights == expected
    # int4 is not the format those exceptions name: everything quantizable is int4 there
    int4 = stage_weight_bytes(spec, sh, parse_weight_precision("int4-g128"), range(126), True, True)
    assert int4 < weights / 2


def replace_par(tp: int):
    from tfcalc.calc.shard import Parallelism

    return Parallelism(tp=tp)


def test_mxfp4_experts_padded_to_the_kernel_layout() -> None:
    spec = load_model("gpt-oss-20b")
    precision = parse_weight_precision(spec.native_dtype)
    e = load_engine("vllm")
    r = plan_fit(spec, load_gpu("h100-sxm"), precision, get_dtype("bf16"),
                 PlanConfig(num_gpus=2, tp=2, context=8192, engine=e))
    assert (r.mxfp4_padded_hidden, r.mxfp4_padded_intermediate) == (3072, 1536)  # 2880 -> 3072, 1440 -> 1536
    ideal = plan_fit(spec, load_gpu("h100-sxm"), precision, get_dtype("bf16"),
                     PlanConfig(num_gpus=2, tp=2, context=8192))
    # 24 layers x 32 experts x 3 x (3072 x 1536 - 2880 x 1440) x 4.25 / 8 B, + biases, rotary and vocab padding
    padded = 24 * 32 * 3 * (3072 * 1536 - 2880 * 1440) * 17 // 32
    assert 0 < r.weights_bytes_per_gpu - ideal.weights_bytes_per_gpu - padded < 40 * MIB
    from tfcalc.report.plan import plan_note

    assert "MXFP4 experts padded to hidden 3,072" in plan_note(spec, load_gpu("h100-sxm"), precision,
                                                               get_dtype("bf16"), r)


# --- properties ---------------------------------------------------------------------------------------------


@settings(max_examples=20, deadline=None)
@given(st.sampled_from(["llama3-8b", "mixtral-8x7b", "gemma2-27b", "qwen2.5-7b", "gpt-oss-20b"]),
       st.sampled_from(["vllm", "vllm@0.19", "vllm@0.8", "sglang", "trtllm"]), st.sampled_from([1, 2, 4]),
       st.integers(1, 3), st.sampled_from([4096, 32768]))
def test_more_gpus_never_fewer_sequences(name: str, engine: str, tp: int, replicas: int, context: int) -> None:
    spec, gpu, e = load_model(name), load_gpu("h100-sxm"), load_engine(engine)
    precision = parse_weight_precision(spec.native_dtype)

    def seqs(n: int, t: int) -> int:
        return plan_fit(spec, gpu, precision, get_dtype("bf16"),
                        PlanConfig(num_gpus=n, tp=t, context=context, engine=e), with_ideal=False
                        ).max_concurrent_sequences

    try:
        assert seqs(tp * (replicas + 1), tp) >= seqs(tp * replicas, tp)
        if tp > 1:  # twice the GPUs as a tp group: no fewer sequences either
            assert seqs(tp, tp) >= seqs(tp // 2, tp // 2)
    except UsageError:
        return


@settings(max_examples=20, deadline=None)
@given(st.sampled_from(["llama3-8b", "qwen2.5-7b", "gemma2-9b", "deepseek-v3"]),
       st.sampled_from(["vllm", "vllm@0.19", "vllm@0.11", "vllm@0.8", "sglang", "trtllm"]),
       st.floats(0.5, 0.94), st.floats(0.001, 0.05))
def test_higher_utilization_never_less_kv(name: str, engine: str, low: float, step: float) -> None:
    spec, gpu, e = load_model(name), load_gpu("h200"), load_engine(engine)
    tp = 8 if name == "deepseek-v3" else 1
    precision = parse_weight_precision(spec.native_dtype)

    def plan(util: float):
        return plan_fit(spec, gpu, precision, get_dtype("bf16"), PlanConfig(
            num_gpus=tp, tp=tp, context=8192, engine=e, gpu_memory_utilization=util), with_ideal=False)

    lo, hi = plan(low), plan(min(low + step, 1.0))
    assert hi.kv_budget_bytes_per_gpu >= lo.kv_budget_bytes_per_gpu
    assert hi.kv_tokens_per_gpu >= lo.kv_tokens_per_gpu and hi.max_concurrent_sequences >= lo.max_concurrent_sequences


@settings(max_examples=15, deadline=None)
@given(st.integers(2, 60), st.lists(st.integers(0, 59), max_size=20), st.lists(st.integers(0, 59), max_size=30),
       st.integers(1, 6), st.sampled_from(["bf16", "fp8", "experts=mxfp4,default=bf16"]))
def test_grouped_layers_equal_layer_by_layer(layers: int, dense: list[int], sliding: list[int], pp: int,
                                              fmt: str) -> None:
    """Planning by kinds of layers gives the bytes a layer-by-layer sum gives (brute force)."""
    from tfcalc.calc.shard import stage_layers

    dense = sorted({i for i in dense if i < layers})
    sliding = sorted({i for i in sliding if i < layers})
    spec = load_model("mixtral-8x7b").with_overrides(layers=layers)
    spec = replace(spec, moe=replace(spec.moe, dense_layers=tuple(dense)), sliding_window=64,
                   sliding_window_layers=tuple(sliding))
    pp = min(pp, layers)
    sh = shard(spec, replace_par(2))
    precision = parse_weight_precision(fmt)
    for s, run in enumerate(stage_layers(layers, pp)):
        first, last = s == 0, s == pp - 1
        grouped = stage_weight_bytes(spec, sh, precision, run, first, last)
        edges = stage_weight_bytes(spec, sh, precision, range(run.start, run.start), first, last)
        one_by_one = edges + sum(stage_weight_bytes(spec, sh, precision, range(i, i + 1), False, False)
                                 for i in run)
        assert abs(grouped - one_by_one) <= len(run)  # each single-layer figure is rounded up once


def test_min_gpus_is_bounded_and_uses_replicas() -> None:
    spec, gpu, e = load_model("llama3-70b"), load_gpu("h100-sxm"), load_engine("vllm")
    cfg = PlanConfig(num_gpus=1, context=8192, batch=4096, engine=e)
    r = min_gpus(spec, gpu, BF16, get_dtype("bf16"), cfg, max_gpus=10**9)
    assert r is not None and r.fits and r.parallelism.dp > 1 and r.max_concurrent_sequences >= 4096
    with pytest.raises(UsageError, match="at least 1"):
        min_gpus(spec, gpu, BF16, get_dtype("bf16"), cfg, max_gpus=0)
    with pytest.raises(UsageError, match="search limit"):
        min_gpus(spec, gpu, BF16, get_dtype("bf16"), cfg, max_gpus=10**15)


def test_the_largest_allowed_layer_count_plans() -> None:
    """Grouped work: a model at the spec's layer limit (10,000) plans (the time is a benchmark, not asserted)."""
    spec = load_model("llama3-8b").with_overrides(layers=10_000)
    r = plan_fit(spec, load_gpu("h100-sxm"), BF16, get_dtype("bf16"),
                 PlanConfig(num_gpus=64, tp=1, pp=64, context=4096, engine=load_engine("vllm")))
    assert sum(r.stage_layer_counts) == 10_000
    assert r.kv_bytes_per_token_per_gpu == 157 * 2 * 8 * 128 * 2  # the largest stage: 10,000 = 16 x 157 + 48 x 156


def test_memory_command_follows_the_same_checkpoint_rules() -> None:
    """`tfcalc memory` and `tfcalc plan` agree on one GPU: tables kept bf16, per-layer exceptions applied."""
    from tfcalc.calc.memory import weights_bytes_by_component
    from tfcalc.calc.params import count_params

    spec = load_model("llama3.1-405b")
    fp8 = parse_weight_precision("fp8")
    by_component = weights_bytes_by_component(count_params(spec), fp8, spec=spec)
    one_gpu = stage_weight_bytes(spec, shard(spec, replace_par(1)), fp8, range(126), True, True)
    assert abs(sum(by_component.values()) - one_gpu) <= len(by_component)
    assert by_component["attention"] == 2 * 126 * (2 * 16384 * 16384 + 2 * 16384 * 8 * 128)  # all bf16
    assert by_component["lm_head"] == 2 * 128256 * 16384


def test_group_size_ratio_follows_the_release() -> None:
    """vLLM takes the larger layer type's count as the group size while it is under 1.25 x the smaller's (until
    0.17) or 1.5 x (0.18+, kv.group_size_ratio): 12 full and 16 sliding layers make one group each of 16 (four
    padding slots) from 0.18, and groups of 12 (3 sliding groups, 8 padding slots) before."""
    new, old = load_engine("vllm"), load_engine("vllm@0.11")
    assert (new.kv.group_size_ratio, load_engine("vllm@0.19").kv.group_size_ratio, old.kv.group_size_ratio) == (
        1.5, 1.5, 1.25)
    assert eng.kv_groups(new, 12, 16) == eng.KVGroups(group_size=16, full_groups=1, sliding_groups=1,
                                                      padding_layers=4)
    assert eng.kv_groups(old, 12, 16) == eng.KVGroups(group_size=12, full_groups=1, sliding_groups=2,
                                                      padding_layers=8)
    assert eng.kv_groups(new, 10, 15).group_size == 10   # 15 is not under 1.5 x 10


def test_dense_kv_tokens_are_the_pool_either_way() -> None:
    """One full-attention group and a max_model_len that is a multiple of the block: vLLM 0.20.1+'s "GPU KV cache
    size" (int(concurrency x max_model_len)) equals the blocks x block size of the releases before."""
    spec, gpu = load_model("llama3-8b"), load_gpu("h100-sxm")
    cfg = PlanConfig(num_gpus=1, context=8192, engine=load_engine("vllm"))
    r = plan_fit(spec, gpu, BF16, get_dtype("bf16"), cfg)
    blocks = load_engine("vllm")
    old = plan_fit(spec, gpu, BF16, get_dtype("bf16"), replace(cfg, engine=replace(blocks, kv=replace(
        blocks.kv, tokens="blocks"))))
    assert r.kv_tokens_per_gpu == old.kv_tokens_per_gpu == r.kv_pool_blocks_per_gpu * 16 == r.kv_pool_tokens_per_gpu


def test_kv_groups_with_gated_deltanet_state_groups() -> None:
    """vLLM groups Gated DeltaNet (Mamba-like) layers with the attention layers: Qwen3.5-27B's 16 attention and 48
    state layers make 1 + 3 groups of 16; a request takes one block in each state group."""
    e = load_engine("vllm")
    qwen = eng.kv_groups(e, full_layers=16, sliding_layers=0, state_layers=48)
    assert (qwen.group_size, qwen.full_groups, qwen.state_groups, qwen.padding_layers) == (16, 1, 3, 0)
    assert eng.blocks_per_request(e, qwen, None, 32_768, 8192, 784) == 42 + 3
    near = eng.kv_groups(e, full_layers=10, sliding_layers=0, state_layers=12)  # within 1.5 x: groups of 12
    assert (near.group_size, near.full_groups, near.state_groups, near.padding_layers) == (12, 1, 1, 2)
    assert eng.kv_groups(None, 16, 0, 48).num_groups == 1
    # the attention block that makes one page hold a layer's state: 16 x cdiv(state, 16 x one token's page)
    assert eng.hybrid_block_size(16, 4096, 3_207_168) == 16 * -(-3_207_168 // (16 * 4096)) == 784
    assert eng.hybrid_block_size(1024, 4096, 3_207_168) == 1024  # a larger block the user set stays
    assert eng.hybrid_block_size(16, 4096, 0) == 16


@pytest.mark.parametrize(("tp", "state", "page"), [(1, 3_207_168, 4096), (2, 3_207_168 // 2, 2048)])
def test_qwen35_27b_vllm_plan_by_hand(tp: int, state: int, page: int) -> None:
    """Per GPU: each Gated DeltaNet layer's state (conv rows in bf16 + float32 recurrent state, split by head over
    tp) and one token's K and V in the 16 attention layers; vLLM raises the block to 784 tokens so a page holds a
    state, groups the 64 layers 16 to a group and gives a request cdiv(C, 784) blocks plus one per state group."""
    spec = load_model("qwen3.5-27b")
    r = plan_fit(spec, load_gpu("h100-sxm"), BF16, get_dtype("bf16"),
                 PlanConfig(num_gpus=tp, tp=tp, context=32_768, engine=load_engine("vllm")))
    assert r.state_bytes_per_layer == state == (3 * (2 * 16 * 128 + 48 * 128) * 2 + 48 * 128 * 128 * 4) // tp
    assert r.kv_elements_per_token_per_layer * 2 == page
    assert r.block_size == 784 and r.block_size_asked == 16 and 784 * page >= state
    assert (r.kv_groups, r.kv_group_size, r.kv_padding_layers) == (4, 16, 0)
    assert r.kv_pool_blocks_per_gpu == r.kv_budget_bytes_per_gpu // (784 * page * 16)
    assert r.kv_pool_tokens_per_gpu == r.kv_pool_blocks_per_gpu // 4 * 784
    assert r.kv_blocks_per_request == 42 + 3
    # "GPU KV cache size" (0.20.1+): int(Maximum concurrency x max_model_len)
    assert r.kv_tokens_per_gpu == r.kv_pool_blocks_per_gpu * 32_768 // 45
    assert r.max_concurrent_sequences == r.kv_pool_blocks_per_gpu // 45


def test_hybrid_sequences_pay_their_state_in_every_engine() -> None:
    """Without vLLM's state groups (the ideal arithmetic) a sequence still takes its states beside its KV: fewer
    sequences than the KV alone allows. SGLang splits a pool of state slots off the budget first (0.9 : 1, one
    padding slot), a running request keeping 3 + 2 of them (Gated DeltaNet's extra buffer; Nemotron-H's Mamba-2: 3)."""
    spec = load_model("qwen3.5-27b")
    r = plan_fit(spec, load_gpu("h100-sxm"), BF16, get_dtype("bf16"), PlanConfig(num_gpus=1, context=4096))
    kv_only = r.kv_budget_bytes_per_gpu // (4096 * 65_536)
    with_state = r.kv_budget_bytes_per_gpu // (4096 * 65_536 + 48 * r.state_bytes_per_layer)
    assert r.max_concurrent_sequences == with_state < kv_only and r.max_running_requests is None
    for model, slots in (("qwen3.5-27b", 5), ("nemotron-h-56b", 3)):
        spec = load_model(model)
        tp = 1 if model == "qwen3.5-27b" else 2
        r = plan_fit(spec, load_gpu("h100-sxm"), BF16, get_dtype("bf16"),
                     PlanConfig(num_gpus=tp, tp=tp, context=4096, engine=load_engine("sglang")))
        free, per_request = r.kv_budget_bytes_per_gpu, spec.num_linear_layers * r.state_bytes_per_layer
        states = int((free * 0.9 / 1.9 - per_request) // per_request)
        assert states == eng.state_pool_slots(free, per_request, 0.9) and r.max_running_requests == states // slots
        token = r.kv_bytes_per_token_per_gpu
        assert r.kv_tokens_per_gpu == (free - (states + 1) * per_request) // token
        assert r.max_concurrent_sequences == min(r.kv_tokens_per_gpu // 4096, states // slots)


def test_tp_must_split_the_linear_heads() -> None:
    spec = load_model("qwen3.5-27b")
    la = spec.linear_attention
    assert la is not None
    odd = spec.with_overrides(linear_attention=replace(la, num_key_heads=6, num_value_heads=12))
    with pytest.raises(UsageError, match="tp 4 does not divide the 6 key and 12 value heads"):
        plan_fit(odd, load_gpu("h100-sxm"), BF16, get_dtype("bf16"), PlanConfig(num_gpus=4, tp=4, context=4096))


def test_llama4_chunked_layers_in_each_engines_pool() -> None:
    """Llama 4 Scout at 128K on 8 x H100: vLLM's hybrid allocator, where chunked local attention is allowed
    (VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1, the default from 0.14: vllm-0.17, vllm-0.21), groups 12
    NoPE and 36 chunked layers in 4 groups of 12, a chunked group admitting cdiv(8192 + 8192, 16) blocks per request
    (ChunkedLocalAttentionSpec); vllm-0.11 (the variable off until 0.13), SGLang (no --hybrid-kvcache-ratio) and
    TensorRT-LLM cache every layer whole."""
    spec, gpu = load_model("llama4-scout-17b-16e"), load_gpu("h100-sxm")

    def run(e):  # noqa: ANN001, ANN202 - EngineSpec -> PlanResult
        return plan_fit(spec, gpu, BF16, get_dtype("bf16"), PlanConfig(num_gpus=8, tp=8, context=131072, engine=e))

    vllm = load_engine("vllm")
    assert vllm.kv.chunked_local and load_engine("vllm@0.19").kv.chunked_local
    assert not load_engine("vllm@0.11").kv.chunked_local
    new, old, sglang = run(vllm), run(replace(vllm, kv=replace(vllm.kv, chunked_local=False))), run(
        load_engine("sglang"))
    assert (new.kv_groups, new.kv_group_size, new.max_num_batched_tokens) == (4, 12, 8192)
    assert new.kv_blocks_per_request == 131072 // 16 + 3 * (8192 + 8192) // 16
    assert new.max_concurrent_sequences == new.kv_pool_blocks_per_gpu // new.kv_blocks_per_request
    assert (old.kv_groups, old.kv_group_size, old.kv_blocks_per_request) == (1, 48, 131072 // 16)
    assert old.max_concurrent_sequences == old.kv_pool_blocks_per_gpu // (131072 // 16)
    assert sglang.kv_blocks_per_request == 131072 and sglang.max_concurrent_sequences == (
        sglang.kv_pool_blocks_per_gpu // 131072)
    assert new.max_concurrent_sequences > 2.5 * old.max_concurrent_sequences  # 35 against 12


def test_llama4_scout_8m_context_matches_a_vllm_012_log_with_chunked_groups() -> None:
    """A public vLLM v0.12.0 deployment (Llama-4-Scout-17B-16E-Instruct, 8 x H200, tp 8, --max-model-len 8388608,
    --gpu-memory-utilization 0.9, VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1) logged "Available KV cache
    memory: 89.71 GiB", "GPU KV cache size: 3,919,664 tokens" and "Maximum concurrency for 8,388,608 tokens per
    request: 1.86x". The pool's layout is exact: tokens and concurrency per byte of budget match to 0.1 %."""
    e = load_engine("vllm@0.11")
    hybrid = replace(e, kv=replace(e.kv, chunked_local=True))
    r = plan_fit(load_model("llama4-scout-17b-16e"), load_gpu("h200"), BF16, get_dtype("bf16"),
                 PlanConfig(num_gpus=8, tp=8, context=8388608, engine=hybrid, gpu_memory_utilization=0.9))
    logged_budget = 89.71 * 2**30
    assert r.kv_budget_bytes_per_gpu == pytest.approx(logged_budget, rel=0.03)
    assert r.kv_tokens_per_gpu / r.kv_budget_bytes_per_gpu == pytest.approx(3_919_664 / logged_budget, rel=1e-3)
    concurrency = r.kv_pool_blocks_per_gpu / r.kv_blocks_per_request
    assert concurrency / r.kv_budget_bytes_per_gpu == pytest.approx(1.86 / logged_budget, rel=5e-3)
    assert r.kv_blocks_per_request == 8388608 // 16 + 3 * (8192 + 8192) // 16


# --- Gemma 4: layer groups whose pages differ --------------------------------------------------------------------

def test_unified_block_sizes_follow_vllm() -> None:
    """vLLM unify_kv_cache_spec_page_size: the smaller page's block grows until its page is the largest one."""
    assert eng.unified_block_sizes(16, (256 * 1024, 128 * 1024)) == (16, 32)
    assert eng.unified_block_sizes(16, (4096, 4096)) == (16, 16)
    with pytest.raises(UsageError, match="cannot unify"):
        eng.unified_block_sizes(16, (3 * 1024, 2 * 1024))


def test_gemma4_31b_on_vllm_pages_its_global_group_with_32_token_blocks() -> None:
    """Gemma 4 31B on one H100: 50 sliding layers of 16 KV heads x 256 (8,192 elements per token, 256 KiB per
    16-token page) and 10 global ones of 4 x 512 (4,096: 128 KiB, so 32 tokens per unified page); 6 groups of 10."""
    spec = load_model("gemma4-31b")
    r = plan_fit(spec, load_gpu("h100-sxm"), BF16, get_dtype("bf16"),
                 PlanConfig(num_gpus=1, context=8192, engine=load_engine("vllm")))
    page = 16 * 8192 * 2
    assert (r.kv_groups, r.kv_group_size, r.kv_padding_layers) == (6, 10, 0)
    assert r.kv_pool_blocks_per_gpu == r.kv_budget_bytes_per_gpu // (page * 10)
    assert r.kv_pool_tokens_per_gpu == r.kv_pool_blocks_per_gpu // 6 * 16   # the pool in the smallest block
    mnbt = r.max_num_batched_tokens
    per_request = 8192 // 32 + 5 * (-(-min(1023 + mnbt, 8192) // 16) + 1)
    assert r.max_concurrent_sequences == r.kv_pool_blocks_per_gpu // per_request
    assert r.kv_tokens_per_gpu == r.kv_pool_blocks_per_gpu * 8192 // per_request   # concurrency x max_model_len
    # weights as vLLM loads them: the checkpoint's plus a copy of each global layer's k_proj in the V slot
    checkpoint = stage_weight_bytes(spec, shard(spec, r.parallelism, vocab_rows=r.vocab_rows), BF16,
                                    range(60), first=True, last=True)
    copies = 10 * 5376 * 4 * 512 * 2
    assert r.weights_bytes_per_gpu - checkpoint - copies == r.rotary_cache_bytes + r.mla_absorbed_bytes


def test_gemma4_26b_a4b_global_kv_heads_bound_tp() -> None:
    spec = load_model("gemma4-26b-a4b")  # 8 sliding KV heads, 2 global: tp 4 keeps one global head per GPU
    r = plan_fit(spec, load_gpu("h100-sxm"), BF16, get_dtype("bf16"),
                 PlanConfig(num_gpus=4, tp=4, context=8192, engine=load_engine("vllm")))
    assert r.fits
    with pytest.raises(UsageError, match="KV heads of gemma4-26b-a4b's full-attention layers"):
        plan_fit(replace(spec, full_attention=replace(spec.full_attention, num_kv_heads=3), num_attention_heads=24),
                 load_gpu("h100-sxm"), BF16, get_dtype("bf16"), PlanConfig(num_gpus=2, tp=2, context=8192))


def test_vllm_rotary_cache_is_as_wide_as_the_dimensions_turned() -> None:
    """vLLM get_rope caches cos and sin of rotary_dim / 2 frequencies each over the positions (RotaryEmbedding
    _compute_cos_sin_cache), in the model's dtype: Qwen3.5-27B turns 64 of its 256 dimensions, so 262,144 x 64 x 2
    bytes (before, 256 wide: 4x); Llama 3.1 8B turns all 128 of 131,072 x 8 (llama3 scaling keeps the positions)."""
    cfg = PlanConfig(num_gpus=1, context=8192, engine=load_engine("vllm"))
    qwen = plan_fit(load_model("qwen3.5-27b"), load_gpu("h200"), BF16, get_dtype("bf16"), cfg)
    assert qwen.rotary_cache_bytes == 262_144 * 64 * 2
    llama = plan_fit(load_model("llama3.1-8b"), load_gpu("h100-sxm"), BF16, get_dtype("bf16"), cfg)
    assert llama.rotary_cache_bytes == 131_072 * 128 * 2


def test_vllm_029_llama31_8b_by_hand() -> None:
    """vLLM 0.29-0.31 (the V2 model runner) from its code: the profiling sampler keeps bf16 logits (2 B each, no
    fp32 copy or Triton buffer), the penalty state [max_num_seqs, vocab] int32 + its bit mask is counted since
    0.27, the CUDA-graph estimate is subtracted at 0.92."""
    e, gpu = load_engine("vllm@0.30"), load_gpu("h100-sxm")
    assert e.releases == "0.29-0.31" and not e.default
    r = plan_fit(llama31_8b(), gpu, BF16, get_dtype("bf16"), PlanConfig(num_gpus=1, context=8192, engine=e))
    assert (r.max_num_seqs, r.max_num_batched_tokens, r.memory_fraction) == (1024, 8192, 0.92)
    forward = 8192 * 2 * (2 * 4096 + 3 * 14336)
    sampler = 1024 * 128256 * 2 + 2 * 8192 * 4096 * 2
    state = 1024 * 128256 * 4 + 1024 * 4008 * 4   # output_bin_counts + prompt_bin_mask: cdiv(128,256, 32) words
    assert eng.penalty_state_bytes(1024, 128256) == state == 541_753_344
    assert r.activation_forward_bytes == forward and r.activation_sampler_bytes == sampler
    assert r.activation_state_bytes == state and r.activation_peak_bytes == max(forward, sampler) + state
    graphs = 256 * MIB + 50 * 12 * MIB
    assert r.cuda_graph_bytes == graphs and r.cuda_graphs_in_budget
    budget = (math.floor(r.capacity_bytes * 0.92) - r.weights_bytes_per_gpu - forward - state - round(0.25 * GIB)
              - graphs)
    assert r.kv_budget_bytes_per_gpu == budget
    older = plan_fit(llama31_8b(), gpu, BF16, get_dtype("bf16"),
                     PlanConfig(num_gpus=1, context=8192, engine=load_engine("vllm")))
    assert older.activation_state_bytes == 0   # V1 keeps no such state


def test_vllm_029_on_sm100_parts() -> None:
    """From 0.28 an SM100 part captures batches up to 1,024 (83 sizes at 1,024 sequences, 51 elsewhere) and a GPU of
    160 GiB or more schedules 16,384 tokens a step; a GPU file whose kernels are the B200's takes its ceiling."""
    e, old = load_engine("vllm-0.29"), load_engine("vllm-0.21")
    b200, h200 = load_gpu("b200"), load_gpu("h200")
    assert len(eng.capture_sizes("vllm", 1024, 1024)) == 83 and len(eng.capture_sizes("vllm", 1024)) == 51
    assert eng.capture_sizes("vllm", 300, 1024)[-1] == 592   # min(2 x max_num_seqs, ceiling)
    assert (eng.capture_ceiling(e, b200), eng.capture_ceiling(e, h200), eng.capture_ceiling(old, b200)) == (
        1024, 512, 512)
    assert eng.capture_ceiling(e, load_gpu("gb300")) == 1024
    assert b200.latency is not None
    twin = replace(b200, name="my-b200", latency=replace(b200.latency, kernels_as="b200"))
    assert eng.capture_ceiling(e, twin) == 1024
    assert eng.cuda_graph_bytes(e, 1024, 1, b200) == 256 * MIB + 82 * 12 * MIB
    assert eng.cuda_graph_bytes(old, 1024, 1, b200) == 256 * MIB + 50 * 12 * MIB
    assert eng.scheduler_defaults(e, b200) == (1024, 16384) and eng.scheduler_defaults(e, h200) == (1024, 8192)
    assert eng.scheduler_defaults(old, b200) == (1024, 8192)
    r = plan_fit(llama31_8b(), b200, BF16, get_dtype("bf16"), PlanConfig(num_gpus=1, context=8192, engine=e))
    assert r.max_num_batched_tokens == 16384 and r.activation_forward_bytes == 16384 * 2 * (2 * 4096 + 3 * 14336)


def test_vllm_029_keeps_two_state_blocks_per_hybrid_request() -> None:
    """Prefix caching's "align" mode (hybrid models from 0.26; MambaSpec: 2 blocks a running request): Qwen3.5-27B's
    request takes 2 blocks in each of its 3 state groups where 0.20-0.22 took 1; the serving model counts the same."""
    from tfcalc.calc.serving_inputs import kv_shape

    new, old = load_engine("vllm-0.29"), load_engine("vllm-0.21")
    groups = eng.kv_groups(new, full_layers=16, sliding_layers=0, state_layers=48)
    assert eng.blocks_per_request(new, groups, None, 32_768, 8192, 784) == 42 + 6
    assert eng.blocks_per_request(old, groups, None, 32_768, 8192, 784) == 42 + 3
    spec, gpu = load_model("qwen3.5-27b"), load_gpu("h200")
    cfg = PlanConfig(num_gpus=1, context=32_768)
    r_new = plan_fit(spec, gpu, BF16, get_dtype("bf16"), replace(cfg, engine=new))
    r_old = plan_fit(spec, gpu, BF16, get_dtype("bf16"), replace(cfg, engine=old))
    assert r_new.kv_blocks_per_request - r_old.kv_blocks_per_request == r_old.kv_groups - 1 == 3
    assert kv_shape(spec, new).state_units == 2 * kv_shape(spec, old).state_units > 0


def test_engine_yaml_checks_the_029_fields(tmp_path: Path) -> None:
    text = (Path(__file__).resolve().parent.parent.parent / "presets" / "engines" / "vllm-0.29.yaml").read_text()
    for old, new, message in (
            ("state_blocks: 2", "state_blocks: 0", "kv.state_blocks"),
            ("penalty_state: true", "penalty_state: 1", "field 'activation.penalty_state' must be true or false"),
            ("{b200: 1024,", "{b200: -4,", "cuda_graphs.max_size_by_gpu.b200"),
            ("max_size_by_gpu: {b200: 1024, b300: 1024, gb200: 1024, gb300: 1024}", "max_size_by_gpu: [1024]",
             "field 'cuda_graphs.max_size_by_gpu' must map GPU preset names to batch sizes")):
        assert old in text
        _refused(tmp_path, text.replace(old, new), message)


def test_vllm_034_sizes_the_cache_after_warm_up_by_hand() -> None:
    """vLLM 0.34's extensible KV cache (measure_kv_cache_bytes) at gpu_memory_utilization 1.0: capacity - startup -
    weights - non-torch - CUDA graphs - penalty state - max(1 GiB, 0.75 T) - T, T the transient peak (the fp32
    warm-up sampler pass, 14 B a logit); 64-token blocks. An explicit utilization u caps it at u x capacity - what
    the engine holds, startup and margin aside."""
    e, gpu = load_engine("vllm@0.34"), load_gpu("h100-sxm")
    assert (e.budget, e.memory_fraction, e.block_size) == ("measured", 1.0, 64)
    r = plan_fit(llama31_8b(), gpu, BF16, get_dtype("bf16"), PlanConfig(num_gpus=1, context=8192, engine=e))
    transient = 1024 * 128256 * 14 + 2 * 8192 * 4096 * 2          # above the forward's 8192 x 2 x 51,200 B
    state = eng.penalty_state_bytes(1024, 128256)
    assert r.activation_sampler_bytes == transient > r.activation_forward_bytes
    assert r.activation_peak_bytes == transient + state
    margin = max(GIB, int(0.75 * transient))
    assert r.sizing_margin_bytes == margin
    held = r.weights_bytes_per_gpu + round(0.25 * GIB) + (256 * MIB + 50 * 12 * MIB) + state
    budget = r.capacity_bytes - round(0.51 * GIB) - held - margin - transient
    assert r.kv_budget_bytes_per_gpu == budget
    assert r.kv_pool_blocks_per_gpu == budget // (64 * 2 * 8 * 128 * 2 * 32)   # 64-token pages of 32 layers
    assert r.kv_blocks_per_request == 8192 // 64 and r.max_concurrent_sequences == r.kv_pool_blocks_per_gpu // 128
    capped = plan_fit(llama31_8b(), gpu, BF16, get_dtype("bf16"),
                      PlanConfig(num_gpus=1, context=8192, engine=e, gpu_memory_utilization=0.9))
    assert capped.kv_budget_bytes_per_gpu == math.floor(r.capacity_bytes * 0.9) - held - transient
    # sized after capture: the graphs are held back whatever the estimate's switch says
    unswitched = plan_fit(llama31_8b(), gpu, BF16, get_dtype("bf16"),
                          PlanConfig(num_gpus=1, context=8192, engine=e, cuda_graphs_in_budget=False))
    assert unswitched.kv_budget_bytes_per_gpu == budget and unswitched.cuda_graphs_in_budget


def test_vllm_034_without_its_extensible_cache_sizes_as_033_with_64_token_blocks(tmp_path: Path) -> None:
    """Off (--no-enable-extensible-kv-cache, --kv-cache-memory-bytes, NIXL without IMEX), 0.34 runs 0.33's
    determine_available_memory at utilization 0.92: 0.33's every rule, its own 64-token blocks. The KV budget is
    0.33's to the byte; the blocks are 64 tokens each, so there are a quarter as many, to within one."""
    from dataclasses import fields

    on, v33 = load_engine("vllm@0.34"), load_engine("vllm@0.33")
    off = on.extensible_off
    assert off is not None and v33.extensible_off is None
    assert (off.budget, off.memory_fraction, off.block_size, off.label) == ("utilization", 0.92, 64, on.label)
    differ = {f.name for f in fields(off) if getattr(off, f.name) != getattr(v33, f.name)}
    assert differ == {"version", "releases", "display_name", "block_size", "sources"}
    assert "extensible_off" in off.sources and "releases" in off.sources
    gpu, spec = load_gpu("h100-sxm"), llama31_8b()

    def fit(engine, **kw):
        return plan_fit(spec, gpu, BF16, get_dtype("bf16"), PlanConfig(num_gpus=1, context=8192, engine=engine, **kw))

    mine, theirs = fit(off), fit(v33, block_size=64)
    assert mine.kv_budget_bytes_per_gpu == theirs.kv_budget_bytes_per_gpu == fit(v33).kv_budget_bytes_per_gpu
    assert mine.kv_pool_blocks_per_gpu == theirs.kv_pool_blocks_per_gpu
    assert fit(v33).kv_pool_blocks_per_gpu // 4 == mine.kv_pool_blocks_per_gpu
    assert fit(on).kv_budget_bytes_per_gpu > mine.kv_budget_bytes_per_gpu   # 1.0 after warm-up against 0.92
    # a file based on 0.34 inherits the fallback; a malformed one is refused in one line
    mine_file = tmp_path / "mine.yaml"
    mine_file.write_text("base: vllm-0.34\nname: vllm\nversion: '0.34'\nextensible_off: {block_size: 32}\n")
    assert load_engine(str(mine_file)).extensible_off.block_size == 32
    _refused(tmp_path, "base: vllm-0.34\nname: vllm\nextensible_off: {base: vllm-9}\n",
             "field 'extensible_off' must be a mapping whose 'base' names an engine preset")


def test_kv_cache_memory_bytes_sets_the_budget_and_checks_the_rest_fits() -> None:
    """vLLM 0.11+'s --kv-cache-memory-bytes is the KV budget outright (determine_available_memory returns it): the
    pool is that over the page size, whatever the utilization; the plan fails, by exactly what the engine holds
    beside it past the capacity (startup, weights, activation peak, non-torch, CUDA graphs captured after it), when
    they do not fit together. 0.34+ runs without its extensible cache then; engines without the setting refuse."""
    gpu, spec = load_gpu("h100-sxm"), llama31_8b()

    def fit(engine, size, **kw):
        return plan_fit(spec, gpu, BF16, get_dtype("bf16"), PlanConfig(
            num_gpus=1, context=8192, engine=engine, kv_cache_memory_bytes=size, **kw))

    v21 = load_engine("vllm")
    r = fit(v21, 40 * GIB, gpu_memory_utilization=0.5)
    assert r.kv_budget_set and r.kv_budget_bytes_per_gpu == 40 * GIB and r.fits and r.overcommit_bytes_per_gpu == 0
    assert r.kv_pool_blocks_per_gpu == 40 * GIB // (16 * 2 * 8 * 128 * 2 * 32)   # 16-token pages of 32 layers
    held = (r.startup_bytes + r.weights_bytes_per_gpu + r.activation_peak_bytes + r.non_torch_bytes
            + r.cuda_graph_bytes)
    room = r.capacity_bytes - held            # the largest KV cache that fits beside the rest
    assert fit(v21, room).fits and fit(v21, room).overcommit_bytes_per_gpu == 0
    over = fit(v21, room + GIB)
    assert not over.fits and over.overcommit_bytes_per_gpu == GIB == over.shortfall_bytes_per_gpu
    assert over.max_concurrent_sequences > 0 and over.capture_headroom_bytes is None
    # the V2 runner of 0.25 holds its uncounted penalty state besides
    v25 = fit(load_engine("vllm@0.25"), GIB)
    counted = (v25.startup_bytes + v25.weights_bytes_per_gpu + v25.activation_peak_bytes + v25.non_torch_bytes
               + v25.cuda_graph_bytes)
    v25 = fit(load_engine("vllm@0.25"), v25.capacity_bytes - counted)
    assert v25.uncounted_state_bytes > 0 and v25.overcommit_bytes_per_gpu == v25.uncounted_state_bytes
    on = load_engine("vllm@0.34")
    assert fit(on, 40 * GIB).engine == on.extensible_off and fit(on, 40 * GIB).block_size == 64
    for engine in (load_engine("sglang"), load_engine("vllm@0.9"), None):
        with pytest.raises(UsageError, match="--kv-cache-memory-bytes sets vLLM's KV cache"):
            fit(engine, 40 * GIB)
    with pytest.raises(UsageError, match="must be positive"):
        fit(v21, 0)


def test_the_extensible_cache_switch_applies_where_an_engine_has_one() -> None:
    """--no-enable-extensible-kv-cache swaps in the fallback accounting of the engines that have one and marks it
    (the launch line says so); --enable-... keeps the default; either is an error where no engine asked has one."""
    on, v21 = load_engine("vllm@0.34"), load_engine("vllm")
    assert eng_spec.with_extensible_kv_cache([on, v21, None], None) == [on, v21, None]
    assert eng_spec.with_extensible_kv_cache([on, v21], True) == [on, v21]
    off, same = eng_spec.with_extensible_kv_cache([on, v21], False)
    assert off == replace(on.extensible_off, extensible_forced_off=True) and same is v21
    for flag in (True, False):
        with pytest.raises(UsageError, match="no engine asked has an extensible KV cache"):
            eng_spec.with_extensible_kv_cache([v21, None], flag)


@settings(max_examples=30, deadline=None)
@given(low=st.floats(0.5, 1.0), high=st.floats(0.5, 1.0))
def test_vllm_034_budget_never_falls_with_utilization(low: float, high: float) -> None:
    """The explicit utilization only caps the measured budget: a higher one never gives less, and at 1.0 the device
    binds (capacity - startup - margin), not the request."""
    e, gpu = load_engine("vllm-0.34"), load_gpu("h100-sxm")
    low, high = sorted((low, high))
    def budget(u: float) -> int:
        cfg = PlanConfig(num_gpus=1, context=8192, engine=e, gpu_memory_utilization=u)
        return plan_fit(llama31_8b(), gpu, BF16, get_dtype("bf16"), cfg).kv_budget_bytes_per_gpu
    assert budget(low) <= budget(high) <= budget(1.0)


def _refused(tmp_path: Path, text: str, message: str) -> None:
    """An engine file of ``text`` is refused with ``message``."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    with pytest.raises(SpecError, match=message):
        load_engine(str(bad))


def test_vllm_034_hybrid_state_blocks_and_margin_rules(tmp_path: Path) -> None:
    """A Mamba2 / FlashInfer Gated DeltaNet request keeps 3 state blocks (2 + a prefill checkpoint); the sizing
    margin belongs to budget: measured alone."""
    new = load_engine("vllm-0.34")
    groups = eng.kv_groups(new, full_layers=16, sliding_layers=0, state_layers=48)
    assert eng.blocks_per_request(new, groups, None, 32_768, 8192, 832) == 40 + 9
    text = (Path(__file__).resolve().parent.parent.parent / "presets" / "engines" / "vllm-0.34.yaml").read_text()
    kept = [line for line in text.splitlines()
            if not line.startswith(("sizing_margin:", "  floor_gib:", "  fraction: 0.75"))]
    assert len(kept) == len(text.splitlines()) - 3
    _refused(tmp_path, "\n".join(kept), "field 'sizing_margin' goes with budget: measured, and only with it")
    _refused(tmp_path, text.replace("budget: measured", "budget: utilization"),
             "field 'sizing_margin' goes with budget: measured")
    _refused(tmp_path, text.replace("fraction: 0.75", "fraction: -1"), "sizing_margin.fraction")


def test_prefix_caching_off_keeps_one_state_block() -> None:
    """--no-enable-prefix-caching (what `capacity` launches when no prompt is reused) leaves vLLM's "none" mode: one
    state block a hybrid request, so more Qwen3.5-27B sequences fit than with prefix caching's checkpoints; an
    engine without extra state blocks is returned as it is."""
    from tfcalc.calc.serving_inputs import replica_memory
    from tfcalc.spec.engine import with_prefix_caching

    on = load_engine("vllm-0.34")
    off = with_prefix_caching(on, False)
    assert off is not None and off.kv is not None and on.kv is not None
    assert (on.kv.state_blocks, off.kv.state_blocks) == (3, 1) and with_prefix_caching(on, True) is on
    assert with_prefix_caching(load_engine("vllm-0.21"), False) == load_engine("vllm-0.21")
    assert with_prefix_caching(None, False) is None
    spec, gpu = load_model("qwen3.5-27b"), load_gpu("h200")
    memory = {name: replica_memory(spec, gpu, BF16, get_dtype("bf16"), tp=1, pp=1, ep=1, engine=e,
                                   max_model_len=32_768, max_num_seqs=256, max_num_batched_tokens=8192)
              for name, e in (("on", on), ("off", off))}
    assert memory["off"].max_sequences_at_max_len > memory["on"].max_sequences_at_max_len



def test_an_engine_file_lays_its_changes_over_a_base(tmp_path: Path) -> None:
    """vllm-0.32 and vllm-0.33 hold only what changed from vllm-0.29 (``base:``): every other rule and source is the
    base's, ``default`` is never inherited; a base must be an engine preset of the same engine."""
    from tfcalc.spec.presets import load_preset_document

    base, v32, v33 = load_engine("vllm-0.29"), load_engine("vllm-0.32"), load_engine("vllm-0.33")
    assert base.kv is not None and v32.kv is not None and v33.kv is not None
    assert v32.kv.state_blocks_by_kind == (("gated_deltanet", 2), ("mamba2", 3))
    assert replace(v32.kv, state_blocks_by_kind=(), state_blocks=2) == base.kv
    assert (v32.activation, v32.cuda_graphs, v32.overheads, v32.weights) == (
        base.activation, base.cuda_graphs, base.overheads, base.weights)
    assert v33.activation is not None and v33.activation.sampler_bytes_per_logit == 14
    assert v33.kv.checkpoint_align_for("gated_deltanet") == 64 and v33.kv.checkpoint_align_for("mamba2") == 1
    assert not v32.default and v32.releases == "0.32" and v32.kernels == load_engine("vllm").kernels
    document = load_preset_document("engine", "vllm-0.32")
    assert "base" not in document and "kv.state_blocks" in document["sources"]
    assert document["sources"]["kv.v4_groups, kv.v4_concurrency"] == base.sources["kv.v4_groups, kv.v4_concurrency"]
    mine = tmp_path / "mine.yaml"
    mine.write_text("base: vllm-0.34\nname: vllm\nversion: '0.34'\nmemory_fraction: 0.95\n")
    assert load_engine(str(mine)).memory_fraction == 0.95 and load_engine(str(mine)).budget == "measured"
    _refused(tmp_path, "base: vllm-9\n", "field 'base' must name an engine preset")
    _refused(tmp_path, "base: sglang-0.5\nname: vllm\n", "must name a preset of the same engine")


def test_hybrid_blocks_by_linear_kind_and_checkpoint_grid() -> None:
    """vLLM's hybrid attention block is a x cdiv(state, a x page), a = lcm(max(16, block), the checkpoint grid):
    a user's 32-token block gives 800 where 16 gives 784, FlashInfer GDN's 64-token grid (0.33+) 832; 0.32 keeps 3
    state blocks for a Mamba2 request and 2 for a Gated DeltaNet one."""
    page, state = 4096, 3_207_168
    assert eng.hybrid_block_size(16, page, state) == 784
    assert eng.hybrid_block_size(32, page, state) == 32 * -(-state // (32 * page)) == 800
    assert eng.hybrid_block_size(16, page, state, 64) == eng.hybrid_block_size(64, page, state) == 832
    assert eng.hybrid_block_size(1024, page, state, 64) == 1024
    v32 = load_engine("vllm@0.32")
    groups = eng.kv_groups(v32, full_layers=16, sliding_layers=0, state_layers=48)
    assert eng.blocks_per_request(v32, groups, None, 32_768, 8192, 784, linear_kind="gated_deltanet") == 42 + 6
    assert eng.blocks_per_request(v32, groups, None, 32_768, 8192, 784, linear_kind="mamba2") == 42 + 9
    nano, gpu = load_model("nemotron-3-nano-30b-a3b"), load_gpu("h200")
    assert nano.linear_attention is not None and nano.linear_attention.kind == "mamba2"
    cfg = PlanConfig(num_gpus=1, context=32_768)
    r31, r32 = (plan_fit(nano, gpu, BF16, get_dtype("bf16"), replace(cfg, engine=load_engine(v)))
                for v in ("vllm@0.31", "vllm@0.32"))
    assert r31.kv_budget_bytes_per_gpu == r32.kv_budget_bytes_per_gpu
    assert r32.kv_blocks_per_request - r31.kv_blocks_per_request == r31.kv_groups - 1   # one more per state group
    qwen = load_model("qwen3.5-27b")
    r33 = plan_fit(qwen, gpu, BF16, get_dtype("bf16"), replace(cfg, engine=load_engine("vllm@0.33")))
    assert r33.block_size % 64 == 0 and r33.block_size_asked == 16


def test_pcie_gpus_hold_less_for_tensor_parallelism(tmp_path: Path) -> None:
    """PCIe-only GPUs at tp > 1 (no custom all-reduce, few NCCL channels): the CUDA context at start-up and 0.25 +
    0.28 GiB of non-torch memory, against 1.51 / 2.1 GiB over NVLink (SGLang, profiling nothing after start: the
    context + 0.28 at start); tp 1 and NVLink GPUs as before. Against the
    published figure of vLLM 0.28.0 on 2 x RTX 4090 (PR #54479: Qwen3-32B-AWQ, tp 2, utilization 0.85,
    max_model_len 8,192, 5,120 batched tokens, 72 sequences: 10.37-10.38 GiB, 5,311-5,315 blocks per GPU), replayed
    with that release's preset: a dense model on its V2 runner, which estimated no CUDA graphs."""
    e = load_engine("vllm@0.28")
    pcie, nvlink = load_gpu("rtx4090"), load_gpu("h100-sxm")
    assert (eng.startup_bytes(e, 2, pcie), eng.non_torch_bytes(e, 2, 1, pcie)) == (round(0.51 * GIB), round(0.53 * GIB))
    assert (eng.startup_bytes(e, 2, nvlink), eng.non_torch_bytes(e, 2, 1, nvlink)) == (round(1.51 * GIB),
                                                                                         round(2.1 * GIB))
    assert eng.non_torch_bytes(e, 1, 1, pcie) == eng.non_torch_bytes(e, 1, 1, nvlink) == round(0.25 * GIB)
    assert eng.non_torch_bytes(e, 2, 1, load_gpu("l40s")) == round(0.53 * GIB)
    assert eng.non_torch_bytes(e, 2, 1, load_gpu("h100-pcie")) == round(0.53 * GIB)
    sglang, trtllm, l40s = load_engine("sglang"), load_engine("trtllm"), load_gpu("l40s")
    assert (eng.startup_bytes(sglang, 2, l40s), eng.non_torch_bytes(sglang, 2, 1, l40s)) == (round(0.79 * GIB), 0)
    assert eng.startup_bytes(sglang, 2, nvlink) == round(1.51 * GIB)
    assert (eng.startup_bytes(trtllm, 2, l40s), eng.non_torch_bytes(trtllm, 2, 1, l40s)) == (round(0.51 * GIB),
                                                                                             round(0.53 * GIB))
    spec = load_model(str(Path(__file__).resolve().parent.parent.parent / "benchmarks" / "validation" / "models"
                          / "qwen3-32b.yaml"))
    r = plan_fit(spec, pcie, parse_weight_precision("int4-g128"), get_dtype("bf16"),
                 PlanConfig(num_gpus=2, tp=2, context=8192, engine=e, gpu_memory_utilization=0.85,
                            max_num_seqs=72, max_num_batched_tokens=5120))
    assert r.engine is not None and r.engine.runner == "V2" and not r.cuda_graphs_in_budget
    assert abs(r.kv_budget_bytes_per_gpu / GIB - 10.375) / 10.375 < 0.01
    assert abs(r.kv_pool_blocks_per_gpu - 5313) / 5313 < 0.01
    text = (Path(__file__).resolve().parent.parent.parent / "presets" / "engines" / "vllm-0.21.yaml").read_text()
    _refused(tmp_path, text.replace("pcie5: {startup_gib_tp: 0.51, non_torch_gib_tp: 0.53}", "pcie5: 0.5"),
             "field 'overheads.by_fabric' must map interconnect presets")


def test_sglang_keeps_dsa_fp8_raw_on_sm100() -> None:
    """SGLang on compute capability 10+ serves a DSA model's auto cache in fp8 (bf16 on Hopper), and from 0.5.10
    through its TensorRT-LLM kernels as the raw 576-byte latent (calculate_mla_kv_cache_dim), not FlashMLA's
    656-byte record, + 132 B of indexer keys a layer; vLLM keeps auto in bf16 everywhere."""
    from tfcalc.calc.kv_cache import default_kv_dtype

    spec = load_model("deepseek-v3.2")
    new, old, vllm = load_engine("sglang@0.5.12"), load_engine("sglang@0.5.8"), load_engine("vllm")
    b200, h200 = load_gpu("b200"), load_gpu("h200")
    assert b200.latency is not None
    twin = replace(b200, name="my-b200", latency=replace(b200.latency, kernels_as="b200"))
    for gpu, expected in ((b200, "fp8_e4m3"), (load_gpu("gb300"), "fp8_e4m3"), (twin, "fp8_e4m3"), (h200, "bf16")):
        assert default_kv_dtype(spec, new, gpu).name == default_kv_dtype(spec, old, gpu).name == expected, gpu.name
    assert default_kv_dtype(spec, new).name == default_kv_dtype(spec, vllm, b200).name == "bf16"
    assert (eng.sparse_mla_raw(new, b200), eng.sparse_mla_raw(new, h200), eng.sparse_mla_raw(old, b200)) == (
        True, False, False)
    fp8 = get_dtype("fp8")
    cfg = PlanConfig(num_gpus=8, tp=8, context=131_072)
    layers = spec.num_layers
    raw = plan_fit(spec, b200, parse_weight_precision("fp8_block"), fp8, replace(cfg, engine=new))
    record = plan_fit(spec, b200, parse_weight_precision("fp8_block"), fp8, replace(cfg, engine=old))
    hopper = plan_fit(spec, h200, parse_weight_precision("fp8_block"), fp8, replace(cfg, engine=new))
    assert raw.kv_bytes_per_token_per_gpu == layers * (576 + 132)
    assert record.kv_bytes_per_token_per_gpu == hopper.kv_bytes_per_token_per_gpu == layers * (656 + 132)


def test_vllm_034_keeps_the_moe_workspace_out_of_the_transient_peak() -> None:
    """vLLM's workspace manager keeps the fused-MoE workspace once made, so 0.34's sizing finds it held, not in the
    allocated peak - current it keeps free with its margin: Qwen3-30B-A3B on an H100, workspace [8192 tokens, top_k
    8, max(2 x 768, 2048) + 768] bf16 = 0.34 GiB."""
    e, gpu, spec = load_engine("vllm@0.34"), load_gpu("h100-sxm"), load_model("qwen3-30b-a3b")
    r = plan_fit(spec, gpu, BF16, get_dtype("bf16"), PlanConfig(num_gpus=1, context=32_768, engine=e))
    workspace = 8192 * 8 * (2048 + 768) * 2
    assert r.activation_workspace_bytes == workspace
    transient = r.activation_peak_bytes - r.activation_state_bytes - workspace
    assert r.activation_sampler_bytes > r.activation_forward_bytes and r.sizing_margin_bytes == int(0.75 * transient)
    held = (r.weights_bytes_per_gpu + round(0.25 * GIB) + r.cuda_graph_bytes + r.activation_state_bytes + workspace)
    assert r.kv_budget_bytes_per_gpu == (r.capacity_bytes - round(0.51 * GIB) - held - r.sizing_margin_bytes
                                         - transient)
    dense = plan_fit(llama31_8b(), gpu, BF16, get_dtype("bf16"), PlanConfig(num_gpus=1, context=8192, engine=e))
    assert dense.activation_workspace_bytes == 0


# Which runner vLLM 0.22-0.28 picks, read from each wheel's vllm/config/vllm.py (DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES
# and _is_default_v2_model_runner_model): (release, architecture, moe, quantized, hybrid) -> the V2 runner or not.
# Two rows are also logged: vllm issue #49224 (0.25.1 runs Llama-3.1-70B FP8 on "Model Runner V2 (now default for
# dense models)") and #50159 (0.26.0 auto-selects V2 for Gemma-4-31B AWQ, "MRv2 (auto-selected)").
_V2_DEFAULTS = [
    ("0.22", "Qwen3ForCausalLM", False, False, False, True),
    ("0.22", "Qwen3ForCausalLM", False, True, False, False),       # "not is_quantized"
    ("0.22", "LlamaForCausalLM", False, False, False, False),      # not listed until 0.23
    ("0.23", "LlamaForCausalLM", False, False, False, True),
    ("0.23", "MistralForCausalLM", False, True, False, False),
    ("0.23", "Gemma3ForConditionalGeneration", False, False, False, False),
    ("0.24", "LlamaForCausalLM", False, True, False, True),        # no quantization test from 0.24
    ("0.24", "Qwen2MoeForCausalLM", True, False, False, True),     # nor an MoE one
    ("0.24", "Qwen3MoeForCausalLM", True, False, False, False),
    ("0.24", "Gemma3ForConditionalGeneration", False, False, False, False),
    ("0.25", "Gemma3ForConditionalGeneration", False, False, False, True),   # every non-MoE model
    ("0.25", "LlamaForCausalLM", False, True, False, True),        # #49224
    ("0.26", "Gemma4ForConditionalGeneration", False, True, False, True),    # #50159
    ("0.25", "Qwen3MoeForCausalLM", True, False, False, False),
    ("0.25", "DeepseekV2ForCausalLM", True, True, False, True),
    ("0.25", "Qwen3_5ForConditionalGeneration", False, False, True, False),  # not is_hybrid
    ("0.26", "GptOssForCausalLM", True, True, False, False),
    ("0.27", "Qwen3NextForCausalLM", True, False, True, False),
    ("0.27", "NemotronHForCausalLM", False, False, True, False),   # hybrid: listed ones only
    ("0.28", "DeepseekV4ForCausalLM", True, True, False, True),
    ("0.28", "DeepseekV3ForCausalLM", True, True, False, False),
    ("0.28", "MixtralForCausalLM", True, False, False, False),
    ("0.28", None, False, False, False, True),                     # a user's dense model without an architecture
    ("0.28", None, True, False, False, False),
]


@pytest.mark.parametrize(("release", "architecture", "moe", "quantized", "hybrid", "v2"), _V2_DEFAULTS)
def test_vllm_022_028_pick_the_model_runner_as_their_wheels_do(release: str, architecture: str | None, moe: bool,
                                                               quantized: bool, hybrid: bool, v2: bool) -> None:
    rule = load_engine(f"vllm@{release}").model_runner
    assert rule is not None
    assert rule.picks(architecture, moe=moe, quantized=quantized, hybrid=hybrid, attention_free=False) is v2
    assert not rule.picks(architecture, moe=moe, quantized=quantized, hybrid=True, attention_free=True)


def test_runner_for_reads_the_models_traits() -> None:
    """Architecture, experts, weight format and linear-attention layers, from the model presets."""
    e23, e25 = load_engine("vllm@0.23"), load_engine("vllm@0.25")
    llama, qwen_moe, hybrid = llama31_8b(), load_model("qwen3-30b-a3b"), load_model("qwen3.5-27b")
    assert eng.runner_for(e23, llama, BF16) is e23.second_runner
    assert eng.runner_for(e23, llama, parse_weight_precision("fp8")) is e23
    assert eng.runner_for(e25, llama, parse_weight_precision("int4-g128")) is e25.second_runner
    assert eng.runner_for(e25, qwen_moe, BF16) is e25 and eng.runner_for(e25, hybrid, BF16) is e25
    assert eng.runner_for(load_engine("vllm@0.29"), qwen_moe, BF16).runner == "V2"  # on NVIDIA GPUs
    assert eng.runner_for(load_engine("vllm@0.34"), qwen_moe, BF16).runner == ""   # one runner, unnamed
    assert eng.runner_for(None, llama, BF16) is None


def test_vllm_v2_runner_of_022_027_subtracts_no_graphs_and_keeps_a_6_byte_sampler() -> None:
    """Llama 3.1 8B on one H100 under vLLM 0.23, V1 (an fp8 checkpoint) against V2 (bf16): the V2 runner's profiling
    sampler holds bf16 logits and their fp32 copy (6 B, against V1's 14 B and a Triton scratch row per SM) and its
    profile_cudagraph_memory returns 0, so the budget keeps the graphs' memory."""
    e, gpu = load_engine("vllm@0.23"), load_gpu("h100-sxm")
    cfg = PlanConfig(num_gpus=1, context=8192, engine=e)
    v2 = plan_fit(llama31_8b(), gpu, BF16, get_dtype("bf16"), cfg)
    v1 = plan_fit(llama31_8b(), gpu, BF16, get_dtype("bf16"), replace(cfg, engine=replace(e, model_runner=None)))
    assert v2.engine is e.second_runner and v1.engine.runner == "V1"
    assert v1.cuda_graphs_in_budget and not v2.cuda_graphs_in_budget and v2.cuda_graph_bytes == v1.cuda_graph_bytes
    rows, vocab = 1024, 128_256
    assert v2.activation_sampler_bytes - v1.activation_sampler_bytes == rows * vocab * (6 - 14) - 132 * vocab * 4
    assert v2.kv_budget_bytes_per_gpu - v1.kv_budget_bytes_per_gpu == (
        v1.cuda_graph_bytes + v1.activation_peak_bytes - v2.activation_peak_bytes)
    assert v2.max_concurrent_sequences > v1.max_concurrent_sequences
    forced = plan_fit(llama31_8b(), gpu, BF16, get_dtype("bf16"), replace(cfg, cuda_graphs_in_budget=True))
    assert not forced.cuda_graphs_in_budget and forced.kv_budget_bytes_per_gpu == v2.kv_budget_bytes_per_gpu


def test_vllm_027_counts_the_v2_penalty_state_and_028_drops_the_fp32_copy() -> None:
    spec, gpu = llama31_8b(), load_gpu("h100-sxm")
    cfg = PlanConfig(num_gpus=1, context=8192)
    r = {v: plan_fit(spec, gpu, BF16, get_dtype("bf16"), replace(cfg, engine=load_engine(f"vllm@{v}")))
         for v in ("0.26", "0.27", "0.28")}
    assert all(x.engine.runner == "V2" for x in r.values())
    penalty = eng.penalty_state_bytes(1024, 128_256)
    assert r["0.26"].kv_budget_bytes_per_gpu - r["0.27"].kv_budget_bytes_per_gpu == penalty == 541_753_344
    assert r["0.28"].activation_sampler_bytes < r["0.27"].activation_sampler_bytes


def test_vllm_026_027_keep_hybrid_prefix_caching_opt_in() -> None:
    """Hybrid models may turn prefix caching on from 0.26 (2 "align" state blocks a request) but keep it off by
    default until 0.28; off, one block. ``with_prefix_caching`` reaches the second runner's accounting too."""
    from tfcalc.spec.engine import with_prefix_caching

    spec, gpu = load_model("qwen3.5-27b"), load_gpu("h200")
    cfg = PlanConfig(num_gpus=1, context=32_768)

    def blocks(version: str, enabled: bool | None) -> int:
        e = with_prefix_caching(load_engine(f"vllm@{version}"), enabled)
        return plan_fit(spec, gpu, BF16, get_dtype("bf16"), replace(cfg, engine=e)).kv_blocks_per_request

    assert blocks("0.26", None) == blocks("0.26", False) == blocks("0.28", False) == blocks("0.25", True)
    assert blocks("0.26", True) == blocks("0.27", True) == blocks("0.28", None) == blocks("0.26", None) + 3
    e = with_prefix_caching(load_engine("vllm@0.28"), False)
    assert e.second_runner is not None and e.second_runner.kv.state_blocks == e.kv.state_blocks == 1


def test_engine_yaml_checks_the_model_runner(tmp_path: Path) -> None:
    text = (Path(__file__).resolve().parent.parent.parent / "presets" / "engines" / "vllm-0.22.yaml").read_text()
    for old, new, message in (
            ("runners: [V1, V2]", "runners: [V1]", "model_runner.runners"),
            ("listed_requires: [dense, unquantized]", "listed_requires: [small]", "model_runner.listed_requires"),
            ("architectures: [Qwen3ForCausalLM]", "architectures: Qwen3ForCausalLM", "model_runner.architectures"),
            ("    cuda_graphs:\n      in_budget: false", "    weights:\n      vocab_padding: 1",
             "unknown field 'model_runner.changes.weights'"),
            ("  listed_requires: [dense, unquantized]", "  listed_requires: [dense, unquantized]\n  dense: 1",
             "model_runner.dense")):
        assert old in text
        bad = tmp_path / "bad.yaml"
        bad.write_text(text.replace(old, new))
        with pytest.raises(SpecError, match=message):
            load_engine(str(bad))


def test_graphs_captured_after_the_kv_cache_must_fit_what_is_left() -> None:
    """Where the budget keeps no CUDA-graph memory (vLLM 0.17-0.19, the V2 runner of 0.22-0.28), capture runs after
    the KV cache is allocated, in capacity x (1 - utilization) - startup + the transient peak given back - the V2
    runner's penalty state, which 0.22-0.26 count nowhere: vllm issue #49224 (0.25.1, Llama-3.1-70B FP8 at tp 8 on
    L40S: "causing OOM during capture_model()")."""
    from tfcalc.report.plan import plan_note

    spec, gpu, fp8 = load_model("llama3-70b"), load_gpu("l40s"), parse_weight_precision("fp8")
    cfg = PlanConfig(num_gpus=8, tp=8, context=8192, gpu_memory_utilization=0.97)
    r = plan_fit(spec, gpu, fp8, get_dtype("bf16"), replace(cfg, engine=load_engine("vllm@0.25")))
    assert r.engine.runner == "V2" and not r.cuda_graphs_in_budget
    penalty = eng.penalty_state_bytes(256, 128_256)  # 256 sequences below 70 GiB; counted nowhere until 0.27
    assert r.max_num_seqs == 256 and r.uncounted_state_bytes == penalty == 135_438_336
    assert r.capture_headroom_bytes == (r.capacity_bytes - round(0.97 * r.capacity_bytes) - r.startup_bytes
                                        + r.activation_transient_bytes - penalty)
    assert 0 < r.capture_headroom_bytes < r.cuda_graph_bytes
    assert "capture may run out of memory" in plan_note(spec, gpu, fp8, get_dtype("bf16"), r)
    roomy = plan_fit(spec, gpu, fp8, get_dtype("bf16"),
                     replace(cfg, engine=load_engine("vllm@0.25"), gpu_memory_utilization=0.9))
    assert roomy.capture_headroom_bytes > roomy.cuda_graph_bytes
    assert "capture" not in plan_note(spec, gpu, fp8, get_dtype("bf16"), roomy)
    v1 = plan_fit(spec, gpu, fp8, get_dtype("bf16"), replace(cfg, engine=load_engine("vllm@0.21")))
    assert v1.capture_headroom_bytes is None


def test_trtllm_allocates_recurrent_states_for_max_num_seqs_before_sizing_the_kv_cache() -> None:
    """TensorRT-LLM 1.0-1.2's MambaHybridCacheManager: conv [layers, max_batch_size, conv_dim / tp, d_conv - 1] and
    SSM [layers, max_batch_size, heads / tp, head_dim, d_state] states, both in the model dtype (mamba_ssm_cache_dtype
    auto), allocated before the dry run: inside the peak the KV budget leaves out. Counted by hand from Nemotron 3
    Nano's config.json (tests/fixtures/hf_configs): 23 Mamba layers, 64 heads of 64, d_state 128, 8 groups, d_conv 4;
    at the default max_batch_size of 2,048 they outgrow an H100."""
    config = json.loads((FIXTURES.parent / "hf_configs" / "nemotron-3-nano-30b-a3b.json").read_text())
    layers = config["hybrid_override_pattern"].count("M")
    heads, head_dim, d_state, groups = (config[k] for k in ("mamba_num_heads", "mamba_head_dim", "ssm_state_size",
                                                            "n_groups"))
    spec, gpu, e = load_model("nemotron-3-nano-30b-a3b"), load_gpu("h100-sxm"), load_engine("trtllm")
    for tp, seqs in ((1, 64), (2, 256)):
        conv = (heads * head_dim + 2 * groups * d_state) // tp * (config["conv_kernel"] - 1) * 2
        ssm = heads // tp * head_dim * d_state * 2
        cfg = PlanConfig(num_gpus=tp, tp=tp, context=32_768, engine=e, max_num_seqs=seqs)
        r = plan_fit(spec, gpu, BF16, get_dtype("bf16"), cfg)
        assert r.state_slot_bytes_per_gpu == layers * seqs * (conv + ssm)
        assert r.fits and r.max_concurrent_sequences <= seqs == r.max_running_requests
        more = plan_fit(spec, gpu, BF16, get_dtype("bf16"), replace(cfg, max_num_seqs=2 * seqs))
        assert r.kv_budget_bytes_per_gpu - more.kv_budget_bytes_per_gpu == pytest.approx(
            0.9 * r.state_slot_bytes_per_gpu, abs=2)
    default = plan_fit(spec, gpu, BF16, get_dtype("bf16"), PlanConfig(num_gpus=1, context=32_768, engine=e))
    assert default.max_num_seqs == 2048 and not default.fits and default.kv_budget_bytes_per_gpu < 0
    vllm = plan_fit(spec, gpu, BF16, get_dtype("bf16"), PlanConfig(num_gpus=1, context=32_768,
                                                                   engine=load_engine("vllm")))
    assert vllm.state_slot_bytes_per_gpu == 0 and vllm.fits


def test_each_engine_keeps_the_recurrent_state_in_its_own_format() -> None:
    """Qwen3-Next's checkpoint declares no SSM dtype: vLLM keeps its Gated DeltaNet state in the model's bf16,
    SGLang in float32 (--mamba-ssm-dtype float32, 0.5.3+), TensorRT-LLM 1.0-1.2 in the model's dtype. At tp 2 a
    layer holds 16 value heads x 128 x 128 state values and (2 x 16 x 128 + 32 x 128) / 2 x 3 bf16 conv values.
    Qwen3.5, which declares float32, keeps it so in vLLM and SGLang; TensorRT-LLM still takes bf16."""
    conv, values = 4096 * 3 * 2, 16 * 128 * 128
    gpu = load_gpu("h200")
    for model, declared in (("qwen3-next-80b-a3b", None), ("qwen3.5-27b", "fp32")):
        spec = load_model(model)
        for engine, recurrent in (("vllm", declared or "bf16"), ("sglang", "fp32"), ("trtllm", "bf16")):
            r = plan_fit(spec, gpu, BF16, get_dtype("bf16"),
                         PlanConfig(num_gpus=2, tp=2, context=8192, engine=load_engine(engine), max_num_seqs=64))
            la = spec.linear_attention
            assert la is not None
            per_gpu = la.num_value_heads // 2 * la.value_head_dim * la.key_head_dim
            conv_values = (2 * la.num_key_heads * la.key_head_dim + la.num_value_heads * la.value_head_dim) // 2 * 3
            assert r.state_bytes_per_layer == conv_values * 2 + per_gpu * get_dtype(recurrent).bytes_for(1), engine
            if model == "qwen3-next-80b-a3b":
                assert (conv_values, per_gpu) == (conv // 2, values)


def test_the_state_slot_hint_is_the_largest_max_num_seqs_that_fits() -> None:
    """Where TensorRT-LLM's default 2,048 state slots leave no room, the note names the largest --max-num-seqs that
    leaves one request's KV: that plan fits, one more slot does not (brute force over the neighbours)."""
    from tfcalc.report.plan import plan_note

    spec, gpu, e = load_model("nemotron-3-nano-30b-a3b"), load_gpu("h100-sxm"), load_engine("trtllm")
    cfg = PlanConfig(num_gpus=1, context=32_768, engine=e)
    r = plan_fit(spec, gpu, BF16, get_dtype("bf16"), cfg)
    most = r.state_slots_that_fit(1)
    assert most is not None and 0 < most < 2048 and f"--max-num-seqs {most:,} or fewer" in plan_note(
        spec, gpu, BF16, get_dtype("bf16"), r)
    at = {n: plan_fit(spec, gpu, BF16, get_dtype("bf16"), replace(cfg, max_num_seqs=n)).fits
          for n in (most - 1, most, most + 1)}
    assert at == {most - 1: True, most: True, most + 1: False}
    assert plan_fit(spec, gpu, BF16, get_dtype("bf16"), PlanConfig(
        num_gpus=1, context=32_768, engine=load_engine("vllm"))).state_slots_that_fit(1) is None


def test_amd_gpus_keep_some_architectures_on_v1() -> None:
    """ROCm: vLLM 0.27 leaves Kimi K3 and 0.28 DeepSeek-V4 out of the V2 list (both MoE, so V1), and 0.29-0.31 run
    DeepSeek-V3.2, DeepSeek-V4 and GLM-5 on V1 (ROCM_DEFAULT_MRV1_ARCHITECTURES); 0.32 runs everything on V2."""
    kimi = "KimiK3ForConditionalGeneration"
    traits = dict(moe=True, quantized=False, hybrid=False, attention_free=False)
    rule27 = load_engine("vllm@0.27").model_runner
    assert rule27 is not None and rule27.picks(kimi, **traits) and not rule27.picks(kimi, **traits, amd=True)
    spec, h200, mi300x = load_model("deepseek-v3.2"), load_gpu("h200"), load_gpu("mi300x")
    fp8 = parse_weight_precision("fp8_block")
    for version, nvidia, amd in (("0.29", "V2", "V1"), ("0.31", "V2", "V1"), ("0.32", "", ""), ("0.25", "V1", "V1")):
        e = load_engine(f"vllm@{version}")
        assert (eng.runner_for(e, spec, fp8, h200).runner, eng.runner_for(e, spec, fp8, mi300x).runner) == (
            nvidia, amd), version
    v4, e28 = load_model("deepseek-v4-flash"), load_engine("vllm@0.28")
    native = eng.served_precision(v4, e28)
    assert (eng.runner_for(e28, v4, native, h200).runner, eng.runner_for(e28, v4, native, mi300x).runner) == (
        "V2", "V1")
    v1 = plan_fit(spec, mi300x, fp8, get_dtype("bf16"), PlanConfig(num_gpus=8, tp=8, context=32_768,
                                                                   engine=load_engine("vllm@0.30")))
    v2 = plan_fit(spec, h200, fp8, get_dtype("bf16"), PlanConfig(num_gpus=8, tp=8, context=32_768,
                                                                 engine=load_engine("vllm@0.30")))
    assert v1.activation_state_bytes == 0 < v2.activation_state_bytes  # V1 keeps no penalty state
