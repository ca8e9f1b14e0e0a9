"""The sharded-decoder check run on every rank (``tests/model/test_parallel.py``): a top-level job, so the fork
server's ranks can unpickle it."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tfcalc.model import Transformer, build_model
from tfcalc.model.parallel import Parallel, parameter_count
from tfcalc.spec.model import ModelSpec

BATCH, PROMPT, DECODE = 2, 6, 3


@dataclass(frozen=True)
class Case:
    name: str
    spec: ModelSpec
    tp: int
    ep: int
    weights: str | None = None  # FP8 weights (fp8 / fp8_block), or the compute dtype
    dtype: torch.dtype = torch.float32
    prompt: int = PROMPT  # tokens prefilled, then ``decode`` cached steps
    decode: int = DECODE
    # False: build without the planner's sharding checks (``build_model`` refuses what ``tfcalc plan`` refuses), for
    # a layout the decoder shards but the planner does not count (Mamba-2 groups replicated over ranks)
    checked: bool = True


def build(case: Case, parallel: Parallel | None = None) -> Transformer:
    """The case's model from seed 7 (``build_model``, or where not ``checked`` the same construction without the
    planner's checks), this rank's shard of it where ``parallel`` is given."""
    if case.checked:
        return build_model(case.spec, dtype=case.dtype, seed=7, weights_dtype=case.weights, parallel=parallel)
    torch.manual_seed(7)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(case.dtype)
    try:
        with torch.no_grad():
            return Transformer(case.spec, weights_dtype=case.weights, parallel=parallel).eval()
    finally:
        torch.set_default_dtype(previous)


@dataclass(frozen=True)
class CompareWithOneRank:
    """Each case on every rank: the one-rank model and this rank's shard of it, built from the same seed; the
    shard's replica runs BATCH prompts (replica r takes rows r*BATCH.. of the one-rank batch), prefill then the
    case's cached decode steps. Rank 0 sends, per case and rank: the largest |logit difference| / max |logit|, the
    parameters held and the collectives per forward."""

    cases: tuple[Case, ...]

    def __call__(self, ctx) -> None:  # noqa: ANN001 - RankContext
        results = []
        for case in self.cases:
            par = Parallel.create(case.tp, case.ep, ctx.device)
            reference, sharded = build(case), build(case, par)
            generator = torch.Generator().manual_seed(11)
            everyone = BATCH * par.dp
            prompts = torch.randint(1, case.spec.vocab_size, (everyone, case.prompt), generator=generator)
            steps = torch.randint(1, case.spec.vocab_size, (everyone, case.decode), generator=generator)
            mine = slice(BATCH * par.replica, BATCH * (par.replica + 1))
            reference.setup_caches(everyone, case.prompt + case.decode)
            sharded.setup_caches(BATCH, case.prompt + case.decode)
            errors = []
            with torch.inference_mode():
                pairs = [(reference.prefill(prompts)[mine], sharded.prefill(prompts[mine]))]
                for j in range(case.decode):
                    pairs.append((reference.decode_step(steps[:, j:j + 1])[mine],
                                  sharded.decode_step(steps[mine, j:j + 1])))
            for expected, got in pairs:
                errors.append(float((expected - got).abs().max() / expected.abs().max()))
            results.append({"case": case.name, "rank": ctx.rank, "error": max(errors),
                            "params": parameter_count(sharded), "collectives": par.comm.calls / (1 + case.decode)})
        gathered = ctx.gather(results)
        if gathered is not None:
            ctx.send("results", [r for rank in gathered for r in rank])
