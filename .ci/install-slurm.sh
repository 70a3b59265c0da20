#!/usr/bin/env bash
# Install what tools.slurm_local.LocalSlurmCluster (tools/slurm_local/cluster.py) needs: Slurm
# (slurmctld, slurmd, clients), munge, slurmdbd and MariaDB. Idempotent: does nothing when every
# binary is already there. The same lists as tools/slurm_local/install.py (ensure_installed, which
# the tests call), for installing from a shell before any Python is set up.
# Debian/Ubuntu only. The packages' own services are not used (the cluster runs its own daemons
# under a temporary folder), so it does not matter whether apt starts or skips them.
set -euo pipefail

packages=(slurm-wlm munge slurmdbd mariadb-server)
binaries=(slurmctld slurmd slurmdbd munged mariadbd mariadb-install-db
          sinfo squeue sbatch srun scancel sacct scontrol)
export PATH="$PATH:/usr/sbin:/sbin"

missing=()
for b in "${binaries[@]}"; do
    command -v "$b" >/dev/null 2>&1 || missing+=("$b")
done
if [ ${#missing[@]} -eq 0 ]; then
    echo "slurm: already installed ($(slurmctld -V))"
    exit 0
fi
echo "slurm: missing ${missing[*]}; installing ${packages[*]}"

sudo=()
if [ "$(id -u)" -ne 0 ]; then sudo=(sudo -n); fi
export DEBIAN_FRONTEND=noninteractive
apt_install() {
    "${sudo[@]}" apt-get install -y -q --no-install-recommends "${packages[@]}"
}
# Only refresh the package lists when the install fails with the cached ones (saves ~10 s).
if ! apt_install; then
    "${sudo[@]}" apt-get update -q
    apt_install
fi

for b in "${binaries[@]}"; do
    command -v "$b" >/dev/null 2>&1 || { echo "slurm: $b still missing" >&2; exit 1; }
done
echo "slurm: installed ($(slurmctld -V))"
