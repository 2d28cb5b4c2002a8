"""Optional: fetch a dataset's canonical files into the cache, verifying each checksum.

    python -m tasks.datasets.download NAME [--dir DIR] [--base-url URL]

Files go to DIR/NAME (default DIR: $LOPT_DATA_DIR or ~/.cache/lopt), where the loaders look.
A file is written under a temporary name and renamed only after its checksum matches. Nothing
in the library or the tests calls this on the default path; it is for users with internet.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tarfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from tasks.datasets.locate import cache_dir


@dataclass(frozen=True)
class RemoteFile:
    """One file to fetch.

    Attributes:
      url_name: the file's name under the base URL (and in the dataset directory).
      digest: its published hex digest.
      algorithm: the digest's hashlib algorithm, "sha256" or "md5".
      extract: a .tar.gz whose members go into the dataset directory.
    """
    url_name: str
    digest: str
    algorithm: str = "sha256"
    extract: bool = False


@dataclass(frozen=True)
class RemoteDataset:
    """A dataset's download recipe.

    Attributes:
      base_url: the URL the file names are appended to (ends in "/" or gets one).
      files: the files to fetch.
    """
    base_url: str
    files: tuple[RemoteFile, ...]


# Published checksums of the canonical files. Fashion-MNIST's publishers give MD5 only.
REMOTE: dict[str, RemoteDataset] = {
    "mnist": RemoteDataset("https://storage.googleapis.com/cvdf-datasets/mnist/", (
        RemoteFile("train-images-idx3-ubyte.gz", "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609"),
        RemoteFile("train-labels-idx1-ubyte.gz", "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c"),
        RemoteFile("t10k-images-idx3-ubyte.gz", "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6"),
        RemoteFile("t10k-labels-idx1-ubyte.gz", "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6"),
    )),
    "fashion_mnist": RemoteDataset("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/", (
        RemoteFile("train-images-idx3-ubyte.gz", "8d4fb7e6c68d591d4c3dfef9ec88bf0d", "md5"),
        RemoteFile("train-labels-idx1-ubyte.gz", "25c81989df183df01b3e8a0aad5dffbe", "md5"),
        RemoteFile("t10k-images-idx3-ubyte.gz", "bef4ecab320f06d8554ea6380940ec79", "md5"),
        RemoteFile("t10k-labels-idx1-ubyte.gz", "bb300cfdad3c16e7a12a480ee83cd310", "md5"),
    )),
    "cifar10": RemoteDataset("https://www.cs.toronto.edu/~kriz/", (
        RemoteFile("cifar-10-binary.tar.gz", "c4a38c50a1bc5f3a1c5537f2155ab9d68f9f25eb1ed8d9ddda3db29a59bca1dd",
                   extract=True),
    )),
}


class ChecksumError(ValueError):
    """A fetched file whose digest differs from the published one."""


def file_digest(path: str | os.PathLike, algorithm: str = "sha256") -> str:
    """The hex digest of the file at `path` with hashlib's `algorithm`, read in 1 MiB chunks."""
    h = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch(url: str, dest: Path, digest: str, algorithm: str = "sha256") -> Path:
    """Downloads `url` (http(s) or file://) to `dest` iff its digest matches; else ChecksumError."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.is_file() and file_digest(dest, algorithm) == digest:
        return dest
    tmp = dest.with_name(dest.name + ".part")
    try:
        with urllib.request.urlopen(url) as r, open(tmp, "wb") as f:
            for chunk in iter(lambda: r.read(1 << 20), b""):
                f.write(chunk)
        got = file_digest(tmp, algorithm)
        if got != digest:
            raise ChecksumError(f"{url}: {algorithm} {got} does not match the published {digest}; "
                                f"the download is corrupt or the file changed upstream (nothing was kept)")
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            tmp.unlink()
    return dest


def _extract(archive: Path, into: Path) -> None:
    with tarfile.open(archive, "r:gz") as tar:
        tar.extractall(into, filter="data")


def download(name: str, data_dir: Optional[str | os.PathLike] = None, *, base_url: Optional[str] = None,
             remote: Optional[RemoteDataset] = None) -> Path:
    """Fetches dataset `name` into `data_dir/name` (default: the cache dir); returns that dir.

    `base_url` replaces the canonical host (a mirror, or a file:// directory); `remote`
    replaces the whole file list (tests use both).
    """
    spec = remote or REMOTE.get(name)
    if spec is None:
        raise ValueError(f"no download recipe for {name!r}; known: {sorted(REMOTE)}")
    base = base_url or spec.base_url
    base = base if base.endswith("/") else base + "/"
    target = Path(data_dir).expanduser() if data_dir is not None else cache_dir()
    target = target / name
    for rf in spec.files:
        path = fetch(base + rf.url_name, target / rf.url_name, rf.digest, rf.algorithm)
        if rf.extract:
            _extract(path, target)
    return target


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The command line (see the module docstring): 0 on success, 1 (with the reason on stderr) on failure."""
    parser = argparse.ArgumentParser(prog="python -m tasks.datasets.download", description=__doc__.split("\n")[0])
    parser.add_argument("name", choices=sorted(REMOTE))
    parser.add_argument("--dir", default=None, help="root data directory (default: $LOPT_DATA_DIR or ~/.cache/lopt)")
    parser.add_argument("--base-url", default=None, help="mirror URL to fetch the same file names from")
    args = parser.parse_args(argv)
    try:
        where = download(args.name, args.dir, base_url=args.base_url)
    except (OSError, ChecksumError) as e:
        print(f"download failed: {e}", file=sys.stderr)
        return 1
    print(f"{args.name}: files in {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
