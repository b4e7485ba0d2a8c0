"""Workers for tests/distributed/test_logical_llama.py: a tiny transformers Llama (from its config
class, random weights, offline) sharded with FSDP2 over a gloo group, captured with
`capture_logical`, its placements and its comparison with one process returned per rank."""

from __future__ import annotations

import torch


# the same tiny Llama and per-rank batches as the JupyterLab test's (tests/support/logical_lab.py)
from tests.support.logical_lab import build_model as build_llama  # noqa: E402
from tests.support.logical_lab import rank_ids as llama_ids  # noqa: E402


def _attention(model, attention: str):
    model.config._attn_implementation = attention  # read at each forward: the mask's kind and attention's
    return model


def fsdp_llama_placements(rank: int, world: int, attention: str = "sdpa") -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from nnschemaparser import NNParser, capture_run
    from nnschemaparser.distributed import capture_logical, compare_logical

    model = _attention(build_llama(), attention)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    ids = llama_ids(rank)
    schema = NNParser.parse_model(model, inputs_tensors_values={"input_ids": ids})
    record = capture_logical(schema, {"input_ids": ids}, mesh=mesh)
    trace = record.trace
    layouts = {s.container_id: trace.placement(s.container_id) for s in trace.steps}
    unknown = {cid: [next(f"{s.block_path}:{s.out_var}" for s in trace.steps if s.container_id == cid), layout.source]
               for cid, layout in layouts.items() if not layout.known}
    # the reference: one process, the same model and each rank's rows run as that rank ran them
    reference_model = _attention(build_llama(), attention)
    reference = capture_run(NNParser.parse_model(reference_model, inputs_tensors_values={"input_ids": ids}),
                            {"input_ids": ids})
    whole = torch.cat([llama_ids(r) for r in range(world)])
    whole_model = _attention(build_llama(), attention)
    one = capture_run(NNParser.parse_model(whole_model, inputs_tensors_values={"input_ids": whole}),
                      {"input_ids": whole})
    table = compare_logical(trace, one.trace)
    names = [f"{s.block_path}:{s.out_var}" for s in trace.steps]
    return {"steps": len(trace.steps), "unknown": unknown, "names": names,
            "known": [layouts[s.container_id].known for s in trace.steps],
            "first_unknown_source": next((layouts[s.container_id].source for s in trace.steps
                                          if not layouts[s.container_id].known), None),
            "badges": sorted({layout.badge() for layout in layouts.values()}),
            "mask": [[layouts[s.container_id].badge(), list(trace.logical(s.container_id).shape)]
                     for s in trace.steps if s.out_var == "causal_mask"],
            "exact": int(table["exact"].sum()), "rows": len(table),
            "reasons": sorted(set(table["reason"].astype(str))),
            "skipped": sorted(schema.skipped), "local_equal": bool(torch.equal(record.outputs[0].logits if hasattr(record.outputs[0], "logits") else record.outputs[0], reference.outputs[0].logits if hasattr(reference.outputs[0], "logits") else reference.outputs[0]))}


class InPlaceAndRandom(torch.nn.Module):
    """A forward that writes an activation in place and draws random numbers (train-mode dropout)
    between sharded values: run once more by the placement rules, neither may happen twice."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.out = torch.nn.Linear(8, 8)

    def forward(self, x):
        hidden = self.fc(x)
        hidden.mul_(2.0)
        noisy = torch.nn.functional.dropout(hidden, 0.5, True)
        return self.out(noisy + torch.rand_like(noisy))


def fsdp_in_place_and_random(rank: int, world: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from nnschemaparser import NNParser
    from nnschemaparser.distributed import capture_logical

    def build():
        torch.manual_seed(0)
        model = InPlaceAndRandom()
        fully_shard(model.fc, mesh=mesh)
        fully_shard(model.out, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model

    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    x = torch.randn(2, 8, generator=torch.Generator().manual_seed(10 + rank))
    eager, parsed = build(), build()
    schema = NNParser.parse_model(parsed, inputs_tensors_values={"x": x})
    torch.manual_seed(5)
    with torch.no_grad():
        expected = eager(x)
    torch.manual_seed(5)
    record = capture_logical(schema, {"x": x}, mesh=mesh)
    from nnschemaparser import SchemaInterpreter, capture_run
    torch.manual_seed(5)
    with torch.no_grad():
        plain = SchemaInterpreter().call(schema, x)
    torch.manual_seed(5)
    with torch.no_grad():
        captured = capture_run(schema, {"x": x}).outputs[0]
    trace = record.trace
    badges = {f"{s.block_path}:{s.out_var}": trace.placement(s.container_id).badge() for s in trace.steps}
    return {"output_equal": bool(torch.equal(record.outputs[0], expected)), "badges": badges,
            "plain_equal": bool(torch.equal(plain, expected)), "capture_equal": bool(torch.equal(captured, expected))}
