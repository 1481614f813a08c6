"""`az://` and `gs://` against emulators (issue 14): Azurite (Azure blob storage, from npm) and
gcp-storage-emulator (from PyPI), which scripts/servers.sh starts on 127.0.0.1 with a fault
proxy in front of each (503, 429, bodies cut mid-way, resets). The suite the other schemes
run: `chute bench` digests equal a local run's (block and global shuffle, over two epochs),
through the fault proxy too (its faults retried), and the node-local cache serves a second
process every shard. Skipped, saying so, when the emulators are not running."""

import io
import json
import os
import subprocess
import tarfile
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from conftest import chute_bin

AZURE = os.environ.get("CHUTE_TEST_AZURE_URL")
AZURE_PROXY = os.environ.get("CHUTE_TEST_AZURE_PROXY_URL")
GCS_EMULATOR = os.environ.get("CHUTE_TEST_GCS_EMULATOR")
GCS = os.environ.get("CHUTE_TEST_GCS_URL")
GCS_PROXY = os.environ.get("CHUTE_TEST_GCS_PROXY_URL")
# Azurite's well-known development account (public, in Azure's documentation).
AZURE_ACCOUNT = "devstoreaccount1"
AZURE_KEY = ("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/"
             "KBHBeksoGMGw==")
SHARDS = 6


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("cloud")
    rng = np.random.default_rng(9)
    for s in range(SHARDS):
        with tarfile.open(folder / f"cl-{s}.tar", "w") as tar:
            for i in range(25):
                body = rng.integers(0, 256, int(rng.integers(500, 3000)), np.uint8).tobytes()
                for ext, data in (("bin", body), ("cls", str(i % 3).encode())):
                    info = tarfile.TarInfo(f"{s * 25 + i:05d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    r = subprocess.run([chute_bin(), "index", str(folder / f"cl-{{0..{SHARDS - 1}}}.tar")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return folder


def _bench(data: str, env: dict, *extra: str) -> dict:
    r = subprocess.run([chute_bin(), "bench", data, "--json", "--digest", "--quiet",
                        "--timeout", "2", "--epochs", "2", *extra],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


def _suite(shards: Path, url: str, plain: dict, faulty: dict, tmp_path: Path) -> None:
    for shuffle in ("block", "global"):
        want = _bench(str(shards / "manifest.json"), plain, "--shuffle", shuffle)["digest"]
        got = _bench(url, plain, "--shuffle", shuffle)
        assert got["digest"] == want, f"{url} {shuffle}"
        through = _bench(url, faulty, "--shuffle", shuffle)
        assert through["digest"] == want, f"{url} {shuffle} through the fault proxy"
        assert through["remote"]["retries"] > 0, through["remote"]
    cache = str(tmp_path / "cache")
    first = _bench(url, plain, "--shuffle", "block", "--cache-dir", cache)
    assert first["remote"]["shards_fetched"] == SHARDS, first["remote"]
    second = _bench(url, plain, "--shuffle", "block", "--cache-dir", cache)
    assert second["remote"]["shards_fetched"] == 0, second["remote"]
    assert second["remote"]["cache_hits"] == SHARDS, second["remote"]


@pytest.mark.skipif(not (AZURE and AZURE_PROXY), reason="Azurite is not running (scripts/"
                    "servers.sh starts it when `azurite-blob` is installed: npm install -g azurite)")
def test_azure_blob_storage_against_azurite(shards, tmp_path):
    from azure.storage.blob import BlobServiceClient

    conn = (f"DefaultEndpointsProtocol=http;AccountName={AZURE_ACCOUNT};AccountKey={AZURE_KEY};"
            f"BlobEndpoint={AZURE}/{AZURE_ACCOUNT};")
    container = BlobServiceClient.from_connection_string(
        conn, api_version="2021-08-06").get_container_client("chute")
    if not container.exists():
        container.create_container()
    for p in sorted(shards.iterdir()):
        container.upload_blob(f"data/{p.name}", p.read_bytes(), overwrite=True)
    base = {**os.environ, "AZURE_STORAGE_USE_EMULATOR": "true",
            "AZURE_STORAGE_ACCOUNT_NAME": AZURE_ACCOUNT}
    plain = {**base, "AZURITE_BLOB_STORAGE_URL": AZURE}
    faulty = {**base, "AZURITE_BLOB_STORAGE_URL": AZURE_PROXY}
    _suite(shards, "az://chute/data/manifest.json", plain, faulty, tmp_path)


@pytest.mark.skipif(not (GCS_EMULATOR and GCS and GCS_PROXY), reason="the GCS emulator is "
                    "not running (scripts/servers.sh starts it: pip install gcp-storage-emulator)")
def test_google_cloud_storage_against_its_emulator(shards, tmp_path):
    def call(method, url, data=b"", ctype="application/json"):
        req = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": ctype})
        try:
            urllib.request.urlopen(req).read()
        except urllib.error.HTTPError as e:
            if e.code != 409:  # the bucket exists already
                raise

    call("POST", f"{GCS_EMULATOR}/storage/v1/b", json.dumps({"name": "chute"}).encode())
    for p in sorted(shards.iterdir()):
        call("POST", f"{GCS_EMULATOR}/upload/storage/v1/b/chute/o?uploadType=media&name=data/"
             f"{p.name}", p.read_bytes(), "application/octet-stream")

    def env(base_url):
        # object_store's service-account key takes a base URL and no OAuth, for emulators.
        key = {"gcs_base_url": base_url, "disable_oauth": True, "client_email": "",
               "private_key": "", "private_key_id": ""}
        return {**os.environ, "GOOGLE_SERVICE_ACCOUNT_KEY": json.dumps(key)}

    _suite(shards, "gs://chute/data/manifest.json", env(GCS), env(GCS_PROXY), tmp_path)
