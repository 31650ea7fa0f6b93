#!/usr/bin/env bash
# Run the fixed PyTorch MLP peer (../shared/peers/mlp_torch.py, unchanged) in every thread
# configuration, under OPENBLAS_CORETYPE=Haswell and unset, and collect the SUMMARY lines into
# bench/results/peers_mlp.csv (peer,config,opt,coretype,samples_per_s,test_acc).
#
# Each run trains EPOCHS epochs (default 3, to keep the sitting short; the figures in
# peers/README.md used 5). SGD runs in every configuration; Adam runs in the configuration that
# was fastest with SGD under the same coretype. Raw logs go to bench/results/logs/.
#
# Usage: bench/peers.sh            env: EPOCHS, CORETYPES ("Haswell unset"), PEERS_DIR
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$here/lib.sh"

epochs=${EPOCHS:-3}
read -r -a coretypes <<<"${CORETYPES:-Haswell unset}"
configs=(torch1_ob1 torch1_ob2 torch2_ob2 ddp2_torch1)
results=$here/results
logs=$results/logs
csv=$results/peers_mlp.csv
mkdir -p "$logs"
peers_dir >/dev/null

echo "peer,config,opt,coretype,samples_per_s,test_acc" >"$csv"
for coretype in "${coretypes[@]}"; do
  best_config="" best_rate=0
  for config in "${configs[@]}"; do
    r=$(run_peer_mlp "$config" sgd "$coretype" "$epochs" "$logs/mlp_torch_${config}_sgd_${coretype}.log")
    echo "torch_mlp,$config,sgd,$coretype,$r" | tee -a "$csv"
    if awk -v a="${r%%,*}" -v b="$best_rate" 'BEGIN {exit !(a > b)}'; then
      best_config=$config best_rate=${r%%,*}
    fi
  done
  r=$(run_peer_mlp "$best_config" adam "$coretype" "$epochs" "$logs/mlp_torch_${best_config}_adam_${coretype}.log")
  echo "torch_mlp,$best_config,adam,$coretype,$r" | tee -a "$csv"
done
echo "wrote $csv"
