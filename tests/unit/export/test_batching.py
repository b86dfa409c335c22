"""Cross-request batching without a server: how a batch is cut into merged runs, the batched
configs, and an exported step answering a batch in merged runs exactly as one request at a time."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from merlin_torch_serving import Ensemble, ModelOptions
from merlin_torch_serving.data import wire
from merlin_torch_serving.export import config as configs
from merlin_torch_serving.export import merging
from merlin_torch_serving.export.libtorch_batching import _merged_offsets, flat_batch
from merlin_torch_serving.export.python_model import HostedStep
from merlin_torch_serving.export.warmup_files import WARMUP_DIR, read_warmup_files
from tests import toy_session
from tests.session_models import SERVED_TORCH_THREADS, torch_threads


def _clicks(session_ids, lists=None) -> dict[str, np.ndarray]:
    """Wire arrays of a request: a session id per row, and a ragged ``items`` column if given."""
    arrays = {"session_id": np.asarray(session_ids, dtype=np.int64)}
    if lists is not None:
        arrays["items__values"] = np.concatenate([[], *lists]).astype(np.int64)
        arrays["items__offsets"] = np.cumsum([0] + [len(x) for x in lists]).astype(np.int32)
    return arrays


def test_requests_that_share_a_session_go_to_different_runs():
    requests = [_clicks([1, 1]), _clicks([2]), _clicks([1, 3]), _clicks([4])]
    assert merging.plan_runs(requests, ["session_id"], max_rows=100) == [[0, 1, 3], [2]]


def test_runs_stay_within_the_row_limit_and_rows_stand_alone_without_keys():
    requests = [_clicks([1] * 3), _clicks([2] * 3), _clicks([3] * 2), _clicks([4] * 5)]
    assert merging.plan_runs(requests, ["session_id"], max_rows=5) == [[0, 2], [1], [3]]
    assert merging.plan_runs([_clicks([1]), _clicks([1])], [], max_rows=5) == [[0, 1]]


def test_answer_rows_are_sessions_with_keys_and_rows_without():
    request = _clicks([7, 7, 8, 7])
    assert merging.answer_rows(request, ["session_id"]) == 2
    assert merging.answer_rows(request, []) == 4
    assert (
        merging.request_size(_clicks([1, 2], lists=[[1, 2, 3], [4, 5]])) == 5
    )  # each list value counts


def test_concat_joins_ragged_and_scalar_tensors_and_split_cuts_them_back():
    parts = [_clicks([5, 6], lists=[[1], [2, 3]]), _clicks([7], lists=[[]]), _clicks([], lists=[])]
    merged = merging.concat(parts)
    assert merged["session_id"].tolist() == [5, 6, 7]
    assert merged["items__values"].tolist() == [1, 2, 3]
    assert merged["items__offsets"].tolist() == [0, 1, 3, 3]
    assert merged["items__offsets"].dtype == np.int32
    cut = merging.split(merged, [2, 1, 0])
    for part, own in zip(cut, parts, strict=True):
        assert part.keys() == own.keys()
        for name in own:
            np.testing.assert_array_equal(part[name], own[name], err_msg=name)
            assert part[name].dtype == own[name].dtype
    assert merging.split(merged, [1, 1]) is None  # another number of rows: answered one by one


def test_model_options_reject_nonsense_batching():
    with pytest.raises(ValueError, match="max_batch_rows must be at least 1, got 0"):
        ModelOptions(max_batch_rows=0)
    with pytest.raises(ValueError, match="max_queue_delay_us must be 0 or more, got -1"):
        ModelOptions(max_queue_delay_us=-1)


@pytest.fixture(scope="module")
def batched_exports(toy_workflow, toy_model, tmp_path_factory):
    repository = tmp_path_factory.mktemp("batched")
    options = ModelOptions(batching=True, max_batch_rows=512, max_queue_delay_us=100)
    for backend in ("python", "pytorch"):
        graph = toy_session.session_graph(toy_workflow, toy_model, backend=backend)
        Ensemble(graph, toy_workflow.input_schema).export(repository, backend, options=options)
    return repository


def test_batched_configs(batched_exports):
    step = configs.from_pbtxt(
        (
            batched_exports / "python-0-transformworkflow_predictpytorch_topk" / "config.pbtxt"
        ).read_text()
    )
    assert step.max_batch_size == 512
    assert step.dynamic_batching.max_queue_delay_microseconds == 100
    assert all(tensor.allow_ragged_batch for tensor in step.input)
    assert not step.model_warmup  # the stub warms up itself
    assert json.loads(step.parameters[configs.WARMUP_PARAMETER].string_value)["count"] == 3
    for name in ("python", "pytorch"):
        ensemble = configs.from_pbtxt((batched_exports / name / "config.pbtxt").read_text())
        assert ensemble.max_batch_size == 0
        assert all(t.dims[0] == 1 for t in [*ensemble.input, *ensemble.output])
        assert ensemble.parameters[configs.REQUEST_DIM_PARAMETER].string_value == "true"
    libtorch = configs.from_pbtxt(
        (batched_exports / "pytorch-1-predictpytorch_topk" / "config.pbtxt").read_text()
    )
    assert libtorch.max_batch_size == 512
    assert libtorch.dynamic_batching.max_queue_delay_microseconds == 100
    assert all(tensor.allow_ragged_batch for tensor in libtorch.input)
    assert configs.ROWS_TENSOR in [tensor.name for tensor in libtorch.input]
    assert all(len(tensor.dims) == 1 for tensor in libtorch.input)  # flat, as they are batched
    # Triton counts each input's elements per request, and cuts each output back per request
    assert {(tuple(b.target_name), tuple(b.source_input)) for b in libtorch.batch_input} == {
        ((tensor.name + configs.COUNT_SUFFIX,), (tensor.name,)) for tensor in libtorch.input
    }
    assert sorted(name for out in libtorch.batch_output for name in out.target_name) == sorted(
        tensor.name for tensor in libtorch.output
    )
    assert all(list(out.source_input) == [configs.ROWS_TENSOR] for out in libtorch.batch_output)
    assert configs.ROWS_TENSOR in libtorch.model_warmup[0].inputs
    feeding = configs.from_pbtxt(
        (batched_exports / "pytorch-0-transformworkflow" / "config.pbtxt").read_text()
    )
    [step_0, step_1] = configs.from_pbtxt(
        (batched_exports / "pytorch" / "config.pbtxt").read_text()
    ).ensemble_scheduling.step
    # the libtorch step reads the rows and every tensor it reads padded, from the step before it
    sent = {step_0.output_map[tensor.name] for tensor in feeding.output}
    assert {step_1.input_map[tensor.name] for tensor in libtorch.input} <= sent
    assert step_1.input_map[configs.ROWS_TENSOR] == step_0.output_map[configs.ROWS_TENSOR]
    assert all(
        step_1.input_map[name].endswith(configs.PADDED_SUFFIX)
        for name in step_1.input_map
        if name != configs.ROWS_TENSOR
    )


def test_merged_offsets_shift_each_request_by_the_values_before_it():
    # three requests: rows [2, 0, 1] holding 3, 0 and 2 values
    flat = torch.tensor([0, 1, 3, 0, 0, 2], dtype=torch.int32)
    merged = _merged_offsets(flat, torch.tensor([2, 0, 1]))
    assert merged.tolist() == [0, 1, 3, 5]
    assert merged.dtype == torch.int32
    assert _merged_offsets(torch.tensor([0, 0]), torch.tensor([0, 0])).tolist() == [0]


def test_a_libtorch_step_answers_a_batch_as_it_answers_each_request(batched_exports):
    """The merged module, given what Triton hands it for a batch, answers each request's rows as
    the step's own module answers that request alone."""
    feeding = HostedStep.load(str(batched_exports / "pytorch-0-transformworkflow" / "1"))
    merged = torch.jit.load(
        str(batched_exports / "pytorch-1-predictpytorch_topk" / "1" / configs.LIBTORCH_MODEL_FILE)
    )
    rows = toy_session.interactions(n_sessions=9, seed=5)
    sessions = rows.session_id.unique()
    requests = [
        feeding.run({spec.name: part[spec.name].to_numpy() for spec in feeding.input_specs})
        for part in (
            rows[rows.session_id.isin(sessions[:1])],
            rows[rows.session_id.isin(sessions[1:8])],
            rows.iloc[:0],  # no clicks: no rows
            rows[rows.session_id.isin(sessions[8:])],
        )
    ]
    inputs = [
        {spec.name: request[spec.name] for spec in wire.schema_specs(feeding.output_schema)}
        for request in requests
    ]

    with torch_threads(SERVED_TORCH_THREADS), torch.inference_mode():
        batch = {n: torch.from_numpy(a) for n, a in flat_batch(inputs).items()}
        ids, scores = merged(batch)
        alone = [merged.inner({n: torch.from_numpy(a) for n, a in i.items()}) for i in inputs]

        for one, own in zip(inputs, alone, strict=True):  # a batch of one request
            batch = {n: torch.from_numpy(a) for n, a in flat_batch([one]).items()}
            assert all(torch.equal(got, want) for got, want in zip(merged(batch), own, strict=True))

    bounds = np.cumsum([0] + [merging.rows(request) for request in inputs])
    assert bounds.tolist() == [0, 1, 8, 8, 9]
    for (own_ids, own_scores), start, stop in zip(alone, bounds[:-1], bounds[1:], strict=True):
        assert torch.equal(ids[start:stop], own_ids)
        torch.testing.assert_close(scores[start:stop], own_scores, rtol=1e-6, atol=0)


def test_a_step_answers_a_batch_as_it_answers_each_request(batched_exports, toy_workflow):
    step_dir = batched_exports / "python-0-transformworkflow_predictpytorch_topk"
    config = configs.from_pbtxt((step_dir / "config.pbtxt").read_text())
    sample = read_warmup_files(
        str(step_dir / WARMUP_DIR),
        json.loads(config.parameters[configs.WARMUP_PARAMETER].string_value)["inputs"],
    )
    step = HostedStep.load(str(step_dir / "1"), max_batch_rows=512)
    assert step.merge_keys == ["session_id"]
    rows = toy_session.interactions(n_sessions=9, seed=4)
    requests = [
        {name: rows[rows.session_id == session][name].to_numpy() for name in sample}
        for session in rows.session_id.unique()
    ]
    requests.append({name: array[:0] for name, array in requests[0].items()})  # no clicks
    requests.append(requests[2])  # the same session again: a run of its own
    bad = dict(requests[1], item_id=requests[1]["item_id"][:-1])  # one click short in one column
    batch = requests + [bad]

    with torch_threads(SERVED_TORCH_THREADS):  # as the stub runs it
        answers = step.run_batch(batch)
        alone = [step.run(request) for request in requests]
        # the distinct sessions (all but the repeated one) ran as one merged run
        merged = step.run(
            {name: np.concatenate([r[name] for r in requests[:-1]]) for name in sample}
        )

    assert "input column 'item_id'" in str(answers[-1])  # the bad request failed alone
    bounds = np.cumsum([0] + [len(np.unique(r["session_id"])) for r in requests[:-1]])
    for i, (answer, own) in enumerate(zip(answers[:-1], alone, strict=True)):
        assert answer.keys() == own.keys()
        np.testing.assert_array_equal(answer["session_id"], own["session_id"])
        np.testing.assert_array_equal(answer["item_ids"], own["item_ids"])
        # this toy model sums its positions with a kernel whose order depends on the batch's
        # shape, so its scores may differ from a lone run in the last bit (XLNet's do not; see
        # tests/integration/test_batching.py); from the merged run, not at all
        np.testing.assert_allclose(answer["item_scores"], own["item_scores"], rtol=1e-6)
        if i < len(requests) - 1:
            for name in own:
                np.testing.assert_array_equal(
                    answer[name], merged[name][bounds[i] : bounds[i + 1]], err_msg=name
                )


def test_a_libtorch_step_that_reads_the_request_answers_alone_and_the_export_says_so(
    toy_model, tmp_path
):
    from merlin_torch_serving import PredictPytorch

    scripted, input_schema, output_schema = toy_model
    graph = input_schema.column_names >> PredictPytorch(
        scripted, input_schema, output_schema, backend="pytorch"
    )
    result = Ensemble(graph, input_schema).export(
        tmp_path, "direct", options=ModelOptions(batching=True)
    )

    [warning] = result.warnings
    assert "'direct-0-predictpytorch' answers one request at a time" in warning
    assert "its inputs do not all come from one python step" in warning
    config = configs.from_pbtxt((tmp_path / "direct-0-predictpytorch" / "config.pbtxt").read_text())
    assert config.max_batch_size == 0
    assert not config.batch_input
    assert all(t.dims[0] == 1 for t in [*config.input, *config.output])  # the batched form
