#!/usr/bin/env bash
# Prepares benchmark data sets under DIR (default: ./data), skipping any that exist.
#   linux/      Linux 6.1 source tree from Debian's linux-source-6.1 (78,579 files, 1.36 GB)
#   linux.tar   the same tree as one uncompressed tar (for `tar -x` / `cp` baselines)
#   small/      1,000 files, ~1 GB, max 10 MB, 20% duplicate blocks, 30% text
#   many/       1,000,000 small files (~2 GB, mostly under 8 KiB) in ~585 directories: the
#               scale test for per-file cost and memory (needs ~6 GB of disk and 1M inodes);
#               many100k/ and many300k/ are the same kind of tree at 100,000 and 300,000 files
#   medium/     10,000 files, ~4 GB, max 100 MB, 30% duplicate blocks, 30% text
#   disk.img    4 GiB sparse disk image: 30% holes, 30% text, 40% random, 4 MiB regions
# usage: datasets.sh [DIR] [NAME...]   (names default to: linux small disk.img)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dir=${1:-data}; shift || true
names=("$@"); [ ${#names[@]} -gt 0 ] || names=(linux small disk.img)
mkdir -p "$dir"; cd "$dir"
for n in "${names[@]}"; do
  case $n in
    linux|linux.tar)
      if [ ! -d linux ] || [ ! -f linux.tar ]; then
        tmp=$(mktemp -d)
        (cd "$tmp" && apt-get download linux-source-6.1 >/dev/null 2>&1 || { apt-get update >/dev/null && apt-get download linux-source-6.1 >/dev/null; })
        dpkg -x "$tmp"/linux-source-6.1_*.deb "$tmp/pkg"
        xz -dc -T0 "$tmp"/pkg/usr/src/linux-source-6.1.tar.xz > linux.tar
        rm -rf linux && mkdir linux && tar -xf linux.tar -C linux
        rm -rf "$tmp"
      fi ;;
    small)  [ -d small ]  || python3 "$here/gen.py" small --files 1000 --size 1e9 --max-file 1e7 --dup 0.2 --text 0.3 --seed 1 ;;
    medium) [ -d medium ] || python3 "$here/gen.py" medium --files 10000 --size 4e9 --max-file 1e8 --dup 0.3 --text 0.3 --seed 2 ;;
    many)   [ -d many ]   || python3 "$here/gen.py" many --files 1000000 --size 2e9 --max-file 1e6 --dup 0.1 --text 0.5 --seed 3 ;;
    # The same kind of tree at 100,000 and 300,000 files: restore time per file against size.
    many100k) [ -d many100k ] || python3 "$here/gen.py" many100k --files 100000 --size 2e8 --max-file 1e6 --dup 0.1 --text 0.5 --seed 3 ;;
    many300k) [ -d many300k ] || python3 "$here/gen.py" many300k --files 300000 --size 6e8 --max-file 1e6 --dup 0.1 --text 0.5 --seed 3 ;;
    disk.img) [ -f disk.img ] || python3 "$here/image.py" disk.img --size 4294967296 --hole 0.3 --text 0.3 --seed 1 ;;
    *) echo "datasets.sh: unknown data set '$n' (linux, small, medium, many, many100k, many300k, disk.img)" >&2; exit 2 ;;
  esac
done
ls -d "${names[@]}" 2>/dev/null | sed "s|^|$PWD/|"
