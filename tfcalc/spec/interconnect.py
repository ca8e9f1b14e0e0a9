"""Interconnect presets (``presets/interconnects/NAME.yaml``): GPU-to-GPU fabrics as the communication model uses
them, validated into ``Interconnect`` (units as printed: GB/s = 10^9 bytes/s one direction per GPU, microseconds).

Each preset gives the link bandwidth and NCCL's measured behaviour on it (efficiency for large messages, the launch
floor, the latency of one algorithm step, the algorithm NCCL uses there); fabrics with peer-to-peer access (NVLink)
may add ``custom_allreduce``, the one-/two-shot kernels vLLM, SGLang and TensorRT-LLM use for small messages
(``CustomAllReduce``; which of the two an engine runs is the engine's: ``EngineKernels.one_shot_allreduce``).
``forward_sync_us_per_peer``: what an all-reduce inside a model's forward pays beyond its kernel timed back to back,
per peer GPU (the ranks meet at every all-reduce of the step; docs/estimate.md, "Communication").
``expert_all_to_all`` (launch, efficiency): the MoE dispatch / combine kernels (DeepEP, TensorRT-LLM's NVLink
all-to-all) where they were measured on the fabric; elsewhere they see NCCL's link (``Interconnect.expert_link``).
``nccl_efficiency_by_gpus`` ({GPUS: efficiency}): NCCL's large-message efficiency from that many GPUs up, where it
falls with the GPU count (PCIe servers: rings beyond one switch or socket cross the CPU's root complexes or go
through host memory, NVIDIA/nccl#1639; ``Interconnect.nccl_for``); below the smallest count, ``nccl.efficiency``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tfcalc.errors import SpecError

ALGORITHMS = ("auto", "ring", "tree")


@dataclass(frozen=True, kw_only=True)
class Link:
    """One GPU's path to its peers for a collective: bandwidth per direction and latencies (SI units)."""

    name: str
    bandwidth_bytes_per_s: float  # one direction, per GPU
    efficiency: float  # fraction of the bandwidth large messages reach
    step_latency_s: float  # alpha: one algorithm step (a hop through the fabric, a synchronisation)
    launch_s: float  # fixed cost of one collective kernel
    source: str = ""

    @property
    def beta(self) -> float:
        """Achievable one-direction bytes/s."""
        return self.bandwidth_bytes_per_s * self.efficiency

    def ideal(self) -> Link:
        """The same link at full bandwidth and without latencies (the pure roofline's view)."""
        return Link(name=self.name, bandwidth_bytes_per_s=self.bandwidth_bytes_per_s, efficiency=1.0,
                    step_latency_s=0.0, launch_s=0.0, source=self.source)


@dataclass(frozen=True, kw_only=True)
class CustomAllReduce:
    """An engine's all-reduce over peer memory (vLLM's csrc/custom_all_reduce.cuh, SGLang's port, TensorRT-LLM's
    own): the one-shot kernel reads every peer's whole buffer, the two-shot kernel reduce-scatters and all-gathers
    through peer buffers (``tfcalc.calc.comm.custom_all_reduce``). SI units."""

    name: str
    bandwidth_bytes_per_s: float  # the fabric's, one direction per GPU
    launch_s: float  # a small message's whole time: launch and barrier
    one_shot_efficiency: float  # of the bandwidth: the (n - 1) x S a GPU reads in the one-shot kernel
    two_shot_efficiency: float  # of the bandwidth: the 2 (n - 1) / n x S a GPU moves in the two-shot kernel
    two_shot_latency_s: float  # the two-shot kernel's second stage and barrier
    two_shot_latency_s_per_peer: float = 0.0  # and per peer GPU (its barriers signal and wait on every peer)
    source: str = ""


_KEYS = {"display_name", "bandwidth_gb_s", "nccl", "custom_allreduce", "expert_all_to_all", "forward_sync_us_per_peer",
         "nccl_efficiency_by_gpus", "sources", "notes"}
_IMPL_KEYS = {"efficiency", "launch_us", "step_latency_us", "algorithm"}
_CUSTOM_KEYS = {"launch_us", "one_shot_efficiency", "two_shot_efficiency", "two_shot_latency_us"}
_EXPERT_KEYS = {"launch_us", "efficiency"}


@dataclass(frozen=True, kw_only=True)
class Interconnect:
    """A fabric: NCCL's link view and, where it exists, the custom all-reduce's."""

    name: str
    display_name: str
    nccl: Link
    algorithm: str
    custom_allreduce: CustomAllReduce | None = None
    forward_sync_s_per_peer: float = 0.0  # each all-reduce of a forward, per peer GPU (module docstring)
    expert_all_to_all: Link | None = None  # the MoE dispatch / combine kernels' own link, where measured
    nccl_efficiency_by_gpus: tuple[tuple[int, float], ...] = ()  # (GPUs, efficiency) ascending (module docstring)

    def nccl_for(self, n: int, ideal: bool = False) -> Link:
        """NCCL's link for a collective over ``n`` GPUs: the efficiency of the largest listed count <= n
        (``nccl_efficiency_by_gpus``), else ``nccl`` as it is; ``ideal``: its ideal link (``Link.ideal``)."""
        efficiency = None
        for gpus, value in self.nccl_efficiency_by_gpus:
            if gpus <= n:
                efficiency = value
        link = self.nccl if efficiency is None else replace(self.nccl, efficiency=efficiency)
        return link.ideal() if ideal else link

    @property
    def expert_link(self) -> Link:
        """The link MoE dispatch and combine see: their kernels' measured one (``expert_all_to_all``), else NCCL's."""
        return self.expert_all_to_all or self.nccl


MAX_BANDWIDTH_GB_S = 1e7  # as GPU_LIMITS' interconnect_bidirectional_gb_s: 1000x today's fastest fabric
MAX_MICROSECONDS = 1e6


def _number(value: Any, origin: str, key: str, upper: float, allow_zero: bool = False) -> float:
    """A finite number, positive (or non-negative with ``allow_zero``) and at most ``upper``
    (``tfcalc.spec.model.check_float``)."""
    from tfcalc.spec.model import check_float, in_file

    return in_file(origin, check_float, key, value, high=upper, low=0.0 if allow_zero else None)


def _checked_block(data: Any, origin: str, key: str, known: set[str], required: set[str]) -> dict[str, Any]:
    """A preset block: a mapping of known fields with the required ones present, else one clear error."""
    from tfcalc.spec.model import key_text

    if not isinstance(data, dict):
        raise SpecError(f"{origin}: field '{key}' must be a mapping of {', '.join(sorted(known))}")
    unknown = sorted(key_text(k) for k in data if k not in known)
    if unknown:
        raise SpecError(f"{origin}: unknown field '{key}.{unknown[0]}' (known: {', '.join(sorted(known))})")
    for field_name in sorted(required):
        if data.get(field_name) is None:
            raise SpecError(f"{origin}: missing required field '{key}.{field_name}'")
    return data


def _link(data: Any, origin: str, key: str, name: str, bandwidth: float) -> tuple[Link, str]:
    from tfcalc.spec.model import key_text

    data = _checked_block(data, origin, key, _IMPL_KEYS, _IMPL_KEYS - {"algorithm"})
    algorithm = data.get("algorithm", "ring")
    if not isinstance(algorithm, str) or algorithm not in ALGORITHMS:
        raise SpecError(f"{origin}: field '{key}.algorithm' must be one of {', '.join(ALGORITHMS)}, got "
                        f"{key_text(algorithm)!r}")
    link = Link(name=name, bandwidth_bytes_per_s=bandwidth,
                efficiency=_number(data["efficiency"], origin, f"{key}.efficiency", upper=1.0),
                step_latency_s=_number(data["step_latency_us"], origin, f"{key}.step_latency_us", MAX_MICROSECONDS,
                                       allow_zero=True) * 1e-6,
                launch_s=_number(data["launch_us"], origin, f"{key}.launch_us", MAX_MICROSECONDS,
                                 allow_zero=True) * 1e-6,
                source=origin)
    return link, algorithm


def _custom(data: Any, origin: str, name: str, bandwidth: float) -> CustomAllReduce:
    key = "custom_allreduce"
    data = _checked_block(data, origin, key, _CUSTOM_KEYS, _CUSTOM_KEYS)
    return CustomAllReduce(
        name=name, bandwidth_bytes_per_s=bandwidth,
        launch_s=_number(data["launch_us"], origin, f"{key}.launch_us", MAX_MICROSECONDS, allow_zero=True) * 1e-6,
        one_shot_efficiency=_number(data["one_shot_efficiency"], origin, f"{key}.one_shot_efficiency", upper=1.0),
        two_shot_efficiency=_number(data["two_shot_efficiency"], origin, f"{key}.two_shot_efficiency", upper=1.0),
        two_shot_latency_s=_number(data["two_shot_latency_us"], origin, f"{key}.two_shot_latency_us",
                                   MAX_MICROSECONDS, allow_zero=True) * 1e-6,
        source=origin)


def _expert(data: Any, origin: str, name: str, bandwidth: float) -> Link:
    key = "expert_all_to_all"
    data = _checked_block(data, origin, key, _EXPERT_KEYS, _EXPERT_KEYS)
    return Link(name=name, bandwidth_bytes_per_s=bandwidth,
                efficiency=_number(data["efficiency"], origin, f"{key}.efficiency", upper=1.0), step_latency_s=0.0,
                launch_s=_number(data["launch_us"], origin, f"{key}.launch_us", MAX_MICROSECONDS,
                                 allow_zero=True) * 1e-6, source=origin)


def _by_gpus(data: Any, origin: str) -> tuple[tuple[int, float], ...]:
    """``nccl_efficiency_by_gpus: {GPUS: efficiency}``, GPU counts >= 2, as (GPUs, efficiency) ascending."""
    from tfcalc.spec.model import key_text

    key = "nccl_efficiency_by_gpus"
    if not isinstance(data, dict) or not data:
        raise SpecError(f"{origin}: field '{key}' must be a mapping of GPU counts to efficiencies")
    rows = []
    for gpus, value in data.items():
        if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 2:
            raise SpecError(f"{origin}: field '{key}' has GPU count {key_text(gpus)}: it must be an integer >= 2")
        rows.append((gpus, _number(value, origin, f"{key}.{gpus}", upper=1.0)))
    return tuple(sorted(rows))


def interconnect_from_mapping(data: dict[str, Any], origin: str, default_name: str) -> Interconnect:
    """Validate an interconnect preset mapping (module docstring) into an ``Interconnect``."""
    from tfcalc.spec.model import MAX_NAME_CHARS, check_str, key_text

    unknown = sorted(key_text(k) for k in data if k not in _KEYS)
    if unknown:
        raise SpecError(f"{origin}: unknown field '{unknown[0]}' (known: {', '.join(sorted(_KEYS))})")
    for key in ("display_name", "notes"):
        if data.get(key) is not None:
            try:
                check_str(key, data[key], MAX_NAME_CHARS if key == "display_name" else None)
            except SpecError as exc:
                raise SpecError(f"{origin}: {exc}") from None
    if data.get("sources") is not None and not isinstance(data["sources"], dict):
        raise SpecError(f"{origin}: field 'sources' must be a mapping of fields to their sources")
    for required in ("bandwidth_gb_s", "nccl"):
        if data.get(required) is None:
            raise SpecError(f"{origin}: missing required field '{required}'")
    bandwidth = _number(data["bandwidth_gb_s"], origin, "bandwidth_gb_s", MAX_BANDWIDTH_GB_S) * 1e9
    nccl, algorithm = _link(data["nccl"], origin, "nccl", default_name, bandwidth)
    custom = None
    if data.get("custom_allreduce") is not None:
        custom = _custom(data["custom_allreduce"], origin, f"{default_name} custom all-reduce", bandwidth)
    expert = None
    if data.get("expert_all_to_all") is not None:
        expert = _expert(data["expert_all_to_all"], origin, f"{default_name} MoE all-to-all", bandwidth)
    sync = data.get("forward_sync_us_per_peer")
    sync_s = 0.0 if sync is None else _number(sync, origin, "forward_sync_us_per_peer", MAX_MICROSECONDS,
                                              allow_zero=True) * 1e-6
    by_gpus = () if data.get("nccl_efficiency_by_gpus") is None else _by_gpus(data["nccl_efficiency_by_gpus"], origin)
    return Interconnect(name=default_name, display_name=str(data.get("display_name", default_name)), nccl=nccl,
                        algorithm=algorithm, custom_allreduce=custom, forward_sync_s_per_peer=sync_s,
                        expert_all_to_all=expert, nccl_efficiency_by_gpus=by_gpus)


def load_interconnect(name_or_path: str) -> Interconnect:
    """An interconnect preset by name (``nvlink4``), or a user's YAML file in the same format."""
    from tfcalc.spec.presets import looks_like_path, preset_path, read_data_file

    if looks_like_path(name_or_path):
        path = Path(name_or_path)
        return interconnect_from_mapping(read_data_file(path), str(path), path.stem)
    path = preset_path("interconnect", name_or_path)
    return interconnect_from_mapping(read_data_file(path), str(path), name_or_path)
