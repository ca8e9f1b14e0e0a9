"""The fused-MoE Triton configurations an engine release ships: the engine presets' ``kernels.moe_tuned_shapes``
(presets/engines/sglang-0.5.yaml, presets/engines/vllm-0.21.yaml).

SGLang's and vLLM's Triton fused MoE look up a tuned tile configuration for the layer's shape under the name
``E={local experts},N={per-rank expert width},device_name={GPU}[,dtype=...].json``: SGLang in
``sglang/srt/layers/moe/moe_runner/triton_utils/configs/triton_<version>/`` (the installed Triton's folder first,
then every other folder newest first: ``fused_moe_triton_config.get_moe_configs``), vLLM in
``vllm/model_executor/layers/fused_moe/configs/`` (``fused_moe.get_moe_configs``). Without one they run
``get_default_config`` and log "Using default MoE (kernel) config. Performance might be sub-optimal!". This script
lists, from a release's wheel (``pip download --no-deps sglang==0.5.14`` or ``vllm==0.24.0``), the (E, N) pairs of
16-bit experts (no dtype in the name) per GPU preset, as the preset's YAML.

Usage: python benchmarks/validation/moe_config_files.py sglang-0.5.14-*.whl | vllm-0.24.0-*.whl
"""

from __future__ import annotations

import re
import sys
import zipfile

# the device_name the engines read (torch.cuda.get_device_name, spaces as underscores) of each GPU preset
DEVICES = {"h100-sxm": "NVIDIA_H100_80GB_HBM3", "h200": "NVIDIA_H200", "b200": "NVIDIA_B200"}
_NAME = re.compile(r"(?:/triton_utils/configs/triton_[0-9_]+|/layers/fused_moe/configs)/"
                   r"E=(\d+),N=(\d+),device_name=([^,]+)\.json$")


def tuned_shapes(names: list[str]) -> dict[str, list[tuple[int, int]]]:
    """GPU preset -> sorted (E, N) pairs with a 16-bit config file among ``names`` (paths inside the wheel)."""
    out: dict[str, set[tuple[int, int]]] = {gpu: set() for gpu in DEVICES}
    by_device = {device: gpu for gpu, device in DEVICES.items()}
    for name in names:
        match = _NAME.search(name)
        if match and match.group(3) in by_device:
            out[by_device[match.group(3)]].add((int(match.group(1)), int(match.group(2))))
    return {gpu: sorted(pairs) for gpu, pairs in out.items()}


def main(wheel: str) -> None:
    with zipfile.ZipFile(wheel) as z:
        shapes = tuned_shapes(z.namelist())
    print("  moe_tuned_shapes:")
    for gpu, pairs in shapes.items():
        print(f"    {gpu}:")
        print(f"      bf16: [{', '.join(f'{e}x{n}' for e, n in pairs)}]")


if __name__ == "__main__":
    main(sys.argv[1])
