"""Download public corpora to a folder, checking every file's sha256 (no download ever happens at import,
test or demo time; tests point ``base_url`` at a local ``file://`` mirror)."""

from __future__ import annotations

import os
import shutil
import urllib.request
from pathlib import Path

from aiayn.errors import AiaynError
from aiayn.files import sha256_of

MULTI30K_URL = "https://github.com/multi30k/dataset/raw/master/data/task1/raw/"
MULTI30K_SHA256 = {
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.fr.gz": "622e75069e9f4c577425c4f277116ce66e63a2401c0a2312d90073cb12379a3c",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.fr.gz": "ca3106f1a72390591d25f6c45cb4cd39dec4cd3f123e099748a3ce5256c160e9",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.fr.gz": "6d326e188d259fb1d04ac19eae3af956559b3a0b93d7635e56c90987c40c8b90",
}


def fetch(url: str, dest: Path, sha256: str) -> Path:
    """Download ``url`` to ``dest`` (via a temporary file, renamed only once its sha256 matches).

    Raises:
        AiaynError: network failure or checksum mismatch (the partial file is removed).
    """
    if dest.exists() and sha256_of(dest) == sha256:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".part")
    try:
        with urllib.request.urlopen(url, timeout=60) as r, open(tmp, "wb") as f:
            shutil.copyfileobj(r, f)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise AiaynError(f"{url}: download failed ({e}); check the network or pass --base-url to a mirror") from e
    got = sha256_of(tmp)
    if got != sha256:
        tmp.unlink(missing_ok=True)
        raise AiaynError(f"{url}: sha256 {got} does not match the expected {sha256}; the mirror serves a "
                         "different file, use the official one")
    os.replace(tmp, dest)
    return dest


def download_multi30k(dest: Path, base_url: str | None = None) -> list[Path]:
    """Fetch Multi30k task 1 (train, val, test_2016_flickr; en, de, fr; raw .gz) into ``dest``."""
    base = (base_url or MULTI30K_URL).rstrip("/") + "/"
    return [fetch(base + name, Path(dest) / name, digest) for name, digest in MULTI30K_SHA256.items()]
