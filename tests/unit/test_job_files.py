"""Job files write their outputs under their own folder, through new files that follow no link."""

import os

from sparkml_dist.job_files import resolve_paths, write_new


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
    assert (tmp_path / "out").is_dir() and job["output"]["model_path"] == "out/model"  # input untouched


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
