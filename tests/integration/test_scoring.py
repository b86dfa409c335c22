"""Batch scoring on a local Dask cluster of two worker processes, against the same exports served
on the real tritonserver: every session's answer equals the served answer and the in-process
answer bit for bit (unknown items, one-click sessions a filter drops, sessions split between
input files, clicks at the same time), however the input or the client's requests are cut; a
ranking ensemble's answers come row by row per input partition; the ensemble is loaded once per
worker; a worker killed mid-run costs nothing but time; a rerun scores only what is missing;
changed files and another run's answers are refused.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path

import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest

from examples.session_based.demo import recommendation_graph
from merlin_torch_serving import (
    ArtifactError,
    Client,
    DecodeItemIds,
    Ensemble,
    PredictPytorch,
    ScoringError,
    TopK,
    TransformWorkflow,
    score_dataset,
)
from merlin_torch_serving.cli import main
from merlin_torch_serving.scoring import worker
from tests import scoring_data, toy_session
from tests.session_models import SERVED_TORCH_THREADS, request_rows, torch_threads

pytestmark = pytest.mark.integration

#: about 10 partitions of the toy clicks, so that both workers score several
PARTITION_ROWS = 60


@dataclass(frozen=True)
class Served:
    """An ensemble exported into the shared server's repository and loaded there."""

    name: str
    ensemble: Ensemble
    repository: Path
    clicks: pd.DataFrame  # rows to score, shuffled, with unknown items and one-click sessions


@pytest.fixture(scope="module")
def dask_client():
    from distributed import Client as DaskClient
    from distributed import LocalCluster

    environment = dict(os.environ)
    try:
        with (
            LocalCluster(
                n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
            ) as cluster,
            DaskClient(cluster) as client,
        ):
            yield client
    finally:  # the nannies set their workers' variables in this process, for later tests too
        os.environ.clear()
        os.environ.update(environment)


@pytest.fixture(scope="module")
def toy(triton_server, filtered_toy_workflow) -> Served:
    """The filtered toy graph on the python backend, with raw item ids decoded."""
    workflow = filtered_toy_workflow
    scripted, input_schema, output_schema = toy_session.scripted_model(workflow)
    features = workflow.input_schema.column_names >> TransformWorkflow(workflow)
    top = (
        features
        >> PredictPytorch(scripted, input_schema, output_schema, backend="python")
        >> TopK(3, seen_items=features["item_id-list"], exclude_ids=[0, 1, 2])
        >> DecodeItemIds(workflow, source_column="item_id")
    )
    ensemble = Ensemble(features["session_id"] + top, workflow.input_schema)
    ensemble.export(triton_server.repository, "scored-toy")
    triton_server.load("scored-toy")
    return Served("scored-toy", ensemble, Path(triton_server.repository), scoring_data.clicks())


@pytest.fixture(scope="module")
def xlnet_mixed(triton_server, pytorch_backend, session_workflow, xlnet, session_split) -> Served:
    """The example's XLNet, TopK and decoding compiled into a libtorch step."""
    graph = recommendation_graph(session_workflow, xlnet.served, backend="pytorch")
    ensemble = Ensemble(graph, session_workflow.input_schema)
    ensemble.export(triton_server.repository, "scored-xlnet")
    triton_server.load("scored-xlnet")
    _, held_out = session_split
    rows = request_rows(held_out, 150, seed=29)
    return Served("scored-xlnet", ensemble, Path(triton_server.repository), rows)


@pytest.fixture(scope="module")
def toy_output(toy, dask_client, tmp_path_factory) -> Path:
    """The toy clicks, cut into four parquet files, scored once."""
    folder = tmp_path_factory.mktemp("scored_toy")
    clicks = scoring_data.write_split(toy.clicks, folder / "clicks", files=4)
    score_dataset(
        toy.repository,
        clicks,
        folder / "answers",
        name=toy.name,
        client=dask_client,
        partition_rows=PARTITION_ROWS,
        progress=False,
    )
    return folder / "answers"


@pytest.mark.parametrize("served_name", ["toy", "xlnet_mixed"])
def test_scored_answers_equal_served_and_in_process_answers_bit_for_bit(
    request, served_name, dask_client, triton_server, tmp_path
):
    served: Served = request.getfixturevalue(served_name)
    clicks = scoring_data.write_split(served.clicks, tmp_path / "clicks", files=3)

    result = score_dataset(
        served.repository,
        clicks,
        tmp_path / "answers",
        name=served.name,
        client=dask_client,
        partition_rows=len(served.clicks) // 5,
        progress=False,
    )
    scored = scoring_data.read_answers(tmp_path / "answers")

    with Client(triton_server.grpc_url) as client:
        answered = scoring_data.in_session_order(client.infer(served.name, served.clicks))
    with torch_threads(SERVED_TORCH_THREADS):
        in_process = scoring_data.in_session_order(served.ensemble.transform(served.clicks))
    scoring_data.assert_same_answers(scored, answered)
    scoring_data.assert_same_answers(scored, in_process)
    assert result.sessions == served.clicks["session_id"].nunique() == len(scored)
    assert (result.scored, result.skipped) == (result.partitions, 0)
    assert result.partitions >= 5


def test_a_ranking_ensemble_answers_each_input_partition_row_by_row_as_the_server(
    ranking, dask_client, triton_server, tmp_path
):
    from examples.ranking import data
    from examples.ranking.demo import scoring_graph

    ensemble = Ensemble(
        scoring_graph(ranking.workflow, ranking.model, backend="python"),
        ranking.workflow.input_schema,
    )
    ensemble.export(triton_server.repository, "scored-ranking")
    triton_server.load("scored-ranking")
    rows = ranking.held_out.drop(columns=[data.LABEL_COLUMN]).head(900).reset_index(drop=True)
    rows.loc[:4, "user_age"] = np.nan  # missing values, as the server takes them
    partitions = dd.from_pandas(rows, npartitions=3)

    result = score_dataset(
        Path(triton_server.repository),
        partitions,
        tmp_path / "answers",
        name="scored-ranking",
        client=dask_client,
        batch_sessions=256,
        progress=False,
    )

    assert (result.partitions, result.sessions) == (3, len(rows))  # one part per input partition
    with Client(triton_server.grpc_url) as client:
        for number, part in enumerate(sorted((tmp_path / "answers").glob("part-*.parquet"))):
            # this model's float sums depend on how many rows a product holds: the server answers
            # the same bits to requests of the same rows as the runs of the scoring
            rows_of_part = partitions.get_partition(number).compute()
            served = pd.concat(
                [
                    client.infer("scored-ranking", rows_of_part.iloc[start : start + 256])
                    for start in range(0, len(rows_of_part), 256)
                ],
                ignore_index=True,
            )
            scoring_data.assert_same_answers(pd.read_parquet(part), served)  # in input order


def test_clicks_at_the_same_time_answer_as_the_whole_request_however_client_or_score_cut_it(
    toy, dask_client, triton_server, tmp_path
):
    # most clicks share their timestamp with another of their session: each session's answer must
    # depend on its own clicks in their order only, whichever sessions share a request or partition
    clicks = toy_session.tied_interactions(150, seed=11, first_session=40_000)
    clicks = clicks.sample(frac=1.0, random_state=11).reset_index(drop=True)
    with torch_threads(SERVED_TORCH_THREADS):
        whole = scoring_data.in_session_order(toy.ensemble.transform(clicks))

    for max_rows in (9, 40, 230):
        with Client(triton_server.grpc_url, max_rows_per_request=max_rows) as client:
            answered = client.infer(toy.name, clicks)
        scoring_data.assert_same_answers(scoring_data.in_session_order(answered), whole)
    for files, partition_rows in ((3, 35), (1, 300)):
        folder = tmp_path / f"{files}-{partition_rows}"
        score_dataset(
            toy.repository,
            scoring_data.write_split(clicks, folder / "clicks", files=files),
            folder / "answers",
            name=toy.name,
            client=dask_client,
            partition_rows=partition_rows,
            progress=False,
        )
        scoring_data.assert_same_answers(scoring_data.read_answers(folder / "answers"), whole)


def test_one_click_sessions_and_unknown_items_are_answered_as_the_server_answers_them(
    toy, toy_output
):
    scored = scoring_data.read_answers(toy_output)
    clicks_per_session = toy.clicks.groupby("session_id").size()
    one_click = clicks_per_session.index[clicks_per_session == 1]
    filtered = scored.set_index("session_id")["filtered_out"]
    assert filtered[one_click].all()
    assert not filtered.drop(one_click).any()
    for ids, scores in scored.loc[scored["filtered_out"], ["item_ids", "item_scores"]].values:
        assert (ids == -1).all()
        assert pd.isna(scores).all()
    unknown = toy.clicks.loc[toy.clicks["item_id"] == scoring_data.UNKNOWN_ITEM_ID, "session_id"]
    answered = scored[scored["session_id"].isin(unknown) & ~scored["filtered_out"]]
    assert len(answered) > 10
    assert scoring_data.all_unknown_session(toy.clicks) in set(answered["session_id"])
    for ids, scores in answered[["item_ids", "item_scores"]].values:  # recommendations all the same
        assert set(ids) <= set(range(500, 500 + toy_session.N_ITEMS))  # the catalog's raw ids
        assert np.isfinite(scores).all()


def test_an_input_without_rows_gives_one_part_without_rows_and_the_served_columns(
    toy, toy_output, dask_client, tmp_path
):
    result = score_dataset(
        toy.repository,
        toy.clicks.iloc[:0],
        tmp_path / "answers",
        name=toy.name,
        client=dask_client,
        progress=False,
    )

    [part] = (tmp_path / "answers").glob("part-*.parquet")
    empty, scored = pd.read_parquet(part), pd.read_parquet(next(toy_output.glob("part-*")))
    assert (result.partitions, result.sessions, len(empty)) == (1, 0, 0)
    assert empty.dtypes.to_dict() == scored.dtypes.to_dict()


def test_answers_do_not_depend_on_how_the_input_was_partitioned(
    toy, toy_output, dask_client, tmp_path
):
    for partitions in (1, 9):
        output = tmp_path / f"from_{partitions}"
        score_dataset(
            toy.repository,
            dd.from_pandas(toy.clicks, npartitions=partitions),
            output,
            name=toy.name,
            client=dask_client,
            partition_rows=PARTITION_ROWS,
            progress=False,
        )
        parts = sorted(path.name for path in toy_output.glob("part-*.parquet"))
        assert sorted(path.name for path in output.glob("part-*.parquet")) == parts
        for part in parts:
            pd.testing.assert_frame_equal(
                pd.read_parquet(output / part), pd.read_parquet(toy_output / part)
            )


def test_each_worker_loads_the_ensemble_once_for_all_its_partitions(toy, dask_client, tmp_path):
    # a copy is another repository path, so every worker loads it anew
    repository = tmp_path / "repository"
    shutil.copytree(toy.repository / toy.name, repository / toy.name)
    for model in toy_models(toy):
        shutil.copytree(toy.repository / model, repository / model)
    before = dask_client.run(worker.loads)

    result = score_dataset(
        repository,
        toy.clicks,
        tmp_path / "answers",
        client=dask_client,
        partition_rows=PARTITION_ROWS // 2,
        progress=False,
    )

    after = dask_client.run(worker.loads)
    assert result.scored >= 8
    assert {address: after[address] - before[address] for address in after} == dict.fromkeys(
        after, 1
    )


def test_a_worker_killed_mid_run_leaves_the_same_output(toy, toy_output, dask_client, tmp_path):
    pids = dask_client.run(os.getpid)
    killed = []

    def kill_a_worker(progress) -> None:
        if not killed and 0 < progress.done < progress.partitions:  # once a part is written
            victim = next(iter(pids.values()))
            os.kill(victim, signal.SIGKILL)
            killed.append((victim, progress.done))

    result = score_dataset(
        toy.repository,
        toy.clicks,
        tmp_path / "answers",
        name=toy.name,
        client=dask_client,
        partition_rows=PARTITION_ROWS,
        progress=kill_a_worker,
    )

    assert killed
    assert killed[0][1] < result.partitions  # killed with partitions left to score
    assert result.scored == result.partitions
    parts = sorted(path.name for path in toy_output.glob("part-*.parquet"))
    assert sorted(path.name for path in (tmp_path / "answers").iterdir() if path.is_file()) == [
        "_scoring.json",
        *parts,
    ]
    for part in parts:
        pd.testing.assert_frame_equal(
            pd.read_parquet(tmp_path / "answers" / part), pd.read_parquet(toy_output / part)
        )
    dask_client.wait_for_workers(2, timeout=120)  # the nanny restarts it, for the next tests


def test_a_rerun_scores_only_the_partitions_missing(toy, toy_output, dask_client, tmp_path):
    output = tmp_path / "answers"
    shutil.copytree(toy_output, output)
    parts = sorted(output.glob("part-*.parquet"))
    written = {path.name: path.stat().st_mtime_ns for path in parts}
    parts[1].unlink()
    progress = []

    result = score_dataset(
        toy.repository,
        toy.clicks,
        output,
        name=toy.name,
        client=dask_client,
        partition_rows=PARTITION_ROWS,
        progress=progress.append,
    )

    assert (result.scored, result.skipped) == (1, len(parts) - 1)
    assert result.sessions == toy.clicks["session_id"].nunique()
    assert [state.done for state in progress] == [len(parts) - 1, len(parts)]
    assert (
        progress[0].line()
        == f"1 of {len(parts)} partitions to score, {len(parts) - 1} kept from an earlier run"
    )
    for path in parts:
        if path != parts[1]:
            assert path.stat().st_mtime_ns == written[path.name], path.name  # kept as it was
    pd.testing.assert_frame_equal(
        pd.read_parquet(parts[1]), pd.read_parquet(toy_output / parts[1].name)
    )


def test_a_repository_whose_files_changed_is_refused(toy, dask_client, tmp_path):
    repository = tmp_path / "repository"
    for model in [toy.name, *toy_models(toy)]:
        shutil.copytree(toy.repository / model, repository / model)
    [workflow_file] = repository.glob("*/1/ops/0/workflow/workflow.pkl")
    workflow_file.write_bytes(workflow_file.read_bytes()[:-1])

    with pytest.raises(ArtifactError, match=r"workflow\.pkl' has sha256 .* changed or replaced"):
        score_dataset(repository, toy.clicks, tmp_path / "answers", client=dask_client)
    assert not (tmp_path / "answers").exists()


def test_answers_of_another_input_are_refused_unless_overwritten(
    toy, toy_output, dask_client, tmp_path
):
    output = tmp_path / "answers"
    shutil.copytree(toy_output, output)
    fewer = toy.clicks[toy.clicks["session_id"] != toy.clicks["session_id"].iloc[0]]
    arguments = {"name": toy.name, "client": dask_client, "partition_rows": PARTITION_ROWS}

    with pytest.raises(ScoringError, match=r"overwrite=True .*another input"):
        score_dataset(toy.repository, fewer, output, progress=False, **arguments)
    result = score_dataset(
        toy.repository, fewer, output, overwrite=True, progress=False, **arguments
    )
    assert result.skipped == 0
    assert result.sessions == fewer["session_id"].nunique()


def test_an_ensemble_is_exported_into_the_output_and_resumed_from_there(toy, dask_client, tmp_path):
    output = tmp_path / "answers"
    first = score_dataset(toy.ensemble, toy.clicks, output, client=dask_client, progress=False)
    assert Path(first.repository) == output / "_repository"

    with pytest.raises(ScoringError, match=r"resume it with score_dataset\('.*_repository'"):
        score_dataset(toy.ensemble, toy.clicks, output, client=dask_client, progress=False)
    again = score_dataset(first.repository, toy.clicks, output, client=dask_client, progress=False)
    assert (again.scored, again.skipped) == (0, first.partitions)


def test_without_a_client_a_local_cluster_scores_listening_on_loopback_only(
    toy, toy_output, tmp_path
):
    # what `score --workers 2` runs: the scheduler in this process, each worker a child of it
    import psutil

    this = psutil.Process()
    before = dict(os.environ)
    children_before = {child.pid for child in this.children(recursive=True)}
    listening_before = _listening({this.pid})[this.pid]
    seen: dict[int, set] = {}

    def look(progress) -> None:  # before the first partition, with the cluster up, and after each
        cluster = {child.pid for child in this.children(recursive=True)} - children_before
        for pid, addresses in _listening({this.pid} | cluster).items():
            new = addresses - listening_before if pid == this.pid else addresses
            seen.setdefault(pid, set()).update(new)

    result = score_dataset(
        toy.repository,
        toy.clicks,
        tmp_path / "answers",
        name=toy.name,
        workers=2,
        partition_rows=PARTITION_ROWS,
        progress=look,
    )

    assert dict(os.environ) == before  # the nannies set OMP_NUM_THREADS=1, ... in this process
    assert result.sessions == toy.clicks["session_id"].nunique()
    scoring_data.assert_same_answers(
        scoring_data.read_answers(tmp_path / "answers"), scoring_data.read_answers(toy_output)
    )
    # the scheduler and both workers were seen listening, and nothing of them beyond loopback
    assert len([pid for pid, addresses in seen.items() if addresses]) == 3, seen
    beyond = {
        pid: sorted(a for a in addresses if not ipaddress.ip_address(a.ip).is_loopback)
        for pid, addresses in seen.items()
    }
    assert {pid: addresses for pid, addresses in beyond.items() if addresses} == {}


def _listening(pids: set) -> dict[int, set]:
    """pid -> the TCP addresses it listens on, for each of ``pids``."""
    import psutil

    found: dict[int, set] = {pid: set() for pid in pids}
    for socket in psutil.net_connections(kind="tcp"):
        if socket.pid in pids and socket.status == psutil.CONN_LISTEN:
            found[socket.pid].add(socket.laddr)
    return found


def test_the_score_command_shows_progress_and_what_it_wrote(
    toy, toy_output, dask_client, tmp_path, capsys
):
    clicks = scoring_data.write_split(
        toy.clicks.rename(columns={"session_id": "visit"}), tmp_path / "clicks", files=2
    )
    scheduler = dask_client.scheduler.address

    code = main(
        [
            "score",
            str(toy.repository),
            str(clicks),
            str(tmp_path / "answers"),
            "--name",
            toy.name,
            "--scheduler",
            scheduler,
            "--columns",
            "visit=session_id",
            "--partition-rows",
            str(PARTITION_ROWS),
        ]
    )

    out, err = capsys.readouterr()
    partitions = len(list(toy_output.glob("part-*.parquet")))
    sessions = toy.clicks["session_id"].nunique()
    assert code == 0, err
    assert f"scored {partitions}/{partitions} partitions: {sessions:,} sessions" in err
    assert f"wrote {sessions:,} sessions of ensemble 'scored-toy'" in out
    answers = scoring_data.read_answers(tmp_path / "answers", key="visit")
    assert list(answers.columns)[:2] == ["filtered_out", "visit"]  # the caller's name comes back
    assert len(answers) == sessions


def test_the_score_command_refuses_an_output_with_other_files_and_names_a_corrupt_input(
    toy, tmp_path, capsys
):
    clicks = scoring_data.write_split(toy.clicks, tmp_path / "clicks", files=2)
    crowded = tmp_path / "crowded"
    crowded.mkdir()
    pd.DataFrame({"unrelated": range(3)}).to_parquet(crowded / "other.parquet")
    command = ["score", str(toy.repository), str(clicks), "--name", toy.name, "--workers", "1"]

    assert main([*command[:3], str(crowded), *command[3:]]) == 1
    assert "holds 1 entry scoring does not write" in capsys.readouterr().err
    assert sorted(path.name for path in crowded.iterdir()) == ["other.parquet"]

    (clicks / "clicks-1.parquet").write_bytes(b"PAR1 cut short")
    assert main([*command[:3], str(tmp_path / "answers"), *command[3:]]) == 1
    err = capsys.readouterr().err
    assert f"{str(clicks / 'clicks-1.parquet')!r} cannot be scored: its 14 bytes are not" in err
    assert not (tmp_path / "answers").exists()


def toy_models(served: Served) -> list[str]:
    """The step models of ``served``'s export."""
    return [
        path.name for path in served.repository.iterdir() if path.name.startswith(f"{served.name}-")
    ]
