#!/usr/bin/env bash
# Debian packages that the many-host tests (test hosts in network namespaces,
# src/testing/netns.ts) need: iproute2 (ip), util-linux (nsenter, unshare) and nftables
# (packet loss); and for the Slurm tests (src/testing/slurm.ts), Slurm's daemons and client
# commands with munge. Installs only what is missing; .ci/run calls it before `npm test`.
#
# The tests run their own munged, slurmctld and slurmd, configured in temporary directories.
# The packages' own services are not wanted: while they install, a policy-rc.d (unless the
# machine has one) tells Debian's maintainer scripts not to start them, and any that an init
# system started anyway is stopped through it afterwards.
set -euo pipefail
need=()
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v nsenter >/dev/null 2>&1 || need+=(util-linux)
command -v nft >/dev/null 2>&1 || need+=(nftables)
slurm=()
command -v slurmctld >/dev/null 2>&1 || slurm+=(slurmctld)
command -v slurmd >/dev/null 2>&1 || slurm+=(slurmd)
command -v srun >/dev/null 2>&1 || slurm+=(slurm-client)
command -v munged >/dev/null 2>&1 || slurm+=(munge)
need+=(${slurm[@]+"${slurm[@]}"})
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" != "0" ]; then
  echo "install-test-deps: ${need[*]} missing, and installing them needs root (apt-get)" >&2
  exit 1
fi
policy=/usr/sbin/policy-rc.d
made_policy=0
if [ ${#slurm[@]} -gt 0 ] && [ ! -e "$policy" ]; then
  printf '#!/bin/sh\n# install-test-deps.sh: no service starts while the test packages install\nexit 101\n' >"$policy"
  chmod 755 "$policy"
  made_policy=1
fi
cleanup() {
  if [ "$made_policy" = 1 ]; then rm -f "$policy"; fi
}
trap cleanup EXIT
echo "install-test-deps: installing ${need[*]}"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
if [ ${#slurm[@]} -gt 0 ]; then
  # The packages' default pid files; the tests' daemons keep theirs in temporary directories.
  for entry in munge:/run/munge/munged.pid slurmd:/run/slurmd.pid slurmctld:/run/slurmctld.pid; do
    service="${entry%%:*}"
    pidfile="${entry#*:}"
    if [ -s "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
      echo "install-test-deps: stopping the $service service that the package started (the tests run their own)"
      if [ -d /run/systemd/system ]; then
        systemctl stop "$service" || true
      else
        "/etc/init.d/$service" stop || true
      fi
    fi
  done
fi
