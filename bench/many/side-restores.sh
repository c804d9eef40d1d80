#!/bin/bash
# Side-by-side full restores of `many` into fresh directories on tmpfs, one after another.
set -u
export CAIRN_PASSWORD=x RESTIC_PASSWORD=x
C=${CAIRN:-target/release/cairn}
T() { local label=$1; shift; /usr/bin/time -f "$label %e s %U u %S s %M KB" "$@" >/dev/null 2>/tmp/bm-side-err || { echo "$label FAILED"; tail -2 /tmp/bm-side-err; }; grep -h "$label" /tmp/bm-side-err; }
for what in tar cairn restic; do
  d=/dev/shm/bm-rt; rm -rf $d; mkdir -p $d; sync; sleep 2
  case $what in
    tar) T tar tar -xf /work/data/many.tar -C $d ;;
    cairn) T cairn $C -r /dev/shm/manyrepo restore latest --target $d --no-local-data ;;
    restic) T restic restic -r /dev/shm/resticmany restore latest --target $d ;;
  esac
  rm -rf $d
done
