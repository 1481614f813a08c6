"""Prints the samples webdataset reads from the given shards, as JSON.

    python check_with_webdataset.py SHARD [SHARD...]

One JSON list of samples, in order; each sample maps "__key__" to its key and every field
name to its bytes in base64 (exact, whatever the bytes). Used to check that shards chute
writes read back exactly in webdataset (compare with what chute wrote).
"""

import base64
import json
import sys

import webdataset as wds


def main(paths):
    dataset = wds.WebDataset(paths, shardshuffle=False, empty_check=False)
    out = []
    for sample in dataset:
        item = {"__key__": sample["__key__"]}
        for name, value in sample.items():
            if name.startswith("__"):
                continue
            item[name] = base64.b64encode(value).decode("ascii")
        out.append(item)
    json.dump(out, sys.stdout, indent=1, sort_keys=True)
    print()


if __name__ == "__main__":
    main(sys.argv[1:])
