#!/bin/sh
# Prints, for each CPU profile that `go run ./bench -profdir DIR` wrote, the
# top functions of the raw side and of the dedupq side (the pprof label
# side), so that a row's remaining gap shows where its time goes:
#
#	bench/proftop.sh DIR [NODECOUNT]
#
# Filling a queue before a side's timed part (phase=fill) is left out.
# Samples of goroutines started at a group's setup (connection loops, an
# in-process server) carry side=setup and are in neither list; add
# `-tagfocus group=G` by hand to see everything.
set -eu
dir=${1:?usage: bench/proftop.sh DIR [NODECOUNT]}
n=${2:-20}
for f in "$dir"/*.prof; do
	for side in raw dedupq; do
		echo "== $(basename "$f" .prof) side=$side"
		go tool pprof -top -nodecount="$n" -tagfocus="side=$side" -tagignore=phase=fill "$f" 2>/dev/null |
			sed -n '/^Showing\|^ *flat/,$p' || echo "(no samples)"
		echo
	done
done
