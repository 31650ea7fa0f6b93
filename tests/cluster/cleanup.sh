#!/usr/bin/env bash
# ctest's cleanup for the cluster tests (FIXTURES_CLEANUP, tests/cluster/CMakeLists.txt): takes
# down every cluster that a test of this build tree brought up and could not take down itself
# (a test killed at its ctest TIMEOUT gets SIGKILL: no trap runs). A cluster belongs to the tree
# when its recorded owner is a directory under $1. Clusters of other trees and by hand stay.
set -euo pipefail
work=${1:?usage: cleanup.sh WORK_DIR}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
for owner in /tmp/tessera-cluster.*/owner; do
  [[ -f $owner ]] || continue
  [[ $(cat "$owner") == "$work"/* ]] || continue
  name=$(basename "$(dirname "$owner")")
  name=${name#tessera-cluster.}
  echo "cleanup: cluster $name of $(cat "$owner") was left up"
  TESSERA_CLUSTER=$name "$here/cluster.sh" down
done
echo "cleanup: no cluster of $work is up"
