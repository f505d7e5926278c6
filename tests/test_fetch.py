"""`inferentia-operator fetch`, the serving pods' init container, against moto's in-memory S3."""

import boto3
import pytest
from moto import mock_aws

from inferentia_operator import cli
from inferentia_operator.fetch import FetchError, fetch, split_s3_uri


@pytest.fixture
def s3(monkeypatch):
    for key, value in {"AWS_ACCESS_KEY_ID": "t", "AWS_SECRET_ACCESS_KEY": "t", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws():
        client = boto3.client("s3")
        client.create_bucket(Bucket="models")
        yield client


def test_fetch_copies_every_object_under_the_prefix_keeping_its_path(s3, tmp_path):
    s3.put_object(Bucket="models", Key="m-neuron/abc/model.neff", Body=b"neff")
    s3.put_object(Bucket="models", Key="m-neuron/abc/buckets/64.neff", Body=b"64")
    s3.put_object(Bucket="models", Key="m-neuron/other/model.neff", Body=b"not this one")
    written = fetch("s3://models/m-neuron/abc/", tmp_path)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in written) == ["buckets/64.neff", "model.neff"]
    assert (tmp_path / "model.neff").read_bytes() == b"neff"


def test_a_key_that_would_escape_the_directory_is_never_written(s3, tmp_path):
    s3.put_object(Bucket="models", Key="p/../../etc/evil", Body=b"x")
    s3.put_object(Bucket="models", Key="p/ok", Body=b"ok")
    assert [p.name for p in fetch("s3://models/p/", tmp_path / "out")] == ["ok"]
    assert not (tmp_path / "etc").exists()


def test_no_artefact_and_bad_uris_end_with_a_message_not_a_traceback(s3, tmp_path, capsys):
    assert cli.main(["fetch", "--from", "s3://models/nothing/", "--to", str(tmp_path)]) == 1
    assert "no compiled artefact under s3://models/nothing/" in capsys.readouterr().err
    assert cli.main(["fetch", "--from", "s3://no-such-bucket/x/", "--to", str(tmp_path)]) == 1
    assert "NoSuchBucket" in capsys.readouterr().err
    with pytest.raises(FetchError, match="is not an s3:// URI"):
        split_s3_uri("https://example.com/model")
