"""Small config.json files, read the way a user's are: families no preset covers (GLM-4.5 MoE, MiniMax-M2, Qwen3-Next,
Qwen3.5, DeepSeek-V3.2 and GLM-5.2 with DSA), and Llama 4 with a chunk and temperature floor small enough for a short
prompt to cross."""

from __future__ import annotations

from tfcalc.spec.hf_config import spec_from_hf_config
from tfcalc.spec.model import ModelSpec

_SMALL_COMMON = {"vocab_size": 97, "hidden_size": 48, "num_hidden_layers": 3, "num_attention_heads": 6,
                 "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 64, "rms_norm_eps": 1e-5,
                 "rope_theta": 10000.0, "tie_word_embeddings": False, "num_experts_per_tok": 2}
SMALL_GLM4_MOE = {**_SMALL_COMMON, "model_type": "glm4_moe", "intermediate_size": 64, "moe_intermediate_size": 24,
                  "n_routed_experts": 8, "n_shared_experts": 1, "first_k_dense_replace": 1, "n_group": 4,
                  "topk_group": 2, "routed_scaling_factor": 2.5, "norm_topk_prob": True, "use_qk_norm": True,
                  "attention_bias": True, "partial_rotary_factor": 0.5}
SMALL_MINIMAX_M2 = {**_SMALL_COMMON, "model_type": "minimax_m2", "intermediate_size": 24, "num_local_experts": 8,
                    "rotary_dim": 8, "scoring_func": "sigmoid", "use_routing_bias": True}

# Gated DeltaNet hybrids: 2 key heads of 8 serving 4 value heads of 12 (every width distinct), a 4-tap conv; gated
# attention with head_dim 32 of which a quarter (8) is rotated, zero-centred norms and QK-norm.
_SMALL_LINEAR = {"linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 8,
                 "linear_value_head_dim": 12, "linear_conv_kernel_dim": 4, "head_dim": 32,
                 "partial_rotary_factor": 0.25, "num_hidden_layers": 4}
# Qwen3-Next: layers linear, linear, linear, full (full_attention_interval 4); MoE with a gated shared expert on
# every layer but layer 1 (a dense MLP)
SMALL_QWEN3_NEXT = {**_SMALL_COMMON, **_SMALL_LINEAR, "model_type": "qwen3_next", "intermediate_size": 64,
                    "num_experts": 8, "moe_intermediate_size": 24, "shared_expert_intermediate_size": 16,
                    "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [1]}
# Qwen3.5 dense (text only, Qwen3_5ForCausalLM): layers linear, full, linear, full; tied embeddings
SMALL_QWEN3_5 = {**_SMALL_COMMON, **_SMALL_LINEAR, "model_type": "qwen3_5_text", "intermediate_size": 64,
                 "tie_word_embeddings": True,
                 "layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"]}


def small_config_spec(config: dict) -> ModelSpec:
    return spec_from_hf_config(config, origin="small", name=config["model_type"])


# Llama 4 (Llama4ForCausalLM): 4 layers of hidden 64, 4 query heads of 16 over 2 KV heads, RoPE layers attending within
# chunks of 8 tokens, NoPE layers with attention temperature tuning at floor_scale 4 (x1.07 from position 3, x1.11 from
# 7), 4 sigmoid-routed experts of 32 scaling their inputs plus a shared expert of 32, dense MLPs of 96.
_SMALL_LLAMA4 = {**_SMALL_COMMON, "model_type": "llama4_text", "hidden_size": 64, "num_hidden_layers": 4,
                 "num_attention_heads": 4, "intermediate_size": 32, "intermediate_size_mlp": 96,
                 "num_local_experts": 4, "attention_chunk_size": 8, "attn_temperature_tuning": True,
                 "floor_scale": 4, "attn_scale": 0.1}
# Scout-like: MoE on every layer (top 1), layers 0-2 chunked with RoPE and the weightless QK norm, layer 3 NoPE and
# global; llama3 RoPE scaling (factor 8 over an original 16 tokens, so that the prompt's frequencies are scaled)
SMALL_LLAMA4 = {**_SMALL_LLAMA4, "num_experts_per_tok": 1, "use_qk_norm": True, "interleave_moe_layer_step": 1,
                "no_rope_layer_interval": 4,
                "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 16}}
# Maverick-like: MoE (top 2, not renormalised) on odd layers, dense MLPs on even ones, no QK norm; layers 0 (dense)
# and 1 (MoE) chunked with RoPE, 2 (dense) and 3 (MoE) NoPE and global; plain RoPE
SMALL_LLAMA4_INTERLEAVED = {**_SMALL_LLAMA4, "num_experts_per_tok": 2, "use_qk_norm": False,
                            "interleave_moe_layer_step": 2, "no_rope_layers": [1, 1, 0, 0]}

# Gemma 4 (Gemma4ForCausalLM): 4 layers of hidden 48, 4 query heads; sliding layers (0, 2) of 2 KV heads of 16 over an
# 8-token window, global layers (1, 3) of 1 KV head of 32 whose values are the key projection, a quarter of each global
# head turned by proportional RoPE (base 1e6; 1e4 on the sliding layers), GeGLU MLPs of 64, tied head, logits
# soft-capped at 30; the MoE variant adds 8 experts of 24 (top 2) beside the MLP on every layer.
SMALL_GEMMA4 = {**{k: v for k, v in _SMALL_COMMON.items() if k not in ("rope_theta", "num_experts_per_tok")},
                "model_type": "gemma4_text", "num_hidden_layers": 4, "num_attention_heads": 4,
                "num_key_value_heads": 2, "global_head_dim": 32, "num_global_key_value_heads": 1,
                "attention_k_eq_v": True, "intermediate_size": 64, "sliding_window": 8,
                "hidden_activation": "gelu_pytorch_tanh", "hidden_size_per_layer_input": 0,
                "num_kv_shared_layers": 0, "tie_word_embeddings": True, "final_logit_softcapping": 30.0,
                "layer_types": ["sliding_attention", "full_attention"] * 2,
                "rope_parameters": {"full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                                       "rope_theta": 1e6},
                                    "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}}
SMALL_GEMMA4_MOE = {**SMALL_GEMMA4, "enable_moe_block": True, "num_experts": 8, "top_k_experts": 2,
                    "moe_intermediate_size": 24}

# DeepSeek Sparse Attention: MLA of 6 heads (q rank 24, latent 16, nope 8, rope 8, v 12) whose lightning indexer (8
# heads of 128) keeps the top 8 keys of each query; a dense layer, then MoE layers of 8 sigmoid-routed experts of 24
# (top 2) with a shared expert. DeepSeek-V3.2 (DeepseekV32ForCausalLM): an indexer on each of 3 layers, yarn (factor
# 40 over an original 16 tokens, mscale 1/1; 640 positions), 4 expert groups (top 2).
_SMALL_DSA = {**_SMALL_COMMON, "num_key_value_heads": 6, "intermediate_size": 64, "moe_intermediate_size": 24,
              "n_routed_experts": 8, "n_shared_experts": 1, "first_k_dense_replace": 1, "routed_scaling_factor": 2.5,
              "norm_topk_prob": True, "q_lora_rank": 24, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
              "qk_rope_head_dim": 8, "v_head_dim": 12, "index_n_heads": 8, "index_head_dim": 128, "index_topk": 8}
SMALL_DEEPSEEK_V32 = {**_SMALL_DSA, "model_type": "deepseek_v32", "architectures": ["DeepseekV32ForCausalLM"],
                      "n_group": 4, "topk_group": 2, "max_position_embeddings": 640,
                      "rope_scaling": {"type": "yarn", "factor": 40.0, "original_max_position_embeddings": 16,
                                       "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}}
# GLM-5.2 (GlmMoeDsaForCausalLM): 4 layers whose indexers run on layers 0 and 2, layers 1 and 3 attending the keys the
# previous one chose (indexer_types "shared"); the indexer's RoPE on adjacent pairs; one expert group.
SMALL_GLM_DSA = {**_SMALL_DSA, "model_type": "glm_moe_dsa", "architectures": ["GlmMoeDsaForCausalLM"],
                 "num_hidden_layers": 4, "n_group": 1, "topk_group": 1, "rope_interleave": True,
                 "indexer_rope_interleave": True, "indexer_types": ["full", "shared", "full", "shared"]}

# Nemotron-H (NemotronHForCausalLM): blocks of one Mamba-2 mixer ("M": 6 heads of 10 reading 2 groups of B/C with a
# state of 8, a 4-tap conv with bias, 8-token chunks), one attention without RoPE ("*": 6 query heads of 16 over 2 KV
# heads), one relu^2 MLP ("-", width 64) or one MoE ("E"), each behind one RMSNorm. Every width distinct from the
# hidden 48: d_inner 60, conv channels 92.
_SMALL_NEMOTRON_H = {**{k: v for k, v in _SMALL_COMMON.items() if k not in ("rope_theta", "rms_norm_eps")},
                     "model_type": "nemotron_h", "architectures": ["NemotronHForCausalLM"], "num_hidden_layers": 6,
                     "max_position_embeddings": 64, "layer_norm_epsilon": 1e-5, "mamba_num_heads": 6,
                     "mamba_head_dim": 10, "n_groups": 2, "ssm_state_size": 8, "conv_kernel": 4,
                     "use_conv_bias": True, "chunk_size": 8, "mamba_proj_bias": False, "use_bias": False,
                     "intermediate_size": 64, "mlp_hidden_act": "relu2", "mamba_ssm_cache_dtype": "float32"}
# Nemotron 3 Nano-like: Mamba-2, MoE and attention blocks; 8 relu^2 experts of 24 (top 2) in 4 groups (best 2), a
# shared expert of 16, sigmoid router with a score-correction bias, x2.5
SMALL_NEMOTRON_NANO = {**_SMALL_NEMOTRON_H, "hybrid_override_pattern": "MEM*EM", "n_routed_experts": 8,
                       "moe_intermediate_size": 24, "n_shared_experts": 1, "moe_shared_expert_intermediate_size": 16,
                       "n_group": 4, "topk_group": 2, "routed_scaling_factor": 2.5, "norm_topk_prob": True}
# Nemotron 3 Super-like: Nano's blocks with a latent MoE (experts on a projection of the hidden 48 to 20)
SMALL_NEMOTRON_SUPER = {**SMALL_NEMOTRON_NANO, "moe_latent_size": 20}
# Nemotron-H 56B-like: Mamba-2, MLP and attention blocks, no experts
SMALL_NEMOTRON_H = {**_SMALL_NEMOTRON_H, "hybrid_override_pattern": "M-M*-M"}


# MiMo-V2-Flash: full (0), sliding, sliding, full layers; keys of 16, values of 8; 2 KV heads on full layers, 4 on
# sliding ones (transformers' default: twice), sinks on the sliding layers
SMALL_MIMO_V2_FLASH = {**_SMALL_COMMON, "model_type": "mimo_v2_flash", "num_hidden_layers": 4, "v_head_dim": 8,
                       "num_attention_heads": 4,
                       "hybrid_layer_pattern": [0, 1, 1, 0], "sliding_window_size": 8, "intermediate_size": 64,
                       "moe_intermediate_size": 24, "n_routed_experts": 8, "moe_layer_freq": [0, 1, 1, 1],
                       "add_swa_attention_sink_bias": True, "partial_rotary_factor": 0.5}
