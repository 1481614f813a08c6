#!/bin/sh
# Writes gnu-longname.tar, pax.tar and ustar.tar with GNU tar. Run from this folder.
set -eu
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
dir="a.very.long.directory.name.with.dots/a.very.long.directory.name.with.dots/a.very.long.directory.name.with.dots"
mkdir -p "$work/$dir"
printf 'hello\n' > "$work/$dir/sample_with_a_rather_long_key_0001.txt"
printf '1\n' > "$work/$dir/sample_with_a_rather_long_key_0001.cls"
printf 'short\n' > "$work/short.txt"
printf 'unicode\n' > "$work/été.txt"
common="--sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 --mode=u=rw,go=r,a+X"
here=$(pwd)
# GNU format: the 149-byte names become 'L' (long name) members; directories are members too.
(cd "$work" && tar --format=gnu $common -cf "$here/gnu-longname.tar" a.very.long.directory.name.with.dots short.txt)
# pax format: long and non-ASCII names go in 'x' headers.
(cd "$work" && tar --format=pax --pax-option=delete=atime,delete=ctime $common \
    -cf "$here/pax.tar" a.very.long.directory.name.with.dots short.txt été.txt)
# ustar format: the 149-byte names are split into the prefix and name fields.
(cd "$work" && tar --format=ustar $common -cf "$here/ustar.tar" a.very.long.directory.name.with.dots short.txt)
