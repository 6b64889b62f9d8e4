#!/usr/bin/env bash
# Installs the Debian packages that the tests of real components need
# (gVisor, podman, OpenSSH, SLURM + munge, PostgreSQL 15, busybox, ...).
#
# Idempotent: when every package is already installed it only runs one
# dpkg-query and exits, so it runs on every `make test`, as any user;
# only installing needs root (through sudo when there is one).
# Services shipped by these packages are never left running: tests start
# their own private instances (see test/realparts).
set -euo pipefail

# Debian package -> why the tests need it.
packages=(
	runsc          # gvisor runner: runsc do
	podman         # docker-compatible CLI for the docker runner
	runc           # podman's OCI runtime here (crun fails on these hosts)
	openssh-server # sshd on loopback for ssh-based tests
	openssh-client
	slurmctld      # single-node SLURM cluster for the slurm runner
	slurmd
	slurm-client
	munge
	postgresql-15  # server binaries under /usr/lib/postgresql/15/bin
	busybox-static # root filesystem of the local test image
	rsync
	python3        # python runner shim
	procps
	iproute2
	bash-completion # what `lakeshore completion bash` needs (its help says so)
	shellcheck      # lints the rendered provider bootstrap scripts (lakeshore/providers/bootstrap)
	chromium        # headless browser the dashboard test drives (test/e2e/dashboard_test.go)
)

# Prints the packages that are not fully installed, one per line, with a
# single dpkg-query call so the common all-present case stays fast.
missing_packages() {
	local installed
	installed=$(dpkg-query -W -f='${Package} ${db:Status-Abbrev}\n' "${packages[@]}" 2>/dev/null |
		awk '$2 ~ /^ii/ { print $1 }' || true)
	local pkg
	for pkg in "${packages[@]}"; do
		if ! grep -qx -- "$pkg" <<<"$installed"; then
			echo "$pkg"
		fi
	done
}

# moto_server, the AWS API emulator the ec2 provider's tests run, is a
# Python package (moto[server]), not a Debian one: it is preinstalled under
# pyenv on these machines and nothing here installs it, so only say when it
# is missing (test/realparts.StartMoto looks in the same places).
if ! compgen -G '/root/.pyenv/versions/*/bin/moto_server' >/dev/null 2>&1 &&
	! command -v moto_server >/dev/null 2>&1; then
	echo "install.sh: moto_server not found (pip install 'moto[server]'): the ec2 provider tests skip, or fail under CI=true" >&2
fi

mapfile -t missing < <(missing_packages)
reinstall=()
if [[ ! -x /usr/lib/postgresql/15/bin/initdb || ! -x /usr/lib/postgresql/15/bin/postgres ]]; then
	# Marked installed but the server binaries are gone: reinstall it.
	reinstall=(--reinstall)
	[[ " ${missing[*]} " == *" postgresql-15 "* ]] || missing+=(postgresql-15)
fi
if [[ ${#missing[@]} -eq 0 ]]; then
	echo "install.sh: all ${#packages[@]} packages present"
	exit 0
fi
# Only installing needs root and apt-get, so the common all-present case
# (make test on every run) works as any user.
if ! command -v apt-get >/dev/null 2>&1; then
	echo "install.sh: missing ${missing[*]}, and this is not a Debian machine (no apt-get):" >&2
	echo "install.sh: install them yourself, or run make test DEPS= to skip this step (their tests then skip)" >&2
	exit 1
fi
if [[ $(id -u) -ne 0 ]]; then
	if command -v sudo >/dev/null 2>&1; then
		echo "install.sh: missing ${missing[*]}; installing them with sudo" >&2
		exec sudo bash "$0" "$@"
	fi
	echo "install.sh: missing ${missing[*]}, and installing needs root (apt-get):" >&2
	echo "install.sh: run it as root, or run make test DEPS= to skip this step (their tests then skip)" >&2
	exit 1
fi
echo "install.sh: installing ${missing[*]}"

# Package maintainer scripts would start sshd, munged, slurmctld, slurmd and
# a postgres cluster on their default ports. Forbid that for the duration of
# the install with a policy-rc.d that refuses every start, restoring whatever
# policy the machine had before.
policy=/usr/sbin/policy-rc.d
policy_backup=""
if [[ -e $policy ]]; then
	policy_backup=$(mktemp)
	cp -p "$policy" "$policy_backup"
fi
restore_policy() {
	if [[ -n $policy_backup ]]; then
		mv -f "$policy_backup" "$policy"
	else
		rm -f "$policy"
	fi
}
trap restore_policy EXIT
printf '#!/bin/sh\nexit 101\n' >"$policy"
chmod 0755 "$policy"

export DEBIAN_FRONTEND=noninteractive
apt-get update -qq -o Acquire::Retries=3
# Only the missing ones: naming installed packages would upgrade them.
apt-get install -y -qq --no-install-recommends "${reinstall[@]}" \
	-o Acquire::Retries=3 \
	-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
	"${missing[@]}" >/dev/null

mapfile -t still_missing < <(missing_packages)
if [[ ${#still_missing[@]} -gt 0 ]]; then
	echo "install.sh: still missing after install: ${still_missing[*]}" >&2
	exit 1
fi
for bin in runsc podman runc /usr/sbin/sshd ssh ssh-keygen slurmctld slurmd srun sinfo munged \
	/usr/lib/postgresql/15/bin/initdb /usr/lib/postgresql/15/bin/pg_ctl busybox rsync python3 chromium; do
	if ! command -v "$bin" >/dev/null 2>&1; then
		echo "install.sh: $bin not found after install" >&2
		exit 1
	fi
done
echo "install.sh: done"
