#!/usr/bin/env bash
# System launchers the launcher tests run for real: mpirun (Debian's openmpi-bin) and a
# one-node SLURM (slurm-wlm: slurmctld + slurmd + munge, started per test on localhost).
# Idempotent: does nothing when the commands are already there. Never fails the suite:
# when a package cannot be installed (no root, no network), the tests that need it skip
# and say why.
set -uo pipefail
need=()
command -v mpirun >/dev/null 2>&1 || need+=(openmpi-bin)
{ command -v srun >/dev/null 2>&1 && command -v slurmctld >/dev/null 2>&1 && command -v munged >/dev/null 2>&1; } \
  || need+=(slurm-wlm munge)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "setup-system: cannot install ${need[*]} (needs root and apt-get); their tests will skip" >&2
  exit 0
fi
echo "setup-system: installing ${need[*]}"
for attempt in 1 2 3 4 5 6; do
  # another apt-get (a parallel set-up) may hold the dpkg lock for a while
  if DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" >/tmp/idist-setup-system.log 2>&1; then
    rm -f /tmp/idist-setup-system.log
    exit 0
  fi
  if [ "$attempt" -eq 2 ]; then apt-get update -q >/dev/null 2>&1 || true; fi
  sleep 10
done
echo "setup-system: apt-get install ${need[*]} failed (see /tmp/idist-setup-system.log); their tests will skip" >&2
exit 0
