"""Writes the webdataset golden shards in this folder. See README.md for versions.

Run from this folder: python make_golden.py (needs `pip install webdataset`).
"""

import webdataset as wds


def jpg(i):
    # Any bytes do: chute and webdataset keep fields as raw bytes.
    return b"\xff\xd8\xff\xe0" + bytes([i]) * 10


# One shard with TarWriter: jpg (bytes), cls (int), json (dict), and a key with dots in its
# directory names and a two-part extension.
with wds.TarWriter("wds-tarwriter.tar", mtime=0) as sink:
    for i in range(3):
        sink.write(
            {
                "__key__": f"sample{i:03d}",
                "jpg": jpg(i),
                "cls": i,
                "json": {"i": i, "caption": f"image {i}"},
            }
        )
    sink.write(
        {
            "__key__": "train.v1/shard.a/sample003",
            "jpg": jpg(3),
            "cls": 3,
            "seg.png": b"\x89PNG fake",
        }
    )

# ShardWriter rotating every 3 samples: wds-shard-000000.tar (3), wds-shard-000001.tar (2).
with wds.ShardWriter("wds-shard-%06d.tar", maxcount=3, mtime=0, verbose=0) as sink:
    for i in range(5):
        sink.write({"__key__": f"s{i}", "cls": i, "txt": f"text {i}"})
