import hashlib
import io
import tarfile

import pytest

from tasks.datasets import cifar10, download, mnist
from tasks.datasets.download import ChecksumError, RemoteDataset, RemoteFile
from tests.tasks.datasets.conftest import cifar_records, write_fake_mnist


def _sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_download_from_file_url_verifies_and_loads(isolated):
    src = isolated / "mirror"
    write_fake_mnist(src)
    files = tuple(RemoteFile(p.name, _sha(p)) for p in sorted(src.iterdir()))
    where = download.download("mnist", isolated / "data", base_url=src.as_uri(), remote=RemoteDataset("unused", files))
    assert where == isolated / "data" / "mnist"
    assert sorted(p.name for p in where.iterdir()) == sorted(f.url_name for f in files)
    assert mnist(4, data_dir=isolated / "data").num_examples("test") == 20
    # a second call finds verified files in place and fetches nothing
    (src / files[0].url_name).unlink()
    download.download("mnist", isolated / "data", base_url=src.as_uri(), remote=RemoteDataset("unused", files))


def test_checksum_mismatch_keeps_nothing(isolated):
    src = isolated / "mirror"
    write_fake_mnist(src)
    bad = RemoteDataset("unused", (RemoteFile("train-images-idx3-ubyte.gz", "0" * 64),))
    with pytest.raises(ChecksumError, match="does not match"):
        download.download("mnist", isolated / "data", base_url=src.as_uri(), remote=bad)
    assert not any((isolated / "data" / "mnist").iterdir())


def test_md5_and_tar_extraction(isolated):
    src = isolated / "mirror"
    src.mkdir()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name in [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]:
            raw = cifar_records(4, len(name))[0]
            info = tarfile.TarInfo(f"cifar-10-batches-bin/{name}")
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
    (src / "cifar-10-binary.tar.gz").write_bytes(buf.getvalue())
    md5 = hashlib.md5(buf.getvalue()).hexdigest()
    spec = RemoteDataset("unused", (RemoteFile("cifar-10-binary.tar.gz", md5, "md5", extract=True),))
    download.download("cifar10", isolated / "data", base_url=src.as_uri(), remote=spec)
    data = cifar10(2, data_dir=isolated / "data")
    assert data.num_examples("test") == 4 and data.element_spec()["image"].shape == (2, 32, 32, 3)


def test_cli_reports_failure_without_network(isolated, capsys):
    src = isolated / "mirror"
    write_fake_mnist(src)  # fake files cannot match the published MNIST checksums
    rc = download.main(["mnist", "--dir", str(isolated / "data"), "--base-url", src.as_uri()])
    assert rc == 1 and "does not match the published" in capsys.readouterr().err
    assert set(download.REMOTE) == {"mnist", "fashion_mnist", "cifar10"}
    assert all(len(f.digest) == {"sha256": 64, "md5": 32}[f.algorithm] for r in download.REMOTE.values()
               for f in r.files)
