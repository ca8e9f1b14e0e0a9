"""DeepSeek-V4's compressed attention (CSA / HCA) through the step model, the plan and the serving pool: hand counts,
a brute-force count of the entries each query attends, and invariants."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from tfcalc.calc.kv_cache import (
    compressed_entry_bytes,
    compressed_held_bytes,
    compressed_indexer_bytes,
    compressor_state_bytes,
)
from tfcalc.calc.latency import StepShape, _compressed_keys, deployment, step_time
from tfcalc.calc.plan import PlanConfig, plan_fit
from tfcalc.calc.serving_inputs import kv_shape
from tfcalc.dtypes import get_dtype, parse_weight_precision
from tfcalc.spec.presets import load_engine, load_gpu, load_model

FP8 = get_dtype("fp8")
FLASH = load_model("deepseek-v4-flash")


def _d(tp: int = 8, engine: str | None = "vllm-0.21", gpu: str = "h200"):  # noqa: ANN202 - a Deployment
    kernels = load_engine(engine).kernels if engine else None
    return deployment(FLASH, load_gpu(gpu), parse_weight_precision("fp8_block"), FP8, tp=tp, engine_kernels=kernels)


@given(st.sampled_from([4, 16, 128]), st.one_of(st.none(), st.integers(1, 600)), st.integers(0, 3000),
       st.integers(0, 3000))
def test_compressed_keys_equal_counting_them(ratio: int, topk: int | None, past: int, tokens: int) -> None:
    """A query at position i attends min(floor((i + 1) / ratio), top-k) compressed entries: summed in closed form
    over past..past+tokens-1, as a loop over the positions counts them."""
    brute = sum(min((i + 1) // ratio, topk if topk is not None else 1 << 62) for i in range(past, past + tokens))
    assert _compressed_keys(ratio, topk, past, tokens) == brute


def test_decode_reads_each_layers_window_and_entries_by_hand() -> None:
    """A decode step at context c reads, per sequence, every layer's min(c, 128) window entries, a CSA layer's
    min(floor(c / 4), 512) selected entries and floor(c / 4) indexer keys, an HCA layer's floor(c / 128) entries:
    FlashMLA's 584-byte records and the 132-byte keys."""
    d = _d()
    batch, context = 8, 10_000
    per_seq = (43 * 128 * 584 + 21 * (min(context // 4, 512) * 584 + context // 4 * 132)
               + 20 * (context // 128) * 584)
    got = step_time(d, StepShape(decode_seqs=batch, decode_context=context), ideal=True)
    assert got.kv_read_bytes == batch * per_seq


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 500_000), st.integers(1, 500_000), st.sampled_from([1, 16, 128]))
def test_decode_step_monotonic_in_context(c1: int, c2: int, batch: int) -> None:
    d = _d()
    lo, hi = sorted((c1, c2))
    for ideal in (True, False):
        assert step_time(d, StepShape(decode_seqs=batch, decode_context=lo), ideal=ideal).seconds <= step_time(
            d, StepShape(decode_seqs=batch, decode_context=hi), ideal=ideal).seconds


def test_engine_fixed_costs_replace_the_kernels_floors() -> None:
    """With the engine's measured fixed cost per layer (vLLM on the H200: CSA 61 us, HCA 36 us in decode), a
    decode step's attention is the kernels' work plus those costs: the floors no longer depend on the kernels' count;
    without them (no engine) the kernels' own floors stand."""
    engine = load_engine("vllm-0.21").kernels
    floors = engine.dsa_block_floors_by_gpu["h200"]
    shape = StepShape(decode_seqs=1, decode_context=512)
    base = step_time(_d(), shape).groups["attention"]
    more = replace(engine, dsa_block_floors_by_gpu={"h200": {**floors, "csa_decode": floors["csa_decode"] + 1e-5}})
    bumped = deployment(FLASH, load_gpu("h200"), parse_weight_precision("fp8_block"), FP8, tp=8,
                        engine_kernels=more)
    assert abs(step_time(bumped, shape).groups["attention"].seconds - base.seconds - 21 * 1e-5) < 1e-9


def test_sglang_selection_cost_ramps_past_the_top_k() -> None:
    """SGLang's CSA layers slow down once their entries outnumber the top-k (512 at 2,048 tokens), fully from twice
    that (its tables: 75 us at 2,048, 156 us from 4,096 at batch 1 on the H200)."""
    d = _d(engine="sglang-0.5")
    extra = load_engine("sglang-0.5").kernels.dsa_block_floors_by_gpu["h200"]["csa_topk_decode"]

    def attention(context: int) -> float:
        return step_time(d, StepShape(decode_seqs=1, decode_context=context)).groups["attention"].seconds

    assert attention(4096) - attention(2048) > 21 * extra
    assert abs((attention(3072) - attention(2048)) - (attention(4096) - attention(3072))) < 21 * extra * 0.2


def test_plan_holds_the_whole_cache_on_every_gpu() -> None:
    """One K=V head is no split: at tp 8 each GPU holds a sequence's whole cache, window + entries + indexer keys +
    the compressors' states (``compressed_held_bytes`` + ``compressor_state_bytes``) under an engine that holds it at
    its own size (TensorRT-LLM's preset), and the sequences are the KV budget over that; the weights at tp 1 are
    ``tfcalc memory``'s (before the engine's own additions)."""
    from tfcalc.calc.memory import weights_bytes
    from tfcalc.calc.params import count_params

    precision = parse_weight_precision(FLASH.native_dtype)
    for tp in (1, 8):
        cfg = PlanConfig(num_gpus=tp, tp=tp, context=32_768, batch=1, engine=load_engine("trtllm"))
        r = plan_fit(FLASH, load_gpu("b200"), precision, FP8, cfg)
        per_seq = compressed_held_bytes(FLASH, FP8, 32_768) + compressor_state_bytes(FLASH)
        assert r.kv_bytes_per_sequence_per_gpu == -(-per_seq.numerator // per_seq.denominator)
        assert r.max_concurrent_sequences == r.kv_budget_bytes_per_gpu // r.kv_bytes_per_sequence_per_gpu
        if tp == 1:
            assert r.weights_bytes_per_gpu_ideal == weights_bytes(count_params(FLASH), precision)


@given(st.integers(1, 2_000_000))
def test_serving_pool_units_are_the_cache_bytes(context: int) -> None:
    """Under an engine that holds the cache at its own size (TensorRT-LLM's preset) the serving model's pool tokens
    for a sequence times the bytes per pool token are its cache and states, up to the rounding of whole compressed
    entries (one entry per layer at most)."""
    shape = kv_shape(FLASH, load_engine("trtllm"), tp=8, kv_dtype=FP8)
    rate = shape.per_pool_token
    assert rate is not None
    held = float(compressed_held_bytes(FLASH, FP8, context) + compressor_state_bytes(FLASH))
    slack = 41 * float(compressed_entry_bytes(FLASH, FP8) + compressed_indexer_bytes(FLASH, FP8))
    assert held - 1e-6 * held <= shape.units(context) * rate <= held + slack


def test_vllm_groups_reproduce_its_log() -> None:
    """vLLM 0.22 on 2 GH200s serving DeepSeek-V4-Flash (vllm-project/vllm issue #44376, the LLM class: 16,384 tokens
    per step) logged "6.66 GiB KV cache is needed" for max_model_len 30,000 and, with 5.44 GiB available,
    "estimated maximum model length is 13528": its DeepSeek-V4 groups (block ids of 1,051,776 B: 22 x the three
    compressed pages, 37,440 + 8,640 + 1,728) give both."""
    from tfcalc.calc.plan import v4_engine_layout
    from tfcalc.calc.shard import stage_census

    layout = v4_engine_layout(FLASH, load_engine("vllm@0.22"), stage_census(FLASH, range(FLASH.num_layers)), FP8)
    assert layout is not None and layout.bytes_per_block == 22 * (37_440 + 8_640 + 1_728) == 1_051_776
    gib = 1 << 30
    assert f"{layout.needed_bytes(30_000, 16_384) / gib:.2f}" == "6.66"
    available = layout.needed_bytes(13_528, 16_384)
    assert f"{available / gib:.2f}" == "5.44" < f"{layout.needed_bytes(13_529, 16_384) / gib:.3f}"
    longest = max(n for n in range(13_000, 14_000) if layout.needed_bytes(n, 16_384) <= available)
    assert longest == 13_528


def test_vllm_plan_reports_its_concurrency_and_the_serving_pool_its_blocks() -> None:
    """Under vLLM the plan's sequences are its "Maximum concurrency" (block ids over a request's reserved blocks,
    none under the bytes it checks one request against); the serving pool counts block ids of 256 tokens, a
    running sequence cdiv(c, 256) of them plus its sliding groups' blocks over their windows."""
    from tfcalc.calc.plan import v4_engine_layout
    from tfcalc.calc.serving_inputs import replica_memory
    from tfcalc.calc.shard import stage_census

    engine = load_engine("vllm-0.21")
    precision = parse_weight_precision(FLASH.native_dtype)
    cfg = PlanConfig(num_gpus=8, tp=8, context=65_536, batch=1, engine=engine, max_num_batched_tokens=8192)
    r = plan_fit(FLASH, load_gpu("h200"), precision, FP8, cfg)
    layout = v4_engine_layout(FLASH, engine, stage_census(FLASH, range(FLASH.num_layers)), FP8)
    assert layout is not None
    blocks = r.kv_budget_bytes_per_gpu // layout.bytes_per_block
    assert r.kv_pool_blocks_per_gpu == blocks
    assert r.max_concurrent_sequences == blocks // layout.blocks_per_request(65_536, 8192)
    memory = replica_memory(FLASH, load_gpu("h200"), precision, FP8, tp=8, pp=1, ep=1, engine=engine,
                            max_model_len=65_536, max_num_seqs=256, max_num_batched_tokens=8192)
    assert memory.kv_capacity_tokens == memory.kv_budget_bytes_per_gpu // layout.bytes_per_block * 256
    shape = kv_shape(FLASH, engine, tp=8, kv_dtype=FP8)
    assert shape.units(65_536) == 65_536 + 256 * (2 * 3 + 3 + 17)  # windows: 2 x (cdiv(127, 64) + 1), 3, 17


def test_engine_cost_per_decoding_sequence_is_linear_in_the_batch() -> None:
    """The tables' cost per decoding sequence (vLLM on the H200: 0.117 us per CSA, 0.124 us per HCA layer) adds that
    much per sequence to every layer of its kind; without it the step is that much shorter."""
    engine = load_engine("vllm-0.21").kernels
    floors = engine.dsa_block_floors_by_gpu["h200"]
    without = replace(engine, dsa_block_floors_by_gpu={"h200": {**floors, "csa_decode_seq": 0.0,
                                                                "hca_decode_seq": 0.0}})
    bare = deployment(FLASH, load_gpu("h200"), parse_weight_precision("fp8_block"), FP8, tp=8,
                      engine_kernels=without)
    shape = StepShape(decode_seqs=256, decode_context=1024)
    gap = step_time(_d(), shape).groups["attention"].seconds - step_time(bare, shape).groups["attention"].seconds
    assert abs(gap - 256 * (21 * floors["csa_decode_seq"] + 20 * floors["hca_decode_seq"])) < 1e-9


def test_hyper_connection_site_costs_the_engines_measured_fixed_time() -> None:
    """A hyper-connection site (one of a layer's two) costs the engine's measured fixed time, half its pre and post
    kernels per layer (vLLM on the H200: 17.5 + 6.2 us), plus the time its stream traffic takes; with no measured
    time, its two kernels' floors."""
    from tfcalc.calc import latency

    d = _d()
    floors = load_engine("vllm-0.21").kernels.dsa_block_floors_by_gpu["h200"]
    step = latency._Step(d.rates_decode)
    latency._hyper_connection(step, d, "attention", 1)
    site = step.groups["attention"]
    assert site.floor_seconds == (floors["hc_pre"] + floors["hc_post"]) / 2
    assert abs(site.floor_seconds - (17.5 + 6.2) / 2 * 1e-6) < 1e-12
    assert site.seconds > site.floor_seconds and site.kernels == 2
    bare = _d(engine=None)
    plain = latency._Step(bare.rates_decode)
    latency._hyper_connection(plain, bare, "attention", 1)
    assert plain.groups["attention"].floor_seconds < site.floor_seconds


def _flash_layout(grouping: str, concurrency: str = "pages"):  # noqa: ANN202 - a V4Layout
    from tfcalc.calc.engine import v4_layout

    return v4_layout(43, 21, 20, 4, 128, 584, 132, (2 * 2 * 512 * 4, 2 * 2 * 128 * 4, 2 * 512 * 4), 576, grouping,
                     concurrency)


def test_vllm_later_groupings_price_a_block_id_as_its_planner_does() -> None:
    """vLLM 0.23-0.28 (_get_kv_cache_config_packed) charge a block id each page size times the most layers of it in
    one group: 22 x 37,440 + 21 x 8,640 + 20 x 1,728 (the compressor states padded to 37,440 as in 0.20-0.22). 0.29+
    (_get_packed_kv_cache_groups) pad nothing and charge the widest of five groups: the compressed caches'. The
    group bytes and blocks per request are those vLLM 0.34's own functions give for DeepSeek-V4-Flash
    (benchmarks/validation/vllm_v4_layout.py runs them)."""
    packed = _flash_layout("packed", "weighted")
    assert packed.bytes_per_block == 22 * 37_440 + 21 * 8_640 + 20 * 1_728 == 1_039_680
    assert [g.bytes for g in packed.groups] == [1_002_240, 823_680, 786_240, 967_680, 748_800]
    outermost = _flash_layout("outermost")
    assert outermost.bytes_per_block == 21 * 37_440 + 21 * 8_640 + 20 * 1_728 == 1_002_240
    assert sorted(g.bytes for g in outermost.groups) == [656_640, 786_240, 823_680, 870_912, 1_002_240]
    assert [outermost.blocks_per_request(n, t) for n, t in [(1_048_576, 16_384), (30_000, 8192), (200, 8192)]] == [
        10_778, 3472, 88]


def test_vllm_026_log_holds_150k_tokens_in_7_7_gib() -> None:
    """vllm-project/vllm issue #51041 (vLLM 0.26.0, H20, tp 2, DeepSeek-V4-Flash-0731, max_model_len 121,344,
    --max-num-batched-tokens 8192): "KV cache holds only 150K tokens in 7.7 GiB". 0.26 reserves the sliding groups
    for two batches in flight (async scheduling: max_in_flight_tokens, on the V1 model runner that release runs
    DeepSeek-V4 on); with one batch it would report 280K."""
    from tfcalc.calc.engine import in_flight_tokens, runner_for, served_precision

    layout = _flash_layout("packed", "weighted")
    vllm, flash = load_engine("vllm"), load_model("deepseek-v4-flash")
    async_026 = runner_for(load_engine("vllm@0.26"), flash, served_precision(flash, None))
    assert async_026 is not None and async_026.runner == "V1" and async_026.kv.v4_groups == "packed"
    assert in_flight_tokens(async_026, 2, 8192) == 16_384 and in_flight_tokens(async_026, 4, 8192) == 4 * 8192
    context = 121_344

    def tokens(in_flight: int, gib: float) -> int:
        blocks = int(gib * (1 << 30)) // layout.bytes_per_block
        return blocks * context // layout.blocks_per_request(context, in_flight)

    two = in_flight_tokens(async_026, 1, 8192)
    assert two == 16_384 == 2 * in_flight_tokens(vllm, 1, 8192)
    assert 149_000 < tokens(two, 7.65) <= tokens(two, 7.75) < 152_500
    assert tokens(8192, 7.7) > 275_000


def test_in_flight_tokens_follow_the_pipeline() -> None:
    """vLLM 0.26+ VllmConfig.max_in_flight_tokens: (pp, + 1 under async scheduling) x max_num_batched_tokens."""
    from tfcalc.calc.engine import in_flight_tokens

    vllm = load_engine("vllm")
    assert [in_flight_tokens(replace(vllm, kv=replace(vllm.kv, in_flight=rule)), 4, 100)
            for rule in ("batch", "pipeline", "pipeline_async")] == [100, 400, 500]
    assert in_flight_tokens(None, 4, 100) == 100


def test_sglang_v4_pools_by_hand() -> None:
    """SGLang 0.5.21+ (DSV4PoolConfigurator, ratio mode at 0.1): pages of n 584-byte entries padded to 576 B (585 B
    per window token and CSA entry, 864 per HCA entry), 8 fp32 compressor rows of 8,192 + 2,048 B per 256-token window
    page on each CSA layer, 132-byte indexer keys; the HCA compressor states fixed for 257 request slots, (257 x 128 +
    129 rows to a multiple of 128) x 1,024 x 4 B on each of 20 layers."""
    from tfcalc.calc.engine import sglang_v4_pool

    per_full = 0.1 * (43 * 585 + 21 * 8 / 256 * 10_240) + 21 * (585 + 132) / 4 + 20 * 864 / 128
    assert per_full == 7086.75
    budget = 100 << 30
    pool = sglang_v4_pool(budget, 43, 21, 20, 4, 128, 584, 132, 512, 128, 0.1, 256)
    assert pool.fixed_bytes == 33_152 * 1024 * 4 * 20 and f"{pool.fixed_bytes / (1 << 30):.2f}" == "2.53"
    assert pool.bytes_per_full_token == per_full
    assert pool.full_tokens == int((budget - pool.fixed_bytes) / per_full) // 256 * 256
    assert pool.swa_tokens == int(pool.full_tokens * 0.1) // 256 * 256
    # a request holds its context in whole pages; short ones are bound by the window pool (768 slots each at most)
    assert pool.sequences(131_072, 256) == pool.full_tokens // 131_072
    assert pool.sequences(1000, 10**6) == min(pool.full_tokens // 1024, pool.swa_tokens // 768)
    assert pool.sequences(10, 256) == 256


def test_sglang_plans_and_serves_deepseek_v4_in_its_pools() -> None:
    """Under SGLang the plan's KV tokens are its full-token slots (max_total_num_tokens) and the serving pool holds a
    sequence's context in them: fewer tokens than the cache at its own size, whose window entries are per request."""
    from tfcalc.calc.plan import sglang_v4_engine_pool
    from tfcalc.calc.serving_inputs import replica_memory
    from tfcalc.calc.shard import stage_census

    engine, gpu = load_engine("sglang"), load_gpu("h200")
    precision = parse_weight_precision(FLASH.native_dtype)
    r = plan_fit(FLASH, gpu, precision, FP8, PlanConfig(num_gpus=8, tp=8, context=131_072, engine=engine))
    pool = sglang_v4_engine_pool(FLASH, engine, stage_census(FLASH, range(FLASH.num_layers)), FP8,
                                 r.kv_budget_bytes_per_gpu)
    assert pool is not None and r.kv_tokens_per_gpu == pool.full_tokens
    assert r.max_concurrent_sequences == pool.full_tokens // 131_072
    own_size = plan_fit(FLASH, gpu, precision, FP8, PlanConfig(
        num_gpus=8, tp=8, context=131_072, engine=replace(engine, kv=replace(engine.kv, v4_pool=None))))
    assert r.kv_tokens_per_gpu < 0.6 * own_size.kv_tokens_per_gpu
    memory = replica_memory(FLASH, gpu, precision, FP8, tp=8, pp=1, ep=1, engine=engine, max_model_len=131_072,
                            max_num_seqs=256, max_num_batched_tokens=8192)
    assert memory.kv_capacity_tokens == pool.full_tokens
    assert kv_shape(FLASH, engine, tp=8, kv_dtype=FP8).units(50_000) == 50_000
