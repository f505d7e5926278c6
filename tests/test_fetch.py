"""`inferentia-operator fetch` and `upload`, the pods' artefact steps, against moto's in-memory S3."""

import pytest

from inferentia_operator import cli
from inferentia_operator.fetch import MARKER, FetchError, fetch, fetch_model, split_s3_uri, upload


def compiled(tmp_path, files: dict[str, bytes]):
    source = tmp_path / "compiled"
    for name, data in files.items():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_bytes(data)
    return source


def test_an_upload_fetches_back_whole_with_its_marker_written_last(s3, tmp_path):
    source = compiled(tmp_path, {"manifest.json": b"{}", "bucket-0.pt": b"neff", "sub/bucket-1.pt": b"64"})
    assert upload(source, "s3://models/m-neuron/abc/") == ["bucket-0.pt", "manifest.json", "sub/bucket-1.pt"]
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="models", Prefix="m-neuron/abc/")["Contents"]]
    assert sorted(keys) == sorted(f"m-neuron/abc/{k}" for k in ["bucket-0.pt", "manifest.json", "sub/bucket-1.pt", MARKER])
    s3.put_object(Bucket="models", Key="m-neuron/abc/stray", Body=b"not named by the marker")
    written = fetch("s3://models/m-neuron/abc/", tmp_path / "out")
    assert sorted(p.relative_to(tmp_path / "out").as_posix() for p in written) == ["bucket-0.pt", "manifest.json", "sub/bucket-1.pt"]
    assert (tmp_path / "out" / "sub" / "bucket-1.pt").read_bytes() == b"64"


def test_an_artefact_without_its_marker_is_refused(s3, tmp_path, capsys):
    """An upload that stopped before its marker is never served."""
    s3.put_object(Bucket="models", Key="half/abc/bucket-0.pt", Body=b"part of it")
    with pytest.raises(FetchError, match="has no completion marker"):
        fetch("s3://models/half/abc/", tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert cli.main(["fetch", "--from", "s3://models/half/abc/", "--to", str(tmp_path / "o")]) == 1
    assert "its upload did not finish" in capsys.readouterr().err


def test_a_file_that_differs_from_its_marker_is_refused(s3, tmp_path):
    upload(compiled(tmp_path, {"bucket-0.pt": b"neff"}), "s3://models/m/abc/")
    s3.put_object(Bucket="models", Key="m/abc/bucket-0.pt", Body=b"overwritten")
    with pytest.raises(FetchError, match="does not match its completion marker"):
        fetch("s3://models/m/abc/", tmp_path / "out")


def test_a_marker_naming_a_path_outside_the_directory_never_writes_there(s3, tmp_path):
    s3.put_object(Bucket="models", Key="p/" + MARKER, Body=b'{"files": {"../../etc/evil": {"size": 1, "sha256": "x"}}}')
    assert fetch("s3://models/p/", tmp_path / "out") == []
    assert not (tmp_path / "etc").exists()


def test_a_model_is_fetched_from_a_prefix_or_one_key_and_never_escapes(s3, tmp_path):
    s3.put_object(Bucket="models", Key="net/model.pt", Body=b"torchscript")
    s3.put_object(Bucket="models", Key="net/../../etc/evil", Body=b"x")
    assert [p.name for p in fetch_model("s3://models/net/", tmp_path / "a")] == ["model.pt"]
    assert [p.name for p in fetch_model("s3://models/net/model.pt", tmp_path / "b")] == ["model.pt"]
    assert not (tmp_path / "etc").exists()
    with pytest.raises(FetchError, match="no model under"):
        fetch_model("s3://models/none/", tmp_path / "c")
    assert cli.main(["fetch", "--model", "--from", "s3://models/net/model.pt", "--to", str(tmp_path / "d")]) == 0


def test_upload_of_nothing_is_an_error_not_an_empty_artefact(s3, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert cli.main(["upload", "--from", str(tmp_path / "empty"), "--to", "s3://models/x/"]) == 1
    assert "the compile step wrote no artefact" in capsys.readouterr().err
    assert "Contents" not in s3.list_objects_v2(Bucket="models", Prefix="x/")


def test_no_artefact_and_bad_uris_end_with_a_message_not_a_traceback(s3, tmp_path, capsys):
    assert cli.main(["fetch", "--from", "s3://models/nothing/", "--to", str(tmp_path)]) == 1
    assert "no compiled artefact under s3://models/nothing/" in capsys.readouterr().err
    assert cli.main(["fetch", "--from", "s3://no-such-bucket/x/", "--to", str(tmp_path)]) == 1
    assert "NoSuchBucket" in capsys.readouterr().err
    with pytest.raises(FetchError, match="is not an s3:// URI"):
        split_s3_uri("https://example.com/model")


def test_a_model_prefix_matches_whole_path_segments_only(s3, tmp_path):
    """s3://models/m once fetched models/m-other/... too: S3's prefix match is by characters."""
    s3.put_object(Bucket="models", Key="m/model.pt", Body=b"mine")
    s3.put_object(Bucket="models", Key="m-other/model.pt", Body=b"someone else's")
    s3.put_object(Bucket="models", Key="m", Body=b"the object itself")
    got = fetch_model("s3://models/m", tmp_path / "a")
    assert sorted(p.relative_to(tmp_path / "a").as_posix() for p in got) == ["m", "model.pt"]
    assert not (tmp_path / "a" / "-other").exists() and b"someone" not in b"".join(p.read_bytes() for p in got)


def test_upload_refuses_a_symlink_that_leads_out_of_its_source(s3, tmp_path):
    secret = tmp_path / "credentials"
    secret.write_text("aws_secret_access_key = x")
    source = compiled(tmp_path, {"model.pt": b"net"})
    (source / "innocent.pt").symlink_to(secret)
    with pytest.raises(FetchError, match="innocent.pt leads outside"):
        upload(source, "s3://models/out/")
    assert "Contents" not in s3.list_objects_v2(Bucket="models", Prefix="out/")
    # A link that stays inside is an ordinary file of the artefact.
    (source / "innocent.pt").unlink()
    (source / "alias.pt").symlink_to(source / "model.pt")
    assert upload(source, "s3://models/out/") == ["alias.pt", "model.pt"]


def test_a_chunked_https_download_is_cut_off_at_the_cap(tmp_path, monkeypatch):
    """The cap was checked against Content-Length alone, which a chunked answer does not send."""
    import http.server
    import threading
    import urllib.request

    from inferentia_operator import fetch as fetch_module

    class Chunked(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            block = b"x" * 65536
            try:
                for _ in range(48):  # 3 MiB, with no length declared
                    self.wfile.write(f"{len(block):x}\r\n".encode() + block + b"\r\n")
                self.wfile.write(b"0\r\n\r\n")
            except OSError:
                pass

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Chunked)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    real_urlopen = urllib.request.urlopen
    # The https:// URI is served over plain HTTP on loopback: the cap is what is under test, not TLS.
    monkeypatch.setattr(urllib.request, "urlopen", lambda uri, timeout: real_urlopen(uri.replace("https://", "http://"), timeout=timeout))
    monkeypatch.setattr(fetch_module, "MAX_HTTPS_BYTES", 1024 * 1024)
    try:
        uri = f"https://127.0.0.1:{server.server_address[1]}/model.pt"
        with pytest.raises(FetchError, match="more than 1048576 bytes"):
            fetch_model(uri, tmp_path / "m")
        assert not (tmp_path / "m" / "model.pt").exists()
    finally:
        server.shutdown()


def test_a_marker_too_large_or_of_another_shape_is_refused_with_its_reason(s3, tmp_path, monkeypatch):
    """The marker comes from the store: read to a bound, and checked for its shape, before use."""
    from inferentia_operator import fetch as fetching

    monkeypatch.setattr(fetching, "MAX_MARKER_BYTES", 64)
    s3.put_object(Bucket="models", Key="big/_INFERENTIA_COMPLETE", Body=b"{" + b" " * 100 + b"}")
    with pytest.raises(FetchError, match="more than 64 bytes"):
        fetch("s3://models/big/", tmp_path / "a")
    s3.put_object(Bucket="models", Key="odd/_INFERENTIA_COMPLETE", Body=b"[1, 2]")
    with pytest.raises(FetchError, match="names no files"):
        fetch_model("s3://models/odd/", tmp_path / "b")
