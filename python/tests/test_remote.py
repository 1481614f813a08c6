"""Shards by URL: nginx and the fault proxy that scripts/test.sh starts when
CHUTE_TEST_SERVERS=1 (as .ci/run does); without them these tests skip, saying so."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import chute
from conftest import HTTP_DIR, HTTP_URL, PROXY_URL, needs_servers, run_python

TESTDATA = Path(__file__).resolve().parents[2] / "testdata"

pytestmark = needs_servers("HTTP_DIR", "HTTP_URL", "PROXY_URL")


def publish(name: str, files) -> str:
    """Copies files into the folder nginx serves, under name/; returns that folder's path part."""
    d = Path(HTTP_DIR) / name
    d.mkdir(parents=True, exist_ok=True)
    for f in files:
        shutil.copy(f, d / Path(f).name)
    return name


def batches(source, **kw):
    loader = chute.Loader(source, batch_size=2, num_workers=2, **kw)
    return [{k: (np.asarray(v).tolist() if hasattr(v, "shape") else list(v)) for k, v in b.items()}
            for b in loader]


def test_webdataset_by_url_reads_what_the_files_hold():
    shards = sorted((TESTDATA / "webdataset").glob("wds-shard-*.tar"))
    name = publish("py_wds", shards)
    local = chute.webdataset([str(s) for s in shards])
    before = chute.io_stats()
    for base in (HTTP_URL, PROXY_URL):
        remote = chute.webdataset(f"{base}/{name}/wds-shard-{{000000..000001}}.tar")
        assert len(remote) == len(local) == 5
        for shuffle in (False, True):
            assert batches(remote, shuffle=shuffle, seed=2) == batches(local, shuffle=shuffle, seed=2)
    after = chute.io_stats()
    assert after["bytes_fetched"] > before["bytes_fetched"]
    assert after["requests"] > before["requests"]


def test_tfrecord_by_url_and_errors_name_the_url():
    f = TESTDATA / "tfrecord" / "examples.tfrecord"
    name = publish("py_tfr", [f])
    remote = chute.tfrecord(f"{HTTP_URL}/{name}/examples.tfrecord")
    assert batches(remote) == batches(chute.tfrecord(str(f)))
    missing = f"{HTTP_URL}/{name}/missing.tfrecord"
    with pytest.raises(OSError) as e:
        chute.tfrecord(missing)
    assert missing in str(e.value)


def test_remote_options_are_checked():
    with pytest.raises(chute.ConfigError):
        chute.set_remote_options(timeout=-1)
    chute.set_remote_options(read_ahead=1, retries=20, timeout=5)


def _child_reads(pattern, inherited, queue):
    try:
        rest = [list(b["__key__"]) for b in inherited]
        # A source opened in the child: its HEAD requests and downloads need an I/O runtime
        # of the child's own (the parent's threads did not survive the fork).
        own = [list(b["__key__"]) for b in chute.Loader(chute.webdataset(pattern), batch_size=2)]
        queue.put((rest, own))
    except BaseException as e:  # report, never hang the parent
        queue.put(repr(e))


# JAX (imported by an earlier test module) warns about any fork; chute's threads are the ones
# this test is about, and they are re-created in the child.
@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")
def test_a_forked_child_downloads_on_its_own_runtime():
    import multiprocessing

    shards = sorted((TESTDATA / "webdataset").glob("wds-shard-*.tar"))
    name = publish("py_fork", shards)
    pattern = f"{HTTP_URL}/{name}/wds-shard-{{000000..000001}}.tar"
    source = chute.webdataset(pattern)
    keys = [k for b in chute.Loader(source, batch_size=2) for k in b["__key__"]]
    parent = chute.Loader(source, batch_size=2, num_workers=1)
    it = iter(parent)
    head = list(next(it)["__key__"])
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_child_reads, args=(pattern, parent, queue))
    child.start()
    result = queue.get(timeout=60)
    child.join(timeout=60)
    assert child.exitcode == 0
    assert not isinstance(result, str), result
    rest, own = result
    assert head + [k for b in rest for k in b] == keys
    assert [k for b in own for k in b] == keys


def test_token_files_by_url_are_downloaded_whole_and_read_as_local(tmp_path):
    path = tmp_path / "tokens.bin"
    np.arange(3000, dtype=np.uint16).tofile(path)
    name = publish("py_tokens", [path])
    local = chute.tokens(str(path), seq_len=32)
    for base in (HTTP_URL, PROXY_URL):
        remote = chute.tokens(f"{base}/{name}/tokens.bin", seq_len=32)
        assert len(remote) == len(local)
        assert batches(remote, shuffle=True, seed=5) == batches(local, shuffle=True, seed=5)


def test_a_loader_counts_its_own_remote_reads_cache_hits_included(tmp_path):
    # A second run served from the node-local cache: the shards come from the cache when the
    # source is opened (before any loader exists), and the loader that reads them must count
    # them in every view, as the process does, and so must its Prometheus series.
    shards = sorted((TESTDATA / "webdataset").glob("wds-shard-*.tar"))
    name = publish("py_wds_counts", shards)
    code = f"""
import json, sys, urllib.request
import chute
chute.set_remote_options(cache_dir={str(tmp_path / 'cache')!r})
source = chute.webdataset("{HTTP_URL}/{name}/wds-shard-{{000000..000001}}.tar")
loader = chute.Loader(source, batch_size=2, num_workers=2, shuffle=True)
port = chute.serve_metrics(0)
for _ in loader:
    pass
s = loader.stats()
page = urllib.request.urlopen(f"http://127.0.0.1:{{port}}/metrics").read().decode()
series = [l for l in page.splitlines() if l.startswith("chute_remote_cache_hits_total")]
print(json.dumps({{"process": chute.io_stats(), "loader": s["remote"],
                  "window": s["window"]["remote"], "last_epoch": s["last_epoch"]["remote"],
                  "series": series}}))
"""
    runs = []
    for _ in range(2):
        proc = run_python(code)
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    first, second = runs
    assert first["process"]["shards_fetched"] == 2 and first["loader"] == first["process"]
    assert second["process"]["cache_hits"] == 2 and second["process"]["shards_fetched"] == 0
    for view in ("loader", "window", "last_epoch"):
        assert second[view]["cache_hits"] == 2, (view, second)
    assert second["loader"] == second["process"]
    assert second["series"] and all(line.endswith(" 2") for line in second["series"])


def test_audio_by_url_from_a_manifest_and_in_shards(tmp_path):
    """Audio named by URL in a JSON Lines manifest (read by the decode op through chute's I/O
    layer, retries and all, behind the fault proxy too) and audio members of WebDataset shards
    by URL: the samples the local files give."""
    import audio_media as am

    clips = []
    for i, codec in enumerate(["flac16", "mp3", "opus", "wav16"]):
        rate = 48000 if codec == "opus" else 22050
        path = tmp_path / f"clip{i}.{am.EXTENSION[codec]}"
        path.write_bytes(am.encode(am.speech_like(0.5, rate, seed=i), rate, codec))
        clips.append(path)
    name = publish("py_audio", clips)
    ops = {"path": {"as": "audio", "ops": [{"op": "decode_audio", "mono": True,
                                               "sample_rate": 16000}]}}

    def decoded(manifest):
        loader = chute.Loader(chute.dataset(str(manifest)), batch_size=1, num_workers=2,
                              transforms=ops)
        return [b["audio"][0] for b in loader]

    local = tmp_path / "local.jsonl"
    local.write_text("".join(json.dumps({"path": str(c)}) + "\n" for c in clips))
    want = decoded(local)
    for base in (HTTP_URL, PROXY_URL):
        remote = tmp_path / "remote.jsonl"
        remote.write_text("".join(json.dumps({"path": f"{base}/{name}/{c.name}"}) + "\n"
                                  for c in clips))
        got = decoded(remote)
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert np.array_equal(a, b)
    missing = tmp_path / "missing.jsonl"
    missing.write_text(json.dumps({"path": f"{HTTP_URL}/{name}/nope.flac"}) + "\n")
    with pytest.raises(chute.CorruptDataError, match="nope.flac"):
        decoded(missing)
    shard = am.write_wds_shard(tmp_path / "audio.tar",
                               [{"__key__": f"c{i}", c.suffix[1:]: c.read_bytes()}
                                for i, c in enumerate(clips)])
    publish("py_audio_wds", [shard])
    spec = {"flac;mp3;opus;wav": {"as": "audio", "ops": [{"op": "decode_audio", "mono": True,
                                                           "sample_rate": 16000}]}}
    by_url = chute.Loader(chute.webdataset(f"{HTTP_URL}/py_audio_wds/audio.tar"), batch_size=1,
                          transforms=spec)
    for a, b in zip([x["audio"][0] for x in by_url], want):
        assert np.array_equal(a, b)


def test_video_by_url_from_a_manifest_and_in_shards(tmp_path):
    """Videos named by URL in a JSON Lines manifest (read by decode_video through chute's I/O
    layer, behind the fault proxy too) and video members of WebDataset shards by URL: the
    clips the local files give."""
    import video_media as vm

    cases = [c for c in ("h264-mp4", "vp9-webm", "h264-mkv") if vm.available(c)]
    ops_for = {"path": {"as": "video", "ops": [{"op": "decode_video", "indices": [0, 13, 29]}]}}
    try:
        chute.Loader([{"video": b""}], batch_size=1,
                     transforms={"video": [{"op": "decode_video"}]})
    except chute.ConfigError as e:
        pytest.skip(f"this chute has no video: {e}")
    if not cases:
        pytest.skip("PyAV has none of the test encoders")
    files = []
    for name in cases:
        path = tmp_path / f"{name}.{vm.CASES[name].ext}"
        path.write_bytes(vm.encode(name))
        files.append(path)
    name = publish("py_video", files)

    def decoded(manifest):
        loader = chute.Loader(chute.dataset(str(manifest)), batch_size=1, num_workers=2,
                              transforms=ops_for)
        return [(b["video"][0], b["video_pts"][0]) for b in loader]

    local = tmp_path / "local.jsonl"
    local.write_text("".join(json.dumps({"path": str(f)}) + "\n" for f in files))
    want = decoded(local)
    assert len(want) == len(files) and want[0][0].shape[0] == 3
    for base in (HTTP_URL, PROXY_URL):
        remote = tmp_path / "remote.jsonl"
        remote.write_text("".join(json.dumps({"path": f"{base}/{name}/{f.name}"}) + "\n"
                                  for f in files))
        got = decoded(remote)
        assert len(got) == len(want)
        for (a, ap), (b, bp) in zip(got, want):
            assert np.array_equal(a, b) and np.array_equal(ap, bp)
    missing = tmp_path / "missing.jsonl"
    missing.write_text(json.dumps({"path": f"{HTTP_URL}/{name}/nope.mp4"}) + "\n")
    with pytest.raises(chute.CorruptDataError, match="nope.mp4"):
        decoded(missing)
    shard = tmp_path / "video.tar"
    vm.write_wds_shard(shard, [{"__key__": f"v{i}", f.suffix[1:]: f.read_bytes()}
                               for i, f in enumerate(files)])
    publish("py_video_wds", [shard])
    spec = {"mp4;webm;mkv": {"as": "video", "ops": [{"op": "decode_video",
                                                     "indices": [0, 13, 29]}]}}
    by_url = chute.Loader(chute.webdataset(f"{HTTP_URL}/py_video_wds/video.tar"), batch_size=1,
                          transforms=spec)
    got = [x["video"][0] for x in by_url]
    assert len(got) == len(want)
    for a, (b, _) in zip(got, want):
        assert np.array_equal(a, b)
