"""The sentence under each ``tfcalc plan`` row (tfcalc/report/plan.py: plan_note) names what the weights assumed."""

from __future__ import annotations

from tfcalc.calc.plan import PlanConfig, plan_fit
from tfcalc.dtypes import get_dtype, parse_weight_precision
from tfcalc.report.plan import plan_note
from tfcalc.spec.presets import load_engine, load_gpu, load_model


def _note(preset: str, weights: str) -> str:
    spec, gpu, precision = load_model(preset), load_gpu("h100-sxm"), parse_weight_precision(weights)
    r = plan_fit(spec, gpu, precision, get_dtype("bf16"),
                 PlanConfig(num_gpus=8, tp=8, context=16384, engine=load_engine("vllm")))
    return plan_note(spec, gpu, precision, get_dtype("bf16"), r)


def test_the_checkpoints_own_16_bit_layers_are_said() -> None:
    # meta-llama/Llama-3.1-405B-Instruct-FP8 config.json modules_to_not_convert: lm_head, every layer's
    # self_attn.{q,k,v,o}_proj and the MLP of layers 0 and 125 (of 126); plan counted them but said only lm_head
    note = _note("llama3.1-405b", "fp8")
    assert "the checkpoint also keeps attention of every layer in bf16, mlp of layers 0, 125 in bf16" in note
    # a bf16 plan quantizes nothing, so nothing is kept
    assert "checkpoint also keeps" not in _note("llama3.1-405b", "bf16")
    # a model without per-layer exceptions says only the components every quantized checkpoint keeps
    assert "checkpoint also keeps" not in _note("llama3-70b", "fp8")
