"""Job files write their outputs under their own folder, through new files that follow no link;
a failed job leaves no output behind."""

import os

from sparkml_dist.cli.job_files import load_job, new_paths, remove_new, resolve_paths
from sparkml_dist.formats.files import write_new


def test_relative_paths_are_taken_from_the_job_files_folder(tmp_path):
    job = {
        "input": {"path": "data/train.parquet"},
        "output": {
            "model_path": "out/model",
            "results_csv": "out/r.csv",
            "remote": "s3://b/x",
            "abs": "/x/y",
        },
    }
    got = resolve_paths(job, str(tmp_path))
    assert got["input"]["path"] == str(tmp_path / "data" / "train.parquet")
    assert got["output"]["model_path"] == str(tmp_path / "out" / "model")
    assert got["output"]["results_csv"] == str(tmp_path / "out" / "r.csv")
    assert got["output"]["remote"] == "s3://b/x" and got["output"]["abs"] == "/x/y"
    assert job["output"]["model_path"] == "out/model"  # the job given is untouched
    assert not (tmp_path / "out").exists()  # nothing is made before the job runs


def test_an_output_path_planted_as_a_link_is_replaced_not_followed(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    target = tmp_path / "results.csv"
    os.symlink(victim, target)
    write_new(str(target), b"a,b\n1,2\n")
    assert victim.read_text() == "keep me"
    assert not target.is_symlink() and target.read_bytes() == b"a,b\n1,2\n"
    write_new(str(target), b"again")  # overwriting a regular file works too
    assert target.read_bytes() == b"again" and sorted(p.name for p in tmp_path.iterdir()) == [
        "results.csv",
        "victim.txt",
    ]


def test_what_a_failed_job_made_is_removed_and_what_was_there_stays(tmp_path):
    (tmp_path / "data.csv").write_text("a,label\n1,0\n")
    (tmp_path / "kept").mkdir()
    (tmp_path / "job.yaml").write_text(
        "input: {path: data.csv}\noutput: {model_path: out/model, results_csv: out/r.csv, old: kept}\n"
    )
    job, base = load_job(str(tmp_path / "job.yaml"))
    assert base == str(tmp_path) and job["input"]["path"] == str(tmp_path / "data.csv")
    fresh = new_paths(job)
    assert fresh == [str(tmp_path / "out")]
    write_new(job["output"]["results_csv"], b"half")  # the folder is made when the file is written
    os.makedirs(job["output"]["model_path"])
    remove_new(fresh)
    assert not (tmp_path / "out").exists()  # not even the empty folder
    assert (tmp_path / "kept").is_dir()
