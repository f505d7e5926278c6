import sys
from pathlib import Path

import pytest

# Test helpers (specs.py, e2e/kit.py) import by their own names, and so do the local
# cluster's modules (ports.py for free ports, localcluster.py).
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(1, str(Path(__file__).parent.parent / "cluster"))


@pytest.fixture
def s3(monkeypatch):
    """moto's in-memory S3 with the bucket ``models``, for fetch and upload."""
    import boto3
    from moto import mock_aws

    for key, value in {"AWS_ACCESS_KEY_ID": "t", "AWS_SECRET_ACCESS_KEY": "t", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws():
        client = boto3.client("s3")
        client.create_bucket(Bucket="models")
        yield client
