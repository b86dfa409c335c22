"""The folder of parquet files: journals published whole when big or old, readable while written,
a torn flush left out, the journals of a killed process published once by the next writer, and a
full disk (a real tmpfs) that drops and counts answers without failing one."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pyarrow.parquet as pq

from merlin_torch_serving import ParquetFolder, read_answers
from merlin_torch_serving.answer_log import journal, records
from merlin_torch_serving.answer_log.parquet_sink import FolderSink
from merlin_torch_serving.answer_log.writer import AnswerWriter
from merlin_torch_serving.client.health import folder_error
from tests import toy_session
from tests.answer_logs import (
    fill,
    folder_files,
    logged_routed,
    small_filesystem,
    wait_until,
)
from tests.answer_logs import made_up_answers as answers


def test_a_journal_is_published_as_a_parquet_file_once_it_reaches_its_size(tmp_path):
    writer = AnswerWriter(ParquetFolder(tmp_path, rotate_bytes=1), flush_interval_s=0.05)
    for first in (100, 200, 300):
        writer.submit(answers(first))
        assert writer.flush(timeout_s=30)
    writer.close()

    published = [name for name in folder_files(tmp_path) if name.endswith(".parquet")]
    assert len(published) == 3
    assert folder_files(tmp_path) == published
    assert sorted(read_answers(tmp_path)["session_id"]) == [
        s for first in (100, 200, 300) for s in range(first, first + 4)
    ]


def test_a_journal_is_published_once_old_enough_without_new_answers(tmp_path):
    writer = AnswerWriter(ParquetFolder(tmp_path, rotate_after_s=0.3), flush_interval_s=0.05)
    writer.submit(answers(100))
    # published, and the journal removed after, by the writer's own clock
    wait_until(lambda: [name[-8:] for name in folder_files(tmp_path)] == [".parquet"])
    writer.close()
    assert len(read_answers(tmp_path)) == 4


def test_the_log_reads_whole_and_once_while_it_is_written_and_published(tmp_path):
    writer = AnswerWriter(ParquetFolder(tmp_path, rotate_bytes=6000), flush_interval_s=0.05)
    stop = threading.Event()

    def write():
        first = 0
        while not stop.is_set():
            writer.submit(answers(first))
            first += 4
            time.sleep(0.01)

    thread = threading.Thread(target=write)
    thread.start()
    seen = []
    try:
        wait_until(lambda: len(os.listdir(tmp_path)) > 0)
        for _ in range(15):
            for path in tmp_path.glob("answers-*.parquet"):
                pq.read_table(path)  # every published file is whole
            sessions = read_answers(tmp_path)["session_id"].to_numpy()
            assert len(np.unique(sessions)) == len(sessions)  # no record twice
            seen.append(len(sessions))
            time.sleep(0.05)
    finally:
        stop.set()
        thread.join()
    writer.close()
    assert seen == sorted(seen)
    assert seen[-1] > seen[0]
    assert len(list(tmp_path.glob("answers-*.parquet"))) > 2
    final = read_answers(tmp_path)["session_id"]
    assert sorted(final) == list(range(len(final)))


def test_a_torn_flush_at_the_end_of_a_journal_is_left_out(tmp_path):
    path = tmp_path / f"_open-x{journal.SUFFIX}"
    written = journal.Journal(str(path))
    written.append(records.to_table([answers(100)]))
    written.append(records.to_table([answers(200)]))
    whole = path.stat().st_size
    written.close()
    with open(path, "r+b") as file:  # as a process killed halfway through its third flush leaves it
        file.truncate(whole - 10)

    tables = list(journal.read_frames(str(path)))
    assert [table["session_id"].to_pylist() for table in tables] == [[100, 101, 102, 103]]


CHILD = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    from merlin_torch_serving.answer_log import records
    from merlin_torch_serving.answer_log.destinations import ParquetFolder
    from merlin_torch_serving.answer_log.writer import AnswerWriter

    class Columns:
        def __init__(self, values):
            self.values, self.offsets = values, None

    def answers(first):
        ids = np.arange(12, dtype=np.int64).reshape(4, 3) + first
        sessions = np.arange(first, first + 4)
        return records.taken(None, None, None, sessions, Columns(ids), Columns(ids / 7.0))

    writer = AnswerWriter(ParquetFolder(sys.argv[1]), flush_interval_s=0.05)
    writer.submit(answers(100))
    writer.submit(answers(200))
    writer.flush(30)
    print("flushed", flush=True)
    writer.submit(answers(300))  # the last flush interval: lost with the process
    time.sleep(600)
    """
)


def test_the_journal_of_a_killed_process_is_published_once_by_the_next_writer(tmp_path):
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "flushed"
        child.send_signal(signal.SIGKILL)
        child.wait(30)
    finally:
        child.kill()
        child.wait(30)
        child.stdout.close()
    (orphan,) = tmp_path.glob(f"_open-*{journal.SUFFIX}")
    kept = tmp_path / "kept"
    shutil.copy(orphan, kept)

    FolderSink(ParquetFolder(tmp_path))  # publishes what the killed process left
    assert sorted(read_answers(tmp_path)["session_id"]) == list(range(100, 104)) + list(
        range(200, 204)
    )
    # killed between publishing the file and removing the journal: found again, not published twice
    shutil.move(kept, orphan)
    assert FolderSink(ParquetFolder(tmp_path)).recover() == 0
    assert len(read_answers(tmp_path)) == 8
    assert not list(tmp_path.glob(f"_open-*{journal.SUFFIX}"))


def test_a_journal_that_a_live_writer_holds_is_not_taken_over(tmp_path):
    writer = AnswerWriter(ParquetFolder(tmp_path), flush_interval_s=0.05)
    writer.submit(answers(100))
    assert writer.flush(timeout_s=30)
    assert FolderSink(ParquetFolder(tmp_path)).recover() == 0
    writer.close()
    assert len(read_answers(tmp_path)) == 4


def test_a_full_disk_drops_and_counts_answers_fails_no_request_and_writing_resumes_once_freed(
    tmp_path, toy_workflow, toy_model
):
    with small_filesystem(tmp_path / "small", "1m") as small:
        folder = small / "log"
        ensemble, log = logged_routed(
            toy_workflow, toy_model, ParquetFolder(folder), flush_interval_s=0.05, max_pending=30
        )
        request = toy_session.interactions(10, seed=4)
        ensemble.transform(request)
        assert log.flush(timeout_s=30)
        assert folder_error(str(folder)) == ""
        filler = fill(small)

        answered = [ensemble.transform(request) for _ in range(6)]  # 60 sessions, 30 fit the queue
        wait_until(lambda: log.status().failing)
        status = log.status()
        assert all(len(answer) == 10 for answer in answered)
        assert status.dropped == 30
        assert status.pending == 30
        assert "No space left on device" in status.error
        assert "is full" in folder_error(str(folder))

        filler.unlink()
        assert log.flush(timeout_s=30)
        assert not log.status().failing
        log.close()
        assert len(read_answers(folder)) == 10 + 30
